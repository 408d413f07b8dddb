"""A JSON trace file with its big item array (``traceEvents``, ``nodes``) parsed a slice at a time.

A whole-document ``orjson.loads`` turns a trace into Python objects of ~7x its text (a 35 MB Kineto
trace: 250 MB; a PyTorch ET, whose nodes nest lists, ~8x), and a reader needs only part of each
item. :func:`load_chunked` parses everything but the items (Kineto's ``distributedInfo``, an ET's
``schema``, …) and hands the items over as :class:`ItemChunks`: the array cut at item boundaries
that the byte-level pre-scan (:func:`ettools.io.scan_shape`, which already reads every byte to
refuse pathological files) finds on its way, each slice of ~:data:`CHUNK_BYTES` parsed only when
the reader asks for it, so a reader that reduces each slice at once holds the text, its own compact
state and one slice of objects (issue 26: peak ≤ 4x the input).

Nothing differs from the whole-document parse but the memory: whenever the cut is not certain to
give the same items (no such array, two of them, a remainder that is not an object) the document is
parsed whole, and a slice that does not parse raises :class:`ChunkError`, after which a reader
asks :meth:`ItemChunks.full` for the whole document's parse (and its error). The gzip text is
decompressed into one buffer (:func:`read_text`), not through zlib's block list, which holds it
twice when it joins the blocks.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ettools.io import GZIP_MAGIC, load_json, read_bytes
from ettools.json_scan import _CLOSE_ARRAY, _OPEN_ITEM, check_items_are_objects

CHUNK_BYTES = 1 << 18  # text per parsed slice: ~2 MB of objects (1 MB slices: 2-4 MB more peak, same time)
_IN_STEP = 1 << 16  # compressed bytes fed to zlib per call
_OUT_STEP = 1 << 22  # most decompressed bytes one call returns


def read_text(path: str | os.PathLike) -> bytes | bytearray:
    """:func:`ettools.io.read_bytes` holding the gunzipped text once: decompressed piecewise into one
    buffer sized from the gzip trailer. Anything unusual (several gzip members, trailing bytes, a
    corrupt or truncated stream, an unreadable file) is left to ``read_bytes``, whose result or
    error it then is."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            if f.read(2) != GZIP_MAGIC:
                return read_bytes(p)
        comp = p.read_bytes()
    except OSError:
        return read_bytes(p)
    out = _gunzip(comp)
    return read_bytes(p) if out is None else out


_MAX_DEFLATE_RATIO = 1032  # the most output deflate makes of one input byte (a 258-byte match coded in 2 bits)


def _gunzip(comp: bytes) -> bytearray | None:
    """The one gzip member ``comp`` holds, decompressed (None: not exactly one valid member)."""
    if len(comp) < 18:
        return None
    # ISIZE (the size mod 2^32) sizes the buffer, no larger than deflate can expand (1032:1): the last
    # 4 bytes of a truncated file are not a trailer, and could ask for 4 GiB of zeros
    out = bytearray(min(int.from_bytes(comp[-4:], "little"), _MAX_DEFLATE_RATIO * len(comp)))
    pos = 0
    d = zlib.decompressobj(wbits=31)  # gzip header and trailer (CRC, size) checked by zlib
    view = memoryview(comp)
    try:
        for i in range(0, len(comp), _IN_STEP):
            data: Any = view[i:i + _IN_STEP]
            while data:
                piece = d.decompress(data, _OUT_STEP)
                out[pos:pos + len(piece)] = piece  # grows the buffer past a wrong (wrapped) ISIZE
                pos += len(piece)
                data = d.unconsumed_tail
            if d.eof:
                if d.unused_data or i + _IN_STEP < len(comp):
                    return None  # another member or trailing bytes: gzip.decompress decides
                break
        piece = d.flush()
        out[pos:pos + len(piece)] = piece
        pos += len(piece)
    except zlib.error:
        return None
    if not d.eof:
        return None  # truncated
    del out[pos:]
    return out


class ChunkError(ValueError):
    """A slice of the item array that does not parse: the whole document's parse names the error."""


class ItemChunks:
    """The items of a file's ``key`` array, parsed one slice of ~:data:`CHUNK_BYTES` of text at a
    time (iterate: lists of consecutive items), from the text ``raw`` and the byte offsets of the
    first item of each slice, ``starts``, and of the array's ``]``, ``close``."""

    def __init__(self, path: Path, key: str, raw: bytes | bytearray, starts: list[int], close: int) -> None:
        self.path, self.key, self.raw, self.starts, self.close_at = path, key, raw, starts, close

    def __iter__(self) -> Iterator[list[Any]]:
        raw = self.raw
        assert raw is not None, "chunks read after close()"
        edges = [*self.starts, self.close_at]
        for a, b in zip(edges, edges[1:]):
            last = b == self.close_at
            # the slice ends with its last item (the last slice) or with the comma after it: a null
            # closes the array; the wrapping object puts the items as deep as the document does
            # (orjson's nesting limit counts alike)
            text = b'{"":[' + raw[a:b] + (b"]}" if last else b"null]}")
            try:
                items = orjson.loads(text)[""]
            except orjson.JSONDecodeError:
                raise ChunkError(f"{self.path}: a slice of {self.key!r} is not JSON") from None
            del text
            if not last:
                items.pop()
            yield items
            del items

    def full(self) -> Any:
        """The whole document, parsed at once (raises the error of the document's text)."""
        raw = self.raw if self.raw is not None else read_text(self.path)
        return load_json(self.path, raw)

    def close(self) -> None:
        """Drop the text: the items have been read."""
        self.raw = None


def load_chunked(path: Path, key: str) -> tuple[Any, ItemChunks | None]:
    """A JSON file, pre-scanned (:func:`ettools.io.check_items_are_objects`: its top-level ``key``
    array must hold objects), and the items of that array.

    Returns (document, chunks): with chunks, the document is parsed without its items (``key`` an
    empty list) and the chunks give them; without (None), the document was parsed whole, items
    included (no single ``key`` array to cut)."""
    raw = read_text(path)
    bounds: list[tuple[int, int]] = []
    check_items_are_objects(path, raw, key, bounds)
    cut = _cut(bounds)
    if cut is not None:
        open_at, starts, close = cut
        try:
            data = orjson.loads(raw[:open_at + 1] + raw[close:])
        except orjson.JSONDecodeError:
            data = None  # the whole parse names the error
        if isinstance(data, dict) and isinstance(data.get(key), list) and not data[key]:
            # the array cut out is the one the whole parse keeps (a later duplicate key would
            # replace it there: it shows here as a non-empty or non-list value)
            return data, ItemChunks(path, key, raw, starts, close)
    return load_json(path, raw), None


def _cut(bounds: list[tuple[int, int]]) -> tuple[int, list[int], int] | None:
    """(offset of the ``[``, offsets where slices start, offset of the ``]``) of the one key array
    that ``bounds`` describes, slices at least :data:`CHUNK_BYTES` apart; None unless exactly one."""
    if (len(bounds) < 2 or bounds[0][0] != 0 or bounds[-1][0] != _CLOSE_ARRAY
            or any(k != _OPEN_ITEM for k, _ in bounds[1:-1])):
        return None
    starts: list[int] = []
    for _, pos in bounds[1:-1]:
        if not starts or pos - starts[-1] >= CHUNK_BYTES:
            starts.append(pos)
    return bounds[0][1], starts, bounds[-1][1]
