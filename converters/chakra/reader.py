"""Reading Chakra ``.et`` files into a :class:`~ettools.graph.Trace`: frames split and checked,
nodes decoded (in bulk by :mod:`.decode`, else one protobuf message at a time) and mapped
(:mod:`.mapping`), and the fast path for ranks a writer stamped from one graph (same bytes but for
their group keys and peers: the graph's arrays shared, no decoding).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from ettools.errors import TraceError
from ettools.graph import NodeType, RankGraph, StringTable, Trace, TraceMeta
from ettools.io import read_bytes
from ettools.progress import progress
from ettools.schema import et_def_pb2 as pb

from .attributes import _I31
from .decode import collect_wire
from .mapping import build_rank_graph, collect_messages
from .metadata import (
    SLOT_GROUPS_ATTR,
    SLOT_GROUPS_META,
    STRUCTURE_ATTR,
    STRUCTURE_META,
    _apply_synth_metadata,
    metadata_to_dict,
    restore_launch_edges,
    take_ettools_metadata,
)
from .paths import COMM_GROUP_FILE, format_rank_list, missing_ranks, read_comm_groups, resolve_rank_files

log = logging.getLogger(__name__)

def frame_bounds(data: bytes, path: Path, notes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets, payload starts, payload ends)`` of every frame of a Chakra stream, as arrays.

    Frame ``k`` (numbered from 1 in messages) starts at byte ``offsets[k-1]`` with its length
    varint. Raises :class:`TraceError` for an empty stream, a truncated or overlong length
    varint, or a frame running past the end. A zero-length frame after the first ends the
    stream (as in Chakra's reader); that is recorded in ``notes``. A zero-length first frame
    is an empty GlobalMetadata.
    """
    n = len(data)
    if n == 0:
        raise TraceError(path, "empty file: no GlobalMetadata frame")
    offsets: list[int] = []
    off_append = offsets.append
    pos = 0
    while pos < n:
        b = data[pos]
        if b < 0x80 and b:  # lengths below 128 and 16384: the common cases, decoded inline
            off_append(pos)
            pos += 1 + b
            continue
        if b and pos + 1 < n and data[pos + 1]:
            b2 = data[pos + 1]
            if b2 < 0x80:
                off_append(pos)
                pos += 2 + ((b & 0x7F) | (b2 << 7))
                continue
        length, head = _slow_varint(data, pos, len(offsets) + 1, path)
        if length == 0 and offsets:
            if notes is not None:
                notes.append(
                    f"zero-length frame {len(offsets) + 1} at byte offset {pos} ends the stream"
                    + (f"; {n - head} following bytes ignored" if head < n else "")
                )
            return _bounds(data, offsets, pos)
        off_append(pos)
        pos = head + length
    if pos > n:
        last = offsets[-1]
        length, head = _slow_varint(data, last, len(offsets), path)
        raise TraceError(
            path,
            f"frame {len(offsets)} at byte offset {last} declares {length} bytes but only {n - head} "
            "remain (file cut short?)",
        )
    return _bounds(data, offsets, pos)


