"""Writing synthesized traces as Chakra files, thousands of ranks at disk speed.

Ranks of one pipeline stage have the same nodes; their files differ only in the ``pg_name`` of
each collective (the process-group key) and the ``comm_src``/``comm_dst`` of each send/recv. So
:func:`write_synth` encodes one *representative* rank per class with the Chakra writer
(:func:`ettools.converters.chakra.encode_rank`), finds where those values sit in its bytes, and
writes every other rank of the class as a copy of those bytes with the values overwritten — a
vectorized byte patch, no re-encoding. For the patch to keep lengths, group keys are decimal
strings of one fixed width (``"1000"`` … ``"1999"`` for fewer than 1,000 groups: keys are
``> 0`` as ASTRA-sim wants), and a class also fixes the varint length of the rank and of each of
its peers. The bytes equal what the writer would produce for each rank (a test checks it).
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from ettools.converters import chakra_wire as w
from ettools.converters.chakra.encoder import encode_rank
from ettools.converters.chakra.metadata import DEFAULT_VERSION, SLOT_GROUPS_ATTR, STRUCTURE_ATTR
from ettools.converters.chakra.paths import COMM_GROUP_FILE, comm_group_json, format_rank_list
from ettools.converters.chakra.strict import WriteStats
from ettools.graph import NodeType
from ettools.io import OutputSet

from .synth import SynthResult

_POOL = 4  # patched copies a class keeps for reuse

_PG = re.compile(re.escape(b"\x0a\x07pg_name\xea\x01"))
_SRC = re.escape(b"\x0a\x08comm_src\x38")
_DST = re.escape(b"\x0a\x08comm_dst\x38")
_SLOTS = re.escape(b"\x0a" + bytes([len(SLOT_GROUPS_ATTR)]) + SLOT_GROUPS_ATTR.encode() + b"\xea\x01")


def group_key_map(result: SynthResult) -> dict[str, str]:
    """Process-group name -> fixed-width decimal key, in registration order."""
    names = list(result.trace.meta.process_groups)
    width = len(str(max(len(names), 1)))
    base = 10 ** width
    return {nm: str(base + i) for i, nm in enumerate(names)}


def _varint_len(v: np.ndarray) -> np.ndarray:
    return w.varint_sizes(np.asarray(v, np.int64).view(np.uint64))


class _Template:
    """One class representative's bytes and where its per-rank values sit."""

    def __init__(self, result: SynthResult, rep: int, keys: dict[str, str], key_len: int,
                 extra_attr: tuple = (), rep_slot_keys: np.ndarray | None = None) -> None:
        st = result.stamper.stage_of(rep)
        self.sg = result.stages[st]
        c = self.sg.cols
        typ = c["type"]
        coll = np.flatnonzero(typ == NodeType.COMM_COLL_NODE)  # ids are rows: file order
        p2p = np.flatnonzero((typ == NodeType.COMM_SEND_NODE) | (typ == NodeType.COMM_RECV_NODE))
        self.pg_slot = c["slot"][coll].astype(np.int64)
        self.key_len = key_len
        self.p2p_send = typ[p2p] == NodeType.COMM_SEND_NODE
        self.p2p_delta = self.sg.peer_delta[p2p]
        slots = (np.zeros((0, key_len), np.uint8) if rep_slot_keys is None else rep_slot_keys)
        # the structure digest: this class's bytes without the class attributes, every group key
        # and peer zeroed, plus which slot each collective's key comes from and each peer's offset
        raw0 = self._encode(result, rep, keys, extra_attr)
        self._locate(raw0, len(coll), len(p2p), rep)
        masked = np.frombuffer(raw0, np.uint8).copy()
        masked[self._site_index()] = 0
        h = hashlib.blake2b(digest_size=16)
        for a in (masked, self.pg_slot, self.p2p_delta.astype(np.int64), self.p2p_send, np.array([len(slots)])):
            h.update(np.ascontiguousarray(a).tobytes())
        slot_text = ",".join(bytes(row).decode() for row in slots)
        raw = self._encode(result, rep, keys, (*extra_attr, (STRUCTURE_ATTR, "string_val", h.hexdigest()),
                                               (SLOT_GROUPS_ATTR, "string_val", slot_text)))
        self.data = np.frombuffer(raw, np.uint8).copy()
        self.free: list[np.ndarray] = []  # copies of data whose writes are done (patched again)
        self._locate(raw, len(coll), len(p2p), rep)
        self.n_slots = len(slots)
        self.slots_pos = -1
        if self.n_slots and key_len:
            hits = [m.end() for m in re.finditer(_SLOTS, raw)]
            if len(hits) != 1 or raw[hits[0]] != len(slot_text):
                raise RuntimeError(f"rank {rep}: the slot groups attribute is not where it was written")
            self.slots_pos = hits[0] + 1
        self._patch_sites()

    @staticmethod
    def _encode(result: SynthResult, rep: int, keys: dict[str, str], extra_attr: tuple) -> bytes:
        g = result.rank_graph(rep).replace()  # its own meta: the result's graph is left as it was
        if extra_attr:
            md = dict(g.meta.get("chakra_metadata") or {"version": DEFAULT_VERSION, "attr": []})
            md["attr"] = list(md["attr"]) + list(extra_attr)
            g.meta["chakra_metadata"] = md
        parts = [p.tobytes() if isinstance(p, np.ndarray) else p
                 for p in encode_rank(g, result.trace.meta, keys, True, WriteStats())]
        return b"".join(parts)

    def _locate(self, raw: bytes, n_coll: int, n_p2p: int, rep: int) -> None:
        """Where the group keys and peers sit in ``raw``."""
        pos = np.array([m.end() + 1 for m in _PG.finditer(raw)], np.int64)
        if len(pos) != n_coll:
            raise RuntimeError(f"rank {rep}: found {len(pos)} pg_name values for {n_coll} collectives")
        self.pg_pos = pos
        self.src_pos, self.src_len = self._find(raw, _SRC, n_p2p, rep)
        self.dst_pos, self.dst_len = self._find(raw, _DST, n_p2p, rep)

    def _site_index(self) -> np.ndarray:
        """Byte offsets of every group key and peer value."""
        parts = [(self.pg_pos[:, None] + np.arange(self.key_len)[None, :]).ravel()]
        for pos, lens in ((self.src_pos, self.src_len), (self.dst_pos, self.dst_len)):
            if len(pos):
                parts.append(np.repeat(pos, lens) + (np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)))
        return np.concatenate(parts).astype(np.int64)

    @staticmethod
    def _find(raw: bytes, pat: bytes, n: int, rep: int) -> tuple[np.ndarray, np.ndarray]:
        starts = [m.end() for m in re.finditer(pat, raw)]
        if len(starts) != n:
            raise RuntimeError(f"rank {rep}: found {len(starts)} peer attributes for {n} sends/recvs")
        pos = np.asarray(starts, np.int64)
        lens = np.ones(len(pos), np.int64)
        if len(pos):
            b = np.frombuffer(raw, np.uint8)
            more = (b[pos] & 0x80) != 0
            k = 1
            while more.any():
                lens += more
                more = more & ((b[np.minimum(pos + k, len(b) - 1)] & 0x80) != 0)
                k += 1
        return pos, lens

    def recycle(self, buf: np.ndarray) -> None:
        """Take back a copy whose write is done; a few are kept (the class's ranks come in a row:
        more would only hold memory once the writer has moved on to the next class)."""
        if len(self.free) < _POOL:
            self.free.append(buf)

    def take(self) -> np.ndarray:
        """A buffer for :meth:`patched` to patch into: one a finished write gave back to
        :attr:`free`, or a new copy of the class's bytes."""
        return self.free.pop() if self.free else self.data.copy()

    def _patch_sites(self) -> None:
        """Flat byte offsets of every per-rank value, computed once per class: the slot-groups
        attribute's keys, each collective's key, and the peers' varints grouped by length."""
        k = np.arange(self.key_len)
        self._slots_idx = (self.slots_pos + np.arange(self.n_slots)[:, None] * (self.key_len + 1)
                           + k[None, :]).ravel() if self.slots_pos >= 0 else None
        self._pg_idx = (self.pg_pos[:, None] + k[None, :]).ravel()
        self._peer_sites: list[tuple[int, np.ndarray, np.ndarray, int]] = []  # (src 0 / dst 1, rows, bytes, length)
        for which, (pos, lens) in enumerate(((self.src_pos, self.src_len), (self.dst_pos, self.dst_len))):
            for length in np.unique(lens).tolist():
                rows = np.flatnonzero(lens == length)
                self._peer_sites.append((which, rows, (pos[rows][:, None] + np.arange(length)[None, :]).ravel(),
                                         length))

    def patched(self, rank: int, slot_group_keys: np.ndarray, into: np.ndarray | None = None) -> np.ndarray:
        """This class's bytes with ``rank``'s group keys and peers (``into``: patched into that copy
        of them, which may hold another rank's values — every rank of the class rewrites every site)."""
        buf = self.data.copy() if into is None else into
        if self._slots_idx is not None and len(slot_group_keys):
            buf[self._slots_idx] = slot_group_keys.reshape(-1)
        if len(self._pg_idx):
            buf[self._pg_idx] = slot_group_keys[self.pg_slot].reshape(-1)
        if self._peer_sites:
            peer = rank + self.p2p_delta
            ends = (np.where(self.p2p_send, rank, peer), np.where(self.p2p_send, peer, rank))  # comm_src, comm_dst
            for which, rows, idx, length in self._peer_sites:
                buf[idx] = w.varint_matrix(ends[which][rows], length).reshape(-1)
        return buf


