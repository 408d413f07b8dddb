"""The edges a Kineto rank's timeline structure gives: NEST (a host op to the op whose span
contains it) and ORDER between a thread's consecutive top-level ops, with the idle gap before
every host node; ORDER between a stream's consecutive ops; CTRL from a backward op to its forward
op (``fwdbwd`` flows). The gloo send/recv spans that outlive their caller are kept out of nesting.
"""

from __future__ import annotations

from itertools import repeat
from operator import eq

import numpy as np

from ettools.converters.kineto_events import ANNOT, Events, _FirstSeen, _pick, distinct, member, usable_flows
from ettools.converters.kineto_rank import _Rank
from ettools.graph import EdgeKind
from ettools.intervals import prev_ge

NEST_TOL_US = 1.0  # a child may end this much after its parent (separately rounded timestamps)


def _segments(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start/end offsets of runs of equal values in a grouped array."""
    if len(keys) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cut = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [len(keys)]))
    return starts, ends


def _gloo_rows(r: _Rank) -> np.ndarray:
    """Rows of gloo send/recv spans (kept out of nesting: they outlive their caller op)."""
    ann = np.flatnonzero(r.cls == ANNOT)
    if len(ann) == 0:
        return np.zeros(0, np.int64)
    ids = distinct(r.name_id[ann])
    p2p_ids = [i for i in ids.tolist() if r.strings[i].startswith(("gloo:send", "gloo:recv"))]
    return ann[member(r.name_id[ann], p2p_ids)] if p2p_ids else np.zeros(0, np.int64)


def _nesting(r: _Rank, exclude: np.ndarray) -> None:
    """Parent of every host node (NEST edges), ORDER between top-level ops, gaps before host nodes."""
    mask = r.is_host.copy()
    mask[exclude] = False
    hn = np.flatnonzero(mask)
    hn = hn[np.argsort(r.res[hn], kind="stable")]  # grouped by thread, start order inside
    seg_s, seg_e = _segments(r.res[hn])
    eps = 1e-6
    for a, b in zip(seg_s.tolist(), seg_e.tolist()):
        rows = hn[a:b]
        # the parent: the nearest earlier op (start order) still running when this one starts and
        # ending no earlier than it, give or take the profiler's clock rounding (NEST_TOL_US)
        end = r.end[rows]
        q = np.maximum(end - NEST_TOL_US, r.start[rows] + eps)
        # the previous op is the parent when it is still running (the usual first child): only
        # the others are searched, from two ops back
        near = np.zeros(len(rows), bool)
        near[1:] = end[:-1] >= q[1:]
        p = np.full(len(rows), -1, np.int64)
        p[near] = np.flatnonzero(near) - 1
        far = np.flatnonzero(~near)
        if len(far):
            p[far] = prev_ge(end, q[far], far - 2)
        has = p >= 0
        r.parent[rows[has]] = rows[p[has]]
    child = np.flatnonzero(r.parent >= 0)
    r.add_edges(child, r.parent[child], EdgeKind.NEST)
    # ORDER between consecutive top-level ops of each thread; gaps before every host node:
    # siblings are grouped by (thread, parent), previous sibling's end (or the parent's start).
    key = np.lexsort((hn, r.parent[hn], r.res[hn]))
    sib = hn[key]
    same = np.zeros(len(sib), bool)
    if len(sib) > 1:
        same[1:] = (r.res[sib[1:]] == r.res[sib[:-1]]) & (r.parent[sib[1:]] == r.parent[sib[:-1]])
    nxt = sib[1:][same[1:]]
    prv = sib[:-1][same[1:]]
    top = r.parent[nxt] < 0
    r.add_edges(nxt[top], prv[top], EdgeKind.ORDER)
    r.top_prev = np.full(r.n, -1, np.int64)  # previous top-level op of the thread
    r.top_prev[nxt[top]] = prv[top]
    gap = np.full(r.n, np.nan)
    gap[nxt] = r.start[nxt] - r.end[prv]
    first = sib[~same]
    inner = first[r.parent[first] >= 0]
    gap[inner] = r.start[inner] - r.start[r.parent[inner]]
    gap = np.maximum(gap, 0.0, where=~np.isnan(gap), out=gap)
    rows = np.flatnonzero(~np.isnan(gap))
    r.set_attr("gap_before_us", "double_val", rows, gap[rows].tolist())
    r.host_sorted = hn  # host nest nodes grouped by thread, start order


def _device_order(r: _Rank) -> None:
    """ORDER edges between consecutive ops of each stream."""
    dn = np.flatnonzero(r.is_dev)
    dn = dn[np.argsort(r.res[dn], kind="stable")]
    if len(dn) > 1:
        same = r.res[dn[1:]] == r.res[dn[:-1]]
        r.add_edges(dn[1:][same], dn[:-1][same], EdgeKind.ORDER)
    r.dev_sorted = dn


def _fwdbwd(r: _Rank, e: Events, base: float) -> None:
    """CTRL edges backward op → forward op from ``fwdbwd`` flows, and the ``fwdbwd`` attribute.

    A flow end binds to the host op starting at its timestamp on its thread; among ops starting
    together, the one with a ``Sequence number`` (the autograd op), else the innermost.
    """
    flows = e.flow_fields if e.flow_fields else usable_flows(e.flows)
    nf = len(flows["ts"])
    if not nf:
        return
    host = np.flatnonzero(r.is_host)
    span = float(r.end.max() - r.start.min()) + 1.0 if r.n else 1.0
    has_seq = np.zeros(r.n, np.int8)
    seq = r.attrs.get("seq")
    if seq is not None:
        has_seq[seq.rows] = 1
    key = r.tid_code[host] * span + r.start[host]
    o = np.lexsort((host, has_seq[host], key))
    skey, srow = key[o], host[o]
    tid_index = {t: k for k, t in enumerate(e.tids)}
    fcode = np.fromiter(map(tid_index.get, flows["tid"], repeat(-1)), np.float64, nf)
    fkey = fcode * span + (np.fromiter(flows["ts"], np.float64, nf) - base)
    pos = np.searchsorted(skey, fkey, side="right") - 1
    hit = (pos >= 0) & (fcode >= 0)
    hit[hit] = skey[pos[hit]] == fkey[hit]
    hits = np.flatnonzero(hit)
    if not len(hits):
        return
    # each flow id's start and finish op: the last bound flow end of each kind wins; ids compare as
    # dict keys do (1, 1.0 and True are one id, kept as first seen)
    ids = _FirstSeen()
    code = np.fromiter(map(ids.__getitem__, _pick(flows["id"], hits)), np.int64, len(hits))
    is_s = np.fromiter(map(eq, _pick(flows["ph"], hits), repeat("s")), bool, len(hits))
    row = srow[pos[hits]]
    nid = len(ids)
    end_row = {}
    for ph, mask in (("s", is_s), ("f", ~is_s)):
        at = np.flatnonzero(mask)[::-1]  # latest first: np.unique keeps the first of each id
        u, first = np.unique(code[at], return_index=True)
        end_row[ph] = np.full(nid, -1, np.int64)
        end_row[ph][u] = row[at[first]]
    keys = list(ids)
    is_int = np.fromiter(map(isinstance, keys, repeat(int)), bool, nid)
    s_row, f_row = end_row["s"], end_row["f"]
    pair = np.flatnonzero((s_row >= 0) & (f_row >= 0) & (s_row != f_row) & is_int)  # first-seen order
    r.add_edges(f_row[pair], s_row[pair], EdgeKind.CTRL)
    if len(pair):
        rows = np.stack((s_row[pair], f_row[pair]), axis=1).ravel()
        fid = np.repeat(pair, 2)
        u, last = np.unique(rows[::-1], return_index=True)  # a row in several pairs: its last id
        r.set_attr("fwdbwd", "int64_val", u, _pick(keys, fid[::-1][last]))