def _bounds(data: bytes, offsets: list[int], end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frame offsets -> ``(offsets, payload starts, payload ends)``; frames are contiguous."""
    off = np.asarray(offsets, np.int64)
    ends = np.empty_like(off)
    ends[:-1] = off[1:]
    if len(off):
        ends[-1] = end
    # payload starts after each length varint: its size from the stop bit of its bytes
    raw = np.frombuffer(data, np.uint8)
    size = np.ones(len(off), np.int64)
    cont = raw[off] >= 0x80
    k = 1
    while cont.any():
        size += cont
        nxt = np.minimum(off + k, len(raw) - 1)
        cont &= raw[nxt] >= 0x80
        k += 1
    return off, off + size, ends


def _slow_varint(data: bytes, pos: int, index: int, path: Path) -> tuple[int, int]:
    start = pos
    value = shift = 0
    n = len(data)
    while True:
        if pos >= n:
            raise TraceError(path, f"frame {index} at byte offset {start}: length varint truncated by end of file")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise TraceError(path, f"frame {index} at byte offset {start}: malformed length varint")


def iter_frames(data: bytes, path: Path, notes: list[str] | None = None) -> Iterator[tuple[int, int, bytes]]:
    """``(frame number from 1, byte offset, payload)`` of every frame (see :func:`frame_bounds`)."""
    offsets, starts, ends = frame_bounds(data, path, notes)
    for k, (off, a, b) in enumerate(zip(offsets.tolist(), starts.tolist(), ends.tolist())):
        yield k + 1, off, data[a:b]


def _parse(cls: Any, payload: bytes, path: Path, index: int, offset: int) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, RuntimeError, ValueError) as e:
        what = "GlobalMetadata" if cls is pb.GlobalMetadata else "Node"
        raise TraceError(path, f"frame {index} at byte offset {offset} does not parse as {what} ({e})") from None
    return msg


def read_chakra_file(path: Path, rank: int, strings: StringTable, fast: bool = True,
                     stamped: _StampedFiles | None = None) -> RankGraph:
    """One ``.et`` file (plain or gzip) as the graph of ``rank``.

    ``fast`` decodes the nodes in bulk (:mod:`.decode`), falling back
    to one protobuf message per node for anything unusual; ``fast=False`` always uses protobuf.
    ``stamped``: files read before; a file equal to one of them but for its group keys and peers
    (ranks a writer stamped from one graph) shares that graph's arrays instead of being decoded.
    """
    path = Path(path)
    data = read_bytes(path)
    if stamped is not None:
        g = stamped.graph(data, path, rank)
        if g is not None:
            return g
    notes: list[str] = []
    offsets, starts, ends = frame_bounds(data, path, notes)
    gm = _parse(pb.GlobalMetadata, data[starts[0] : ends[0]], path, 1, int(offsets[0]))
    col = collect_wire(data, starts[1:], ends[1:], strings) if fast else None
    decoder = "bulk" if col is not None else "protobuf"
    if col is None:
        nodes = (
            _parse(pb.Node, data[a:b], path, k + 2, off)
            for k, (off, a, b) in enumerate(zip(offsets[1:].tolist(), starts[1:].tolist(), ends[1:].tolist()))
        )
        col = collect_messages(nodes, strings)
    meta = {"chakra_metadata": metadata_to_dict(gm), "source_file": str(path), "chakra_decoder": decoder}
    meta.update(take_ettools_metadata(meta["chakra_metadata"]))  # steps, stream gap, launch queue
    g = build_rank_graph(col, rank, strings, path, meta)
    g = restore_launch_edges(g)
    _apply_synth_metadata(g)
    if notes:
        g.meta["chakra_notes"] = notes
        for note in notes:
            log.warning("%s: %s", path, note)
    if stamped is not None and decoder == "bulk":
        stamped.add(data, g, starts, ends)
    return g


_PG_SITE = re.compile(re.escape(b"\x0a\x07pg_name\xea\x01"))  # AttributeProto name + string_val key
_SRC_SITE = re.compile(re.escape(b"\x0a\x08comm_src\x38"))  # name + int32_val key
_DST_SITE = re.compile(re.escape(b"\x0a\x08comm_dst\x38"))
_SLOTS_SITE = re.compile(re.escape(b"\x0a" + bytes([len(SLOT_GROUPS_ATTR)]) + SLOT_GROUPS_ATTR.encode() + b"\xea\x01"))


class _StampedFile:
    """A decoded rank file whose ``pg_name`` values and ``comm_src``/``comm_dst`` varints sit at known
    byte ranges: a later file of the same length whose bytes differ only inside those ranges is the
    same graph with other groups and peers (arrays shared with this one, no decoding)."""

    def __init__(self, data: bytes, g: RankGraph, starts: np.ndarray, ends: np.ndarray) -> None:
        self.ok = False
        if {"pg_name", "comm_src", "comm_dst"} & set(g.attrs) or "chakra_notes" in g.meta:
            return  # some value was not placed in a column: the full decoder's business
        self.g = g
        self.arr = np.frombuffer(data, np.uint8)
        self.pg_rows = np.flatnonzero(g.comm_group >= 0)
        self.p2p_rows = np.flatnonzero(g.comm_peer >= 0)
        mask = np.zeros(len(data), bool)
        pg = self._sites(data, _PG_SITE, self.pg_rows, starts, ends, 1)
        src = self._sites(data, _SRC_SITE, self.p2p_rows, starts, ends, 0)
        dst = self._sites(data, _DST_SITE, self.p2p_rows, starts, ends, 0)
        if pg is None or src is None or dst is None:
            return
        (self.pg_pos, self.pg_len), (self.src_pos, self.src_len), (self.dst_pos, self.dst_len) = pg, src, dst
        strings = g.strings
        if any(data[a:a + n] != strings[int(i)].encode() for a, n, i in
               zip(self.pg_pos.tolist(), self.pg_len.tolist(), g.comm_group[self.pg_rows].tolist())):
            return
        self.send = g.type[self.p2p_rows] == NodeType.COMM_SEND_NODE
        src_v, dst_v = self._varints(self.arr, self.src_pos, self.src_len), self._varints(self.arr, self.dst_pos,
                                                                                             self.dst_len)
        if src_v is None or dst_v is None:
            return
        peer = g.comm_peer[self.p2p_rows]
        if not (np.where(self.send, src_v, dst_v) == g.rank).all() or not (np.where(self.send, dst_v, src_v)
                                                                              == peer).all():
            return
        # the header's slot groups (a stamped copy's own group keys): one value in the metadata frame
        self.slots_pos = self.slots_len = 0
        if g.meta.get(SLOT_GROUPS_META):
            hits = [m.end() for m in _SLOTS_SITE.finditer(data, int(starts[0]), int(ends[0]))]
            if len(hits) != 1 or data[hits[0]] >= 0x80:
                return
            self.slots_pos, self.slots_len = hits[0] + 1, data[hits[0]]
            mask[self.slots_pos:self.slots_pos + self.slots_len] = True
        for pos, lens in ((self.pg_pos, self.pg_len), (self.src_pos, self.src_len), (self.dst_pos, self.dst_len)):
            if len(pos):
                mask[np.repeat(pos, lens) + (np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens))] = True
        self.mask = mask
        self.ok = True

    @staticmethod
    def _sites(data: bytes, pat: re.Pattern, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               prefixed: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(value offsets, lengths) of ``pat``'s values, one in the frame of each of ``rows`` (file
        order), or None. ``prefixed``: a one-byte length precedes the value (a string), else a varint."""
        hits = np.array([m.end() for m in pat.finditer(data)], np.int64)
        if len(hits) != len(rows) or (len(rows) and not ((starts[rows + 1] <= hits) & (hits < ends[rows + 1])).all()):
            return None
        b = np.frombuffer(data, np.uint8)
        if prefixed:
            lens = b[np.minimum(hits, len(b) - 1)].astype(np.int64)
            if (lens >= 0x80).any():
                return None
            return hits + 1, lens
        lens = np.ones(len(hits), np.int64)
        more = (b[np.minimum(hits, len(b) - 1)] & 0x80) != 0
        k = 1
        while more.any() and k < 10:
            lens += more
            more &= (b[np.minimum(hits + k, len(b) - 1)] & 0x80) != 0
            k += 1
        return hits, lens

    @staticmethod
    def _varints(b: np.ndarray, pos: np.ndarray, lens: np.ndarray) -> np.ndarray | None:
        """Values of the varints at ``pos`` that each take exactly ``lens`` bytes (else None)."""
        v = np.zeros(len(pos), np.uint64)
        for k in range(int(lens.max(initial=0))):
            on = lens > k
            byte = b[pos[on] + k]
            cont = (byte & 0x80) != 0
            if (cont != (lens[on] > k + 1)).any():
                return None
            v[on] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        return v.astype(np.int64)

    def graph(self, data: bytes, path: Path, rank: int) -> RankGraph | None:
        """``data`` (as rank ``rank``) as this file's graph with its own groups and peers, or None."""
        b = np.frombuffer(data, np.uint8)
        if not self.mask[np.flatnonzero(b != self.arr)].all():
            return None
        g = self.g
        cols: dict[str, np.ndarray] = {}
        if len(self.p2p_rows):
            src_v, dst_v = self._varints(b, self.src_pos, self.src_len), self._varints(b, self.dst_pos, self.dst_len)
            if src_v is None or dst_v is None:
                return None
            own, peer = np.where(self.send, src_v, dst_v), np.where(self.send, dst_v, src_v)
            if (own != rank).any() or (peer < 0).any() or (peer > _I31).any():
                return None
            col = g.comm_peer.copy()
            col[self.p2p_rows] = peer
            cols["comm_peer"] = col
        if len(self.pg_rows):
            keys = [data[a:a + n] for a, n in zip(self.pg_pos.tolist(), self.pg_len.tolist())]
            try:
                ids = {k: g.strings.intern(k.decode()) for k in dict.fromkeys(keys)}
            except UnicodeDecodeError:
                return None
            col = g.comm_group.copy()
            col[self.pg_rows] = [ids[k] for k in keys]
            cols["comm_group"] = col
        h = g.replace(**cols)
        h.rank = int(rank)
        h.meta["source_file"] = str(path)
        if self.slots_len:
            try:
                h.meta[SLOT_GROUPS_META] = data[self.slots_pos:self.slots_pos + self.slots_len].decode().split(",")
            except UnicodeDecodeError:
                return None
        return h


class _StampedFiles:
    """Rank files read so far that later files may be stamped from (see :class:`_StampedFile`)."""

    _PER_LENGTH = 4  # templates of one byte length tried at most
    _LIMIT = 1 << 28  # template bytes kept at most

    def __init__(self) -> None:
        self.by_len: dict[int, list[_StampedFile]] = {}
        self.size = 0

    def graph(self, data: bytes, path: Path, rank: int) -> RankGraph | None:
        """The graph of ``data`` stamped from a kept file, or None."""
        for t in self.by_len.get(len(data), ()):
            g = t.graph(data, path, rank)
            if g is not None:
                return g
        return None

    def add(self, data: bytes, g: RankGraph, starts: np.ndarray, ends: np.ndarray) -> None:
        """Keep ``g`` (decoded from ``data``) for later files, if it qualifies and room is left."""
        same = self.by_len.setdefault(len(data), [])
        if len(same) >= self._PER_LENGTH or self.size + len(data) > self._LIMIT:
            return
        t = _StampedFile(data, g, starts, ends)
        if t.ok:
            same.append(t)
            self.size += len(data)


def _header_frame(path: Path) -> bytes | None:
    """The bytes of a plain ``.et`` file's first frame (its ``GlobalMetadata``), read alone; None for
    a gzip file or a length prefix that is not a plausible header's."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 12)  # a header frame is a few hundred bytes: one read mostly
            if head[:2] == b"\x1f\x8b":
                return None
            n = shift = pos = 0
            while pos < min(len(head), 10):
                b = head[pos]
                n |= (b & 0x7F) << shift
                pos += 1
                if not b & 0x80:
                    break
                shift += 7
            else:
                return None
            if not 0 < n <= 1 << 24:
                return None
            frame = head[pos:pos + n]
            if len(frame) < n:
                frame += fh.read(n - len(frame))
    except OSError:
        return None
    return frame if len(frame) == n else None


def read_header(path: Path) -> dict[str, Any] | None:
    """The ettools entries of a plain ``.et`` file's ``GlobalMetadata`` frame (see
    :func:`.metadata.take_ettools_metadata`), reading only that frame; None for a gzip file or a
    header that does not parse (the full reader then says what is wrong)."""
    frame = _header_frame(path)
    if frame is None:
        return None
    gm = pb.GlobalMetadata()
    try:
        gm.ParseFromString(frame)
    except DecodeError:
        return None
    md = metadata_to_dict(gm)
    out = take_ettools_metadata(md)
    out["chakra_metadata"] = md
    return out


def _string_attr(name: str) -> re.Pattern:
    """A string-valued AttributeProto ``name`` as encoded (name field, then ``string_val``)."""
    key = name.encode()
    return re.compile(re.escape(b"\x0a" + bytes([len(key)]) + key + b"\xea\x01") + rb"([\x00-\x7f])")


_STRUCTURE_SITE, _SLOTS_VALUE = _string_attr(STRUCTURE_ATTR), _string_attr(SLOT_GROUPS_ATTR)


def read_structure(path: Path) -> tuple[str, list[str]] | None:
    """A plain ``.et`` file's structure digest and group key per slot, found in its header frame
    without decoding it (the reader trusts them: :func:`read_chakra` with ``trust_structure``);
    None when the header has not both."""
    frame = _header_frame(path)
    if frame is None:
        return None
    out = []
    for pat in (_STRUCTURE_SITE, _SLOTS_VALUE):
        hits = list(pat.finditer(frame))
        if len(hits) != 1:
            return None
        a = hits[0].end()
        value = frame[a:a + frame[a - 1]]
        if len(value) != frame[a - 1]:
            return None
        try:
            out.append(value.decode())
        except UnicodeDecodeError:
            return None
    return out[0], out[1].split(",") if out[1] else []


class _HeaderTemplate:
    """A file read in full whose structure digest later files name: where its group keys and peers
    sit, so that each such file is built from it and its own header (:meth:`graph`)."""

    def __init__(self, t: RankGraph) -> None:
        self.t = t
        self.src = list(t.meta.get(SLOT_GROUPS_META) or [])
        self.rows = np.flatnonzero(t.comm_group >= 0)
        ids, inv = np.unique(t.comm_group[self.rows], return_inverse=True)
        self.inv = inv.reshape(-1)
        self.names = [t.strings[int(i)] for i in ids.tolist()]
        self.prow = np.flatnonzero(t.comm_peer >= 0)

    def graph(self, rank: int, dst: list[str], path: Path) -> RankGraph | None:
        """Rank ``rank`` as this file with each group key replaced by the rank's key of the same slot
        (``dst``, from its header) and each peer moved by the ranks' difference — the writer's promise
        for one digest, which covers the rest of the header too; None when the keys do not map."""
        t = self.t
        if len(self.src) != len(dst):
            return None
        key_of: dict[str, str] = {}
        for a, b in zip(self.src, dst):
            if key_of.setdefault(a, b) != b:
                return None
        cols: dict[str, np.ndarray] = {}
        if len(self.rows):
            try:
                ids = np.asarray([t.strings.intern(key_of[nm]) for nm in self.names], t.comm_group.dtype)
            except KeyError:
                return None
            col = t.comm_group.copy()
            col[self.rows] = ids[self.inv]
            cols["comm_group"] = col
        if len(self.prow):
            col = t.comm_peer.copy()
            col[self.prow] += rank - t.rank
            if (col[self.prow] < 0).any() or (col[self.prow] > _I31).any():
                return None
            cols["comm_peer"] = col
        h = t.replace(**cols)
        h.rank = int(rank)
        h.meta.update(source_file=str(path), chakra_decoder="header")
        h.meta[SLOT_GROUPS_META] = list(dst)
        return h


def read_chakra(paths: list[Path] | Path, comm_group: Path | None = None, fast: bool = True,
                check_ranks: bool = False, trust_structure: bool = False) -> Trace:
    """Read Chakra ``.et`` files into a :class:`Trace`.

    ``paths`` is one file, several, or directories of ``<prefix>.<rank>.et`` files (plain or
    gzip, detected from content); the rank comes from the file name (a single file without a
    number is rank 0). Process groups come from ``comm_group`` or a ``comm_group.json`` beside
    the files. Bad input raises :class:`TraceError` naming the file and frame/byte offset.
    ``check_ranks``: a job whose rank files are not all there (:func:`missing_ranks`) is bad input.
    ``trust_structure``: a file whose header names the structure digest of a file read before is
    built from that file and its header alone (:class:`_HeaderTemplate`), its body not read; the count
    is ``trace.meta.extra["ranks_from_headers"]``. For a replay that simulates one rank per class.
    """
    files = resolve_rank_files(paths)
    strings = StringTable()
    meta = TraceMeta(world_size=1, source="chakra")
    graphs: dict[int, RankGraph] = {}
    stamped = _StampedFiles() if fast else None
    by_digest: dict[str, _HeaderTemplate] = {}
    from_headers = 0
    for rank, f in progress(files, "reading Chakra", total=len(files), unit="file"):
        g = None
        if trust_structure:
            head = read_structure(f)
            t = by_digest.get(head[0]) if head else None
            g = None if t is None else t.graph(rank, head[1], f)
            from_headers += g is not None
        if g is None:
            g = read_chakra_file(f, rank, strings, fast, stamped)
            if trust_structure and g.meta.get(STRUCTURE_META):
                if g.meta[STRUCTURE_META] not in by_digest:
                    by_digest[g.meta[STRUCTURE_META]] = _HeaderTemplate(g)
        graphs[rank] = g
        meta.world_size = max(meta.world_size, rank + 1)
        meta.extra.setdefault("chakra_version", g.meta["chakra_metadata"]["version"])
    group_files = [Path(comm_group)] if comm_group is not None else sorted(
        {d / COMM_GROUP_FILE for d in {f.parent for _, f in files} if (d / COMM_GROUP_FILE).is_file()}
    )
    for gf in group_files:
        read_comm_groups(gf, meta)
    if trust_structure:
        meta.extra["ranks_from_headers"] = from_headers
    trace = Trace(meta, graphs, strings)
    if check_ranks:
        gone = missing_ranks(trace)
        if gone:
            where = files[0][1].parent
            raise TraceError(where, f"rank files missing for ranks {format_rank_list(gone)} of {meta.world_size} "
                                    f"(a replay would time their collectives wrongly); pass "
                                    f"--allow-missing-ranks to read the ranks present")
    return trace
