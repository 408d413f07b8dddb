"""The PyTorch ET reader's first passes over a file whose ``nodes`` are parsed a slice at a time.

A whole-document parse of an ET holds every node's nested ``inputs``/``outputs`` lists at once
(~8x the text). Here each node of a slice (:class:`ettools.json_chunks.ItemChunks`) is checked
(:func:`~ettools.converters.pytorch_et.node_head`) and read at once into a
:class:`~ettools.converters.pytorch_et.NodeRecord` — its attributes, IOInfo strings and tensor
keys, all of which the graph keeps anyway — and the node object is dropped, but for the few that
later passes read again. The order-dependent rest (rows, columns, tensor rows in id order) is
:func:`~ettools.converters.pytorch_et.read_et_rank`'s, on these records. Any problem raises, and
the caller reads the file again as a whole document, so that errors are those of the whole read.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ettools.converters.pytorch_et import (
    _ROOT_PREFIXES,
    PG_INIT_NAME,
    NodeRecord,
    node_attrs,
    node_head,
    node_io,
)
from ettools.json_chunks import ItemChunks


def read_chunks(path: Path, chunks: ItemChunks, flat: bool) -> tuple[list[tuple[int, int, str, int, Any]], int]:
    """(id, file index, name, parent, record or node) of every node in file order, and how many."""
    out: list[tuple[int, int, str, int, Any]] = []
    checked: dict[tuple, tuple] = {}  # tensor keys checked, each kept once (tensors recur)
    names: dict[str, str] = {}  # attribute names, types and string values, kept once (they recur)
    i = 0
    for chunk in chunks:
        for n in chunk:
            nid, _, name, parent = node_head(path, n, i, flat)
            if name.startswith(_ROOT_PREFIXES) or name == PG_INIT_NAME:
                out.append((nid, i, name, parent, n))  # dropped, its groups read later: kept whole
            else:
                attrs = tuple(names.setdefault(x, x) if type(x) is str else x
                              for x in node_attrs(path, n, i, nid, flat))
                ins, outs, tin, tout, iv, ity = node_io(path, n, i, nid, flat, checked)
                comm = name == "record_param_comms" or name.startswith("c10d::")
                io = (ins, outs, tin, tout, iv if comm else [], ity if comm else [])
                out.append((nid, i, sys.intern(name), parent,
                            NodeRecord(attrs, io, n if comm else {"name": name})))
            i += 1
        del chunk
    return out, i