def write_synth(result: SynthResult, outdir: str | Path, name: str = "synth", ranks: list[int] | None = None,
                progress: bool = True) -> dict[str, Any]:
    """Write ``outdir/<name>.<rank>.et`` for ``ranks`` (default all) and ``outdir/comm_group.json``.

    Returns ``{"paths": [...], "bytes": total, "seconds": wall, "mb_per_s": …, "classes": n}``.
    All files appear or none.
    """
    t0 = time.perf_counter()
    outdir = Path(outdir)
    world = result.world_size
    sel = list(range(world)) if ranks is None else sorted(set(int(r) for r in ranks))
    bad = [r for r in sel if not 0 <= r < world]
    if bad:
        raise ValueError(f"ranks {bad[:5]} outside 0..{world - 1}")
    stamper = result.stamper
    # stages of the selected ranks must exist
    missing = sorted({stamper.stage_of(r) for r in sel} - set(result.stages))
    if missing:
        raise ValueError(f"stages {missing} were not built: synthesize with these ranks (or all)")
    keys = group_key_map(result)
    key_len = len(next(iter(keys.values()))) if keys else 0
    # key bytes per (slot, group index)
    slot_keys: list[np.ndarray] = []
    for axes in stamper.slot_axes:
        n = result.stamper.mesh.n_groups(axes)
        arr = np.frombuffer("".join(keys[stamper.group_name(axes, gi)] for gi in range(n)).encode(),
                            np.uint8).reshape(n, key_len)
        slot_keys.append(arr)
    sel_arr = np.asarray(sel, np.int64)
    mesh = stamper.mesh
    stage = mesh.coords(sel_arr)["pp"]
    gidx = np.stack([mesh.group_index(sel_arr, ax) for ax in stamper.slot_axes], axis=1) if stamper.slot_axes \
        else np.zeros((len(sel), 0), np.int64)
    # class: stage + varint lengths of the rank and of each peer it talks to
    deltas = {st: np.unique(result.stages[st].peer_delta[result.stages[st].tags >= 0])
              for st in set(stage.tolist())}
    rank_len = _varint_len(sel_arr)
    # a partial write says which ranks it holds: a reader tells a missing file from an unwritten rank
    extra = (("ettools_ranks_written", "string_val", format_rank_list(sel)),) if len(sel) < world else ()
    templates: dict[tuple, _Template] = {}
    total = 0
    from ettools.progress import progress as bar

    with OutputSet(clear_stale=len(sel) == world) as out:  # a partial write (--ranks) keeps other ranks
        it = range(len(sel))
        if progress:
            it = bar(it, "writing Chakra (stamped)", total=len(sel), unit="rank")
        for k in it:
            r = sel[k]
            st = int(stage[k])
            d = deltas[st]
            key = (st, int(rank_len[k]), tuple(_varint_len(r + d).tolist()) if len(d) else ())
            if key_len and slot_keys:
                per_slot = np.stack([slot_keys[s][gidx[k, s]] for s in range(len(slot_keys))])
            else:
                per_slot = np.zeros((0, key_len), np.uint8)
            tpl = templates.get(key)
            if tpl is None:
                tpl = templates[key] = _Template(result, r, keys, key_len, extra, per_slot)
            # patched into a pooled copy, written by the set's thread while the next rank is patched
            buf = tpl.patched(r, per_slot, into=tpl.take())
            out.submit(outdir / f"{name}.{r}.et", buf, release=tpl.recycle)
            total += len(buf)
        data = comm_group_json(result.trace.meta, keys)
        out.write_file(outdir / COMM_GROUP_FILE, data)
        total += len(data)
    paths = out.paths
    dt = time.perf_counter() - t0
    return {"paths": paths, "bytes": total, "seconds": dt, "mb_per_s": total / 1e6 / dt if dt else 0.0,
            "classes": len(templates), "ranks": len(sel)}
