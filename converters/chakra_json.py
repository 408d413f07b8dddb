"""Chakra JSON: the protobuf JSON mapping of a Chakra trace, one file per rank.

``<name>.<rank>.json`` holds one object::

    {"global_metadata": {"version": "0.0.4", "attr": [{"name": "pid", "uint64Val": "114598"}]},
     "nodes": [
    {"id": "216", "name": "aten::mm", "type": "COMP_NODE", "ctrlDeps": ["3"], "dataDeps": ["12"],
     "durationMicros": "318", "attr": [{"name": "is_cpu_op", "boolVal": true}, ...]},
    ...
    ]}

``global_metadata`` is a ``GlobalMetadata`` message and every element of ``nodes`` a ``Node``
message in the canonical protobuf JSON mapping (``google.protobuf.json_format``): lowerCamelCase
field names, 64-bit integers as strings, enums by name, fields at their default value left out,
``bytes`` in base64. The writer puts one node per line, in ascending id order, and a
``comm_group.json`` beside the files as the binary writer does. The reader also accepts the
``.proto`` field names (``data_deps``) and the output of Chakra's own ``chakra_jsonizer`` (a
``GlobalMetadata`` object followed by ``Node`` objects, concatenated).

Nodes pass through the same mapping as binary Chakra (:mod:`ettools.converters.chakra`): the
writer encodes the nodes with the binary writer and converts each message to JSON, and the
reader parses each JSON node into a ``Node`` message and hands the stream to
:func:`~ettools.converters.chakra.mapping.nodes_to_graph`, so both formats read and write a graph the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format

from ettools.converters.chakra.encoder import encode_rank
from ettools.converters.chakra.mapping import nodes_to_graph
from ettools.converters.chakra.metadata import metadata_to_dict
from ettools.converters.chakra.paths import (
    COMM_GROUP_FILE,
    comm_group_json,
    group_keys,
    natural_key,
    read_comm_groups,
    resolve_rank_files,
)
from ettools.converters.chakra.reader import iter_frames
from ettools.converters.chakra.strict import WriteStats
from ettools.errors import TraceError
from ettools.graph import RankGraph, StringTable, Trace, TraceMeta
from ettools.io import OutputSet, check_items_are_objects, read_bytes
from ettools.schema import et_def_pb2 as pb

_JSON_SUFFIXES = (".json", ".json.gz")


def _message_dict(msg: Any) -> dict[str, Any]:
    return json_format.MessageToDict(msg)


def _split_documents(text: str, path: Path) -> list[Any]:
    """Concatenated JSON values (Chakra's jsonizer output) as a list."""
    dec = json.JSONDecoder()
    out = []
    pos = 0
    n = len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            return out
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            raise TraceError(path, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno} (char {e.pos})") from None
        out.append(obj)


def _load(path: Path) -> tuple[dict[str, Any], list[Any]]:
    """``(global_metadata dict, node dicts)`` of one Chakra JSON file."""
    data = read_bytes(path)
    if not data.strip():
        raise TraceError(path, "empty file")
    check_items_are_objects(path, data, "nodes")  # before the parse: ~40x its size otherwise
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = None
    if obj is None:
        try:
            text = data.decode()
        except UnicodeDecodeError as e:
            raise TraceError(path, f"not valid JSON: not UTF-8 at byte {e.start}") from None
        docs = _split_documents(text, path)
        if len(docs) < 2 or not all(isinstance(d, dict) for d in docs):
            raise TraceError(path, "not valid JSON: expected one object, or objects concatenated")
        return docs[0], docs[1:]
    if not isinstance(obj, dict) or "nodes" not in obj:
        raise TraceError(path, 'expected an object with "global_metadata" and "nodes" (Chakra JSON)')
    nodes = obj["nodes"]
    gm = obj.get("global_metadata", obj.get("globalMetadata", {}))
    if not isinstance(nodes, list):
        raise TraceError(path, '"nodes" is not a list')
    if not isinstance(gm, dict):
        raise TraceError(path, '"global_metadata" is not an object')
    return gm, nodes


def _parse_nodes(items: list[Any], path: Path) -> Iterator[Any]:
    for i, d in enumerate(items):
        if not isinstance(d, dict):
            raise TraceError(path, f"node {i}: expected an object, got {type(d).__name__}")
        try:
            yield json_format.ParseDict(d, pb.Node())
        except json_format.ParseError as e:
            raise TraceError(path, f"node {i}: not a Chakra Node ({e})") from None


def read_chakra_json_file(path: Path, rank: int, strings: StringTable) -> RankGraph:
    """One Chakra JSON file as the graph of ``rank``."""
    path = Path(path)
    gm_dict, node_dicts = _load(path)
    try:
        gm = json_format.ParseDict(gm_dict, pb.GlobalMetadata())
    except json_format.ParseError as e:
        raise TraceError(path, f"global_metadata: not a Chakra GlobalMetadata ({e})") from None
    meta = {"chakra_metadata": metadata_to_dict(gm), "source_file": str(path)}
    return nodes_to_graph(_parse_nodes(node_dicts, path), rank, strings, path, meta, first_frame=None)


def read_chakra_json(path: Path | list[Path], comm_group: Path | None = None) -> Trace:
    """Read Chakra JSON (one file, several, or a directory of ``<prefix>.<rank>.json``) into a Trace.

    Ranks come from the file names (a single file without a number is rank 0); process groups
    from ``comm_group`` or a ``comm_group.json`` beside the files.
    """
    items = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    files = [(r, f) for r, f in resolve_rank_files(_without_groups(items), _JSON_SUFFIXES)]
    strings = StringTable()
    meta = TraceMeta(world_size=1, source="chakra-json")
    graphs = {}
    for rank, f in files:
        g = read_chakra_json_file(f, rank, strings)
        graphs[rank] = g
        meta.world_size = max(meta.world_size, rank + 1)
        meta.extra.setdefault("chakra_version", g.meta["chakra_metadata"]["version"])
    group_files = [Path(comm_group)] if comm_group is not None else sorted(
        {f.parent / COMM_GROUP_FILE for _, f in files if (f.parent / COMM_GROUP_FILE).is_file()}
    )
    for gf in group_files:
        read_comm_groups(gf, meta)
    return Trace(meta, graphs, strings)


def _without_groups(items: list[Path]) -> list[Path]:
    """Directories expand to their rank files, leaving out ``comm_group.json``."""
    out: list[Path] = []
    for p in items:
        if p.is_dir():
            kids = sorted(
                (q for q in p.iterdir()
                 if q.is_file() and not q.name.startswith(".") and q.name.endswith(_JSON_SUFFIXES)
                 and q.name != COMM_GROUP_FILE),
                key=lambda q: natural_key(q.name),
            )
            if not kids:
                raise TraceError(p, "directory holds no Chakra JSON files")
            out.extend(kids)
        else:
            out.append(p)
    return out


def write_chakra_json(
    trace: Trace,
    outdir: Path,
    name: str = "trace",
    strict: bool = True,
    ranks: list[int] | None = None,
    report: dict[str, int] | None = None,
) -> list[Path]:
    """Write ``outdir/<name>.<rank>.json`` per rank and ``outdir/comm_group.json``; returns the paths.

    Same guarantees and arguments as :func:`~ettools.converters.chakra.write_chakra` (the node
    mapping is the binary writer's); all files appear or none.
    """
    from ettools.progress import progress

    outdir = Path(outdir)
    keys = group_keys(trace.meta, strict)
    stats = WriteStats()
    selected = trace.ranks if ranks is None else sorted(ranks)
    missing = [r for r in selected if r not in trace.graphs]
    if missing:
        raise ValueError(f"ranks not in the trace: {missing}")
    with OutputSet(clear_stale=ranks is None) as out:  # a partial write keeps the other ranks
        for r in progress(selected, "writing Chakra JSON", total=len(selected), unit="rank"):
            with out.open(outdir / f"{name}.{r}.json", compress=False) as f:
                _write_rank(f, trace, r, keys, strict, stats)
        out.write_file(outdir / COMM_GROUP_FILE, comm_group_json(trace.meta, keys))
    paths = out.paths
    if report is not None:
        report.update(stats.as_dict())
    return paths


def _write_rank(f: Any, trace: Trace, rank: int, keys: dict[str, str], strict: bool, stats: WriteStats) -> None:
    parts = encode_rank(trace.graphs[rank], trace.meta, keys, strict, stats)
    where = Path(f"<{rank}>")
    gm_frame = next(parts)
    ((_, _, gm_bytes),) = list(iter_frames(bytes(gm_frame), where))
    gm = pb.GlobalMetadata.FromString(gm_bytes)
    f.write(b'{"global_metadata": ' + orjson.dumps(_message_dict(gm)) + b', "nodes": [')
    sep = b"\n"
    for chunk in parts:
        for _, _, payload in iter_frames(bytes(chunk), where):
            f.write(sep + orjson.dumps(_message_dict(pb.Node.FromString(payload))))
            sep = b",\n"
    f.write(b"\n]}\n")
