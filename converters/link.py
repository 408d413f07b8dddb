"""Link a PyTorch Execution Trace (host ops, tensors, data flow) with a Kineto trace of the same
run (times, device ops), and report how much got linked.

:func:`link_et_kineto` returns one trace: the ET's nodes and edges, each ET op timed by the
Kineto op it matched (``start``/``dur``; NaN when unmatched), plus the device ops (kernels,
memcpys, memsets) launched from matched ops, each with a ``LAUNCH`` edge to its ET op and an
``ORDER`` edge to the previous kept device op of its stream.

Matching host ops
-----------------
* ``rf_id``: ET attribute ``rf_id`` == Kineto ``Record function id`` (attr ``rf_id``), with equal
  names. Used when the Kineto trace carries record-function ids.
* ``sequence`` (fallback, e.g. the PARAM pairs in ``shared/traces/et_kineto``): per host thread,
  the ET ops in id order (= start order) are aligned with the Kineto ``cpu_op`` /
  ``user_annotation`` events in start order. First *anchors*: ``(name, autograd sequence
  number)`` pairs unique on both sides (ET ``seq_id``, Kineto ``Sequence number``), kept only
  where they form an increasing chain in both sequences (longest increasing subsequence). This
  finds the right iteration when the Kineto trace holds many and the ET one. Between anchors
  (and before the first / after the last, aligned outward from the anchor) a greedy diff on
  names matches equal names and skips, on a mismatch, the side whose next match is nearer
  (next occurrences found by binary search over per-name position lists). Work is
  O((n + m) log m); nothing searches backwards per kernel.
* ET threads are paired with Kineto threads by anchor votes, else by name-count overlap.

Attaching device ops
--------------------
A device op belongs to the ET op matched to the deepest matched Kineto host op enclosing its
launching runtime call (``LAUNCH`` edge, then the ``NEST`` chain). Only device ops *in the
window* count: launched while the matched host ops ran (from the first matched op's start to
the last one's end), because an ET usually covers one or a few of the iterations a Kineto
trace holds. ``LinkReport.linking_rate`` = attached / in-window device ops. Unattached device
ops are not in the output (counted in the report).

Communication: exactly one node per collective call stays a comm node. When Kineto shows the
transfer itself — an NCCL kernel (a Kineto ``COMM_*`` node or an ``ncclKernel``/``ncclDevKernel``
kernel) attached to an ET op, or a ``gloo:<op>`` span matched to an ET op — that node carries the
collective, and the ET comm node that issued it (``record_param_comms`` / ``c10d::*``: found by
Kineto's LAUNCH edge from the span to its ``c10d`` op, else the ET parent chain) becomes a
``COMP_NODE`` whose former comm fields are kept as attributes ``host_comm_type``,
``host_comm_bytes``, ``host_comm_group``. Fields the carrier lacks come from the ET node (on gloo
spans the ET's bytes/group/peer/tag win; on kernels Kineto's).

Other output attributes: ``kineto_ext_id`` on each matched ET op (its Kineto ``External id``);
on device ops the Kineto attributes (``cat``, ``correlation``, …; renamed ``kineto_<name>`` if
the ET has an attribute of that name), ``launch_api`` (the runtime call) and
``launch_offset_us`` (runtime call start − ET op start). ``RankGraph.meta["link"]`` and
``TraceMeta.extra["link"]`` hold the report. Kineto runtime calls, annotations the ET lacks and
SYNC edges are not carried over.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ettools.graph import (
    COMM_NODE_TYPES,
    AttrColumn,
    EdgeKind,
    NodeType,
    RankGraph,
    StringTable,
    Trace,
    TraceMeta,
)

HOST_CATS = ("cpu_op", "user_annotation", "operator", "Operator")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
NCCL_PREFIXES = ("ncclKernel", "ncclDevKernel")


@dataclass
class LinkReport:
    """What the linker matched: host ops, device ops in the ET's window, method and time."""

    method: str = "none"  # "rf_id", "sequence" or "none" ("mixed" over ranks that differ)
    et_host_ops: int = 0
    host_ops_matched: int = 0
    kineto_host_ops: int = 0
    anchors: int = 0
    device_ops_total: int = 0
    device_ops_in_window: int = 0
    device_ops_attached: int = 0
    seconds: float = 0.0
    per_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def host_match_rate(self) -> float:
        """Matched ET host ops / ET host ops."""
        return self.host_ops_matched / self.et_host_ops if self.et_host_ops else 0.0

    @property
    def linking_rate(self) -> float:
        """Device ops attached to an ET host op / device ops launched in the ET's window
        (1.0 when there are none to attach, as in CPU-only traces)."""
        return self.device_ops_attached / self.device_ops_in_window if self.device_ops_in_window else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (rates included)."""
        d = asdict(self)
        d["per_rank"] = {str(k): v for k, v in self.per_rank.items()}
        d["host_match_rate"] = round(self.host_match_rate, 6)
        d["linking_rate"] = round(self.linking_rate, 6)
        return d

    def __str__(self) -> str:
        if self.device_ops_in_window:
            dev = (f"device ops {self.device_ops_attached}/{self.device_ops_in_window} in the ET window "
                   f"attached ({100 * self.linking_rate:.1f} %; {self.device_ops_total} device ops in Kineto)")
        else:
            dev = f"no device ops in the ET window ({self.device_ops_total} in Kineto)"
        return (f"{self.method}: host ops {self.host_ops_matched}/{self.et_host_ops} matched, {dev}, "
                f"{self.seconds:.3f} s")


# ---- small column helpers ---------------------------------------------------------------------
def _full_int(g: RankGraph, name: str, default: int = -1) -> np.ndarray:
    """A sparse int attribute as a full column (``default`` where absent)."""
    out = np.full(len(g), default, np.int64)
    col = g.attrs.get(name)
    if col is not None and len(col.rows):
        vals = np.fromiter((v if type(v) is int else default for v in col.values), np.int64, len(col.values))
        out[col.rows] = vals
    return out


def _full_str(g: RankGraph, name: str) -> np.ndarray:
    """A sparse string attribute as a full column of ids into ``g.strings`` (-1 where absent)."""
    out = np.full(len(g), -1, np.int32)
    col = g.attrs.get(name)
    if col is not None and len(col.rows):
        intern = g.strings.intern
        out[col.rows] = np.fromiter((intern(v) for v in col.values), np.int32, len(col.values))
    return out


def _parents(g: RankGraph, kind: EdgeKind) -> np.ndarray:
    """Row of the first dependency of ``kind`` per row (-1 if none): NEST parent, launcher."""
    src, dst, k = g.edge_rows()
    m = (k == kind) & (src >= 0)
    out = np.full(len(g), -1, np.int64)
    # reversed so the first edge of a row wins
    out[dst[m][::-1]] = src[m][::-1]
    return out


def _only_kineto_steps(et: RankGraph, k: RankGraph) -> RankGraph:
    """``et`` without the ops of the ``ProfilerStep#N`` steps the Kineto trace does not hold.

    When the Kineto side was read with a step selection, the ET (which has no time base to
    select by) still holds every step; ops of the others would stay untimed and unlinked. An ET
    whose steps all appear in the Kineto trace, or that has none, is returned as it is.
    """
    kept = {str(s[0]) for s in k.meta.get("steps") or []}
    if not kept or not len(et):
        return et
    # step annotations by name id: one look at each distinct name, not at every row
    step_ids = [int(i) for i in np.unique(et.name) if i >= 0 and et.strings[int(i)].startswith("ProfilerStep#")]
    if not step_ids or all(et.strings[i] in kept for i in step_ids):
        return et
    parent = _parents(et, EdgeKind.NEST)
    # each row's outermost ancestor (itself for roots), by pointer jumping: O(log depth) passes
    root = np.where(parent >= 0, parent, np.arange(len(et)))
    for _ in range(64):
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    else:
        return et  # nesting with a cycle: leave the ET whole (the linker reports what it cannot match)
    kept_ids = [i for i in step_ids if et.strings[i] in kept]
    keep_root = np.isin(et.name, kept_ids)
    return et.select(keep_root[root])


def _depth(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), np.int64)
    anc = parent.copy()
    for _ in range(10_000):
        live = anc >= 0
        if not live.any():
            break
        depth[live] += 1
        anc[live] = parent[anc[live]]
    return depth


# ---- alignment ----------------------------------------------------------------------------
def _lis(js: list[int]) -> list[int]:
    """Indices of a longest strictly increasing subsequence of ``js`` (O(k log k))."""
    tails: list[int] = []
    tails_idx: list[int] = []
    prev = [-1] * len(js)
    for i, v in enumerate(js):
        k = bisect.bisect_left(tails, v)
        if k == len(tails):
            tails.append(v)
            tails_idx.append(i)
        else:
            tails[k] = v
            tails_idx[k] = i
        prev[i] = tails_idx[k - 1] if k > 0 else -1
    out = []
    i = tails_idx[-1] if tails_idx else -1
    while i >= 0:
        out.append(i)
        i = prev[i]
    return out[::-1]


def _positions(seq: list[int]) -> dict[int, list[int]]:
    pos: dict[int, list[int]] = {}
    for i, x in enumerate(seq):
        p = pos.get(x)
        if p is None:
            pos[x] = [i]
        else:
            p.append(i)
    return pos


def _greedy(
    a: list[int], b: list[int], a_lo: int, a_hi: int, b_lo: int, b_hi: int,
    pos_a: dict[int, list[int]], pos_b: dict[int, list[int]], reverse: bool, out: list[tuple[int, int]],
) -> None:
    """Greedy diff of ``a[a_lo:a_hi]`` and ``b[b_lo:b_hi]`` (walking backwards if ``reverse``)."""
    if reverse:
        i, j = a_hi - 1, b_hi - 1
        while i >= a_lo and j >= b_lo:
            x, y = a[i], b[j]
            if x == y:
                out.append((i, j))
                i -= 1
                j -= 1
                continue
            pb = pos_b.get(x)
            jb = -1
            if pb:
                k = bisect.bisect_right(pb, j) - 1
                if k >= 0 and pb[k] >= b_lo:
                    jb = pb[k]
            pa = pos_a.get(y)
            ia = -1
            if pa:
                k = bisect.bisect_right(pa, i) - 1
                if k >= 0 and pa[k] >= a_lo:
                    ia = pa[k]
            if jb < 0 and ia < 0:
                i -= 1
                j -= 1
            elif ia < 0 or (jb >= 0 and j - jb <= i - ia):
                if jb < 0:
                    i -= 1
                else:
                    j = jb
            else:
                i = ia
        return
    i, j = a_lo, b_lo
    while i < a_hi and j < b_hi:
        x, y = a[i], b[j]
        if x == y:
            out.append((i, j))
            i += 1
            j += 1
            continue
        pb = pos_b.get(x)
        jb = -1
        if pb:
            k = bisect.bisect_left(pb, j)
            if k < len(pb) and pb[k] < b_hi:
                jb = pb[k]
        pa = pos_a.get(y)
        ia = -1
        if pa:
            k = bisect.bisect_left(pa, i)
            if k < len(pa) and pa[k] < a_hi:
                ia = pa[k]
        if jb < 0 and ia < 0:
            i += 1
            j += 1
        elif ia < 0 or (jb >= 0 and jb - j <= ia - i):
            if jb < 0:
                i += 1
            else:
                j = jb
        else:
            i = ia


MYERS_MAX_EDITS = 256  # per segment; past it the greedy diff takes over (cost grows as edits²)


def _myers(
    a: list[int], b: list[int], a_lo: int, a_hi: int, b_lo: int, b_hi: int, max_d: int
) -> list[tuple[int, int]] | None:
    """Longest common subsequence of two slices by Myers' O((n+m)·D) diff; None past ``max_d`` edits."""
    A, B = a[a_lo:a_hi], b[b_lo:b_hi]
    n, m = len(A), len(B)
    if n == 0 or m == 0:
        return []
    if abs(n - m) > max_d:
        return None
    # lower bound on the edits from the name counts: skip hopeless segments cheaply
    ca = Counter(A)
    common = sum(min(c, ca.get(x, 0)) for x, c in Counter(B).items())
    if n + m - 2 * common > max_d:
        return None
    maxd = min(max_d, n + m)
    off = maxd + 1
    v = [0] * (2 * off + 1)
    trace: list[list[int]] = []
    found = -1
    for d in range(maxd + 1):
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]
            else:
                x = v[off + k - 1] + 1
            y = x - k
            while x < n and y < m and A[x] == B[y]:
                x += 1
                y += 1
            v[off + k] = x
            if x >= n and y >= m:
                found = d
                break
        trace.append(v[:])
        if found >= 0:
            break
    if found < 0:
        return None
    pairs: list[tuple[int, int]] = []
    x, y = n, m
    for d in range(found, 0, -1):
        pv = trace[d - 1]
        k = x - y
        down = k == -d or (k != d and pv[off + k - 1] < pv[off + k + 1])
        pk = k + 1 if down else k - 1
        px = pv[off + pk]
        py = px - pk
        mx, my = (px, py + 1) if down else (px + 1, py)
        while x > mx and y > my:
            x -= 1
            y -= 1
            pairs.append((a_lo + x, b_lo + y))
        x, y = px, py
    while x > 0 and y > 0:
        x -= 1
        y -= 1
        pairs.append((a_lo + x, b_lo + y))
    pairs.reverse()
    return pairs


def _segment(
    a: list[int], b: list[int], a_lo: int, a_hi: int, b_lo: int, b_hi: int,
    pos_a: dict[int, list[int]], pos_b: dict[int, list[int]], side: str, out: list[tuple[int, int]],
) -> None:
    """Align one segment: exact LCS when the slices differ by few edits, else the greedy diff.

    ``side`` is "mid" (between anchors), "head" (ends at an anchor: matches kept near its end)
    or "tail" (starts after an anchor).
    """
    if a_hi <= a_lo or b_hi <= b_lo:
        return
    # head/tail: try the LCS on a window of b next to the anchor only
    span = 2 * (a_hi - a_lo) + 64
    wb_lo, wb_hi = b_lo, b_hi
    if side == "head":
        wb_lo = max(b_lo, b_hi - span)
    elif side == "tail":
        wb_hi = min(b_hi, b_lo + span)
    pairs = _myers(a, b, a_lo, a_hi, wb_lo, wb_hi, MYERS_MAX_EDITS)
    if pairs is not None:
        out.extend(pairs)
        return
    if side == "head":
        head: list[tuple[int, int]] = []
        _greedy(a, b, a_lo, a_hi, b_lo, b_hi, pos_a, pos_b, True, head)
        out.extend(reversed(head))
    else:
        _greedy(a, b, a_lo, a_hi, b_lo, b_hi, pos_a, pos_b, False, out)


def align_sequences(
    a: list[int], b: list[int], a_seq: list[int] | None = None, b_seq: list[int] | None = None
) -> tuple[list[tuple[int, int]], int]:
    """Align two name sequences; returns matched ``(i, j)`` pairs (increasing) and the anchor count.

    ``a_seq``/``b_seq`` are autograd sequence numbers (-1 for none); ``(name, seq)`` keys unique on
    both sides become anchors (see the module docstring). Each segment between anchors is
    aligned exactly (longest common subsequence, Myers) when it differs by at most
    ``MYERS_MAX_EDITS`` edits, else by the greedy diff.
    """
    anchors: list[tuple[int, int]] = []
    if a_seq is not None and b_seq is not None:
        ka: dict[tuple[int, int], int] = {}
        for i, (x, s) in enumerate(zip(a, a_seq)):
            if s >= 0:
                key = (x, s)
                ka[key] = -1 if key in ka else i
        kb: dict[tuple[int, int], int] = {}
        for j, (y, s) in enumerate(zip(b, b_seq)):
            if s >= 0:
                key = (y, s)
                if key in ka:
                    kb[key] = -1 if key in kb else j
        cand = sorted((ka[k], j) for k, j in kb.items() if j >= 0 and ka[k] >= 0)
        if cand:
            keep = _lis([j for _, j in cand])
            anchors = [cand[k] for k in keep]
    pos_a = _positions(a)
    pos_b = _positions(b)
    out: list[tuple[int, int]] = []
    if not anchors:
        _segment(a, b, 0, len(a), 0, len(b), pos_a, pos_b, "mid", out)
        return out, 0
    i0, j0 = anchors[0]
    _segment(a, b, 0, i0, 0, j0, pos_a, pos_b, "head", out)
    for k, (i, j) in enumerate(anchors):
        out.append((i, j))
        if k + 1 < len(anchors):
            i1, j1 = anchors[k + 1]
            _segment(a, b, i + 1, i1, j + 1, j1, pos_a, pos_b, "mid", out)
    il, jl = anchors[-1]
    _segment(a, b, il + 1, len(a), jl + 1, len(b), pos_a, pos_b, "tail", out)
    return out, len(anchors)


# ---- linking one rank -------------------------------------------------------------------------
def _match_rf(et: RankGraph, k: RankGraph, k_host: np.ndarray, k_name: np.ndarray) -> np.ndarray | None:
    """ET row per Kineto row by record-function id (names must agree), or None if no rf ids."""
    k_rf = _full_int(k, "rf_id", 0)
    e_rf = _full_int(et, "rf_id", 0)
    k_has = k_host & (k_rf > 0)
    if not k_has.any() or not (e_rf > 0).any():
        return None
    e_rows = np.flatnonzero(e_rf > 0)
    order = np.argsort(e_rf[e_rows], kind="stable")
    sorted_rf = e_rf[e_rows][order]
    kr = np.flatnonzero(k_has)
    pos = np.searchsorted(sorted_rf, k_rf[kr])
    pos_c = np.minimum(pos, len(sorted_rf) - 1)
    hit = sorted_rf[pos_c] == k_rf[kr]
    et_rows = e_rows[order][pos_c]
    hit &= et.name[et_rows] == k_name[kr]
    out = np.full(len(k), -1, np.int64)
    out[kr[hit]] = et_rows[hit]
    # one Kineto op per ET op
    _, first = np.unique(out[kr[hit]], return_index=True)
    dup = np.ones(hit.sum(), bool)
    dup[first] = False
    out[kr[hit][dup]] = -1
    return out


def _match_sequence(
    et: RankGraph, k: RankGraph, k_host: np.ndarray, k_name: np.ndarray, k_order: np.ndarray
) -> tuple[np.ndarray, int, list[str]]:
    """ET row per Kineto row by per-thread sequence alignment."""
    warnings: list[str] = []
    e_seq = _full_int(et, "seq_id", -1)
    k_seq = _full_int(k, "seq", -1)
    # sequences per thread, in start order
    e_threads: dict[int, list[int]] = {}
    for r, res in enumerate(et.resource.tolist()):
        e_threads.setdefault(res, []).append(r)
    k_threads: dict[int, list[int]] = {}
    k_res = k.resource
    for r in k_order.tolist():
        if k_host[r]:
            k_threads.setdefault(int(k_res[r]), []).append(r)
    # score thread pairs: anchors first, then name overlap
    e_keys = {t: {(int(et.name[r]), int(e_seq[r])) for r in rows if e_seq[r] >= 0} for t, rows in e_threads.items()}
    k_keys = {t: {(int(k_name[r]), int(k_seq[r])) for r in rows if k_seq[r] >= 0} for t, rows in k_threads.items()}
    e_cnt = {t: np.bincount(et.name[rows], minlength=1) for t, rows in e_threads.items()}
    k_cnt = {t: np.bincount(k_name[rows], minlength=1) for t, rows in k_threads.items()}
    scores = []
    for te in e_threads:
        for tk in k_threads:
            a, b = e_cnt[te], k_cnt[tk]
            n = min(len(a), len(b))
            overlap = int(np.minimum(a[:n], b[:n]).sum())
            scores.append((len(e_keys[te] & k_keys[tk]), overlap, te, tk))
    scores.sort(reverse=True)
    used_e, used_k, pairs = set(), set(), []
    for sa, so, te, tk in scores:
        if te in used_e or tk in used_k or (sa == 0 and so == 0):
            continue
        used_e.add(te)
        used_k.add(tk)
        pairs.append((te, tk))
    out = np.full(len(k), -1, np.int64)
    anchors = 0
    for te, tk in pairs:
        er, kr = e_threads[te], k_threads[tk]
        a = et.name[er].tolist()
        b = k_name[kr].tolist()
        m, na = align_sequences(a, b, e_seq[er].tolist(), k_seq[kr].tolist())
        anchors += na
        for i, j in m:
            out[kr[j]] = er[i]
    # Leftovers: ops the ET puts on a thread that Kineto shows elsewhere (gloo runloop work is
    # tagged with the caller's thread in ET): unmatched ET ops, in id order, against the
    # unmatched Kineto host ops inside the matched time window, in start order (all threads).
    hit = np.flatnonzero(out >= 0)
    done = np.zeros(len(et), bool)
    done[out[hit]] = True
    rest_e = np.flatnonzero(~done).tolist()
    if rest_e and len(hit):
        w0 = np.nanmin(k.start[hit])
        w1 = np.nanmax(k.start[hit] + k.dur[hit])
        free = k_host & (out < 0) & (k.start >= w0) & (k.start <= w1)
        rest_k = k_order[free[k_order]].tolist()
        if rest_k:
            m, na = align_sequences(et.name[rest_e].tolist(), k_name[rest_k].tolist(),
                                    e_seq[rest_e].tolist(), k_seq[rest_k].tolist())
            anchors += na
            for i, j in m:
                out[rest_k[j]] = rest_e[i]
    return out, anchors, warnings


def _link_rank(et: RankGraph, k: RankGraph, strings: StringTable) -> tuple[RankGraph, dict[str, Any]]:
    """Link one rank; ``strings`` is the output table (a superset of the ET's)."""
    n_k = len(k)
    # Kineto names and categories in the output string table
    kmap = np.fromiter((strings.intern(k.strings[i]) for i in range(len(k.strings))), np.int32, len(k.strings))
    k_name = kmap[k.name] if n_k else np.zeros(0, np.int32)
    cat = _full_str(k, "cat")
    host_ids = [k.strings.lookup(c) for c in HOST_CATS]
    dev_ids = [k.strings.lookup(c) for c in DEVICE_CATS]
    k_host = np.isin(cat, [h for h in host_ids if h >= 0]) & (k.is_cpu_op != 0)
    k_dev = np.isin(cat, [d for d in dev_ids if d >= 0])
    if not k_dev.any():
        k_dev = k.is_cpu_op == 0
    parent = _parents(k, EdgeKind.NEST)
    launcher = _parents(k, EdgeKind.LAUNCH)
    depth = _depth(parent)
    k_order = np.lexsort((depth, -np.nan_to_num(k.dur), np.nan_to_num(k.start)))

    warnings: list[str] = []
    matched = _match_rf(et, k, k_host, k_name)
    method = "rf_id"
    anchors = 0
    if matched is None or not (matched >= 0).any():
        if matched is not None:
            warnings.append("record-function ids present but none matched: fell back to sequence alignment")
        matched, anchors, w = _match_sequence(et, k, k_host, k_name, k_order)
        warnings.extend(w)
        method = "sequence"
    k_matched = np.flatnonzero(matched >= 0)
    if len(k_matched) == 0:
        method = "none"
    if len(et) and len(k_matched) < 0.5 * len(et):
        warnings.append(
            f"only {len(k_matched)} of {len(et)} ET ops matched a Kineto op ({method}): "
            "the two traces may not come from the same run"
        )

    # owner: deepest matched host op enclosing each Kineto row (pointer jumping up the NEST chain)
    owner = matched.copy()
    anc = parent.copy()
    for _ in range(10_000):
        todo = (owner < 0) & (anc >= 0)
        if not todo.any():
            break
        owner[todo] = matched[anc[todo]]
        anc[todo] = parent[anc[todo]]

    dev_rows = np.flatnonzero(k_dev)
    launch = launcher[dev_rows]
    launch_start = np.where(launch >= 0, k.start[np.maximum(launch, 0)], k.start[dev_rows])
    dev_owner = np.where(launch >= 0, owner[np.maximum(launch, 0)], -1)
    if len(k_matched):
        w0 = float(np.nanmin(k.start[k_matched]))
        w1 = float(np.nanmax(k.start[k_matched] + k.dur[k_matched]))
    else:
        w0 = w1 = math.nan
    in_window = (launch_start >= w0) & (launch_start <= w1)
    attached = dev_owner >= 0
    in_window |= attached  # launched inside a matched op, so inside the window (NaN-safe)

    out = _build_output(et, k, strings, kmap, matched, dev_rows[attached], dev_owner[attached],
                        launch[attached], launcher)
    stats = {
        "method": method,
        "et_host_ops": len(et),
        "host_ops_matched": int(len(k_matched)),
        "kineto_host_ops": int(k_host.sum()),
        "anchors": anchors,
        "device_ops_total": int(len(dev_rows)),
        "device_ops_in_window": int(in_window.sum()),
        "device_ops_attached": int(attached.sum()),
        "window_us": [w0, w1],
        "warnings": warnings,
    }
    return out, stats


def _build_output(
    et: RankGraph, k: RankGraph, strings: StringTable, kmap: np.ndarray, matched: np.ndarray,
    dev: np.ndarray, dev_et_row: np.ndarray, dev_launch: np.ndarray, k_launcher: np.ndarray,
) -> RankGraph:
    """ET graph with Kineto times, plus the attached device ops."""
    n_e, n_d = len(et), len(dev)
    km = np.flatnonzero(matched >= 0)
    start = et.start.copy()
    dur = et.dur.copy()
    start[matched[km]] = k.start[km]
    dur[matched[km]] = k.dur[km]

    order = np.lexsort((dev, k.start[dev]))
    dev, dev_et_row, dev_launch = dev[order], dev_et_row[order], dev_launch[order]
    first_id = int(et.id.max()) + 1 if n_e else 0
    dev_ids = np.arange(first_id, first_id + n_d, dtype=np.uint64)

    def kstr(col: str) -> np.ndarray:
        v = k.columns[col][dev]
        if not len(kmap):
            return np.full(len(v), -1, np.int32)
        return np.where(v >= 0, kmap[np.maximum(v, 0)], -1)

    cols: dict[str, np.ndarray] = {}
    for c in et.columns:
        if c in ("name", "resource", "comm_group"):
            dv = kstr(c)
        else:
            dv = k.columns[c][dev]
        cols[c] = np.concatenate([et.columns[c], dv.astype(et.columns[c].dtype)])
    cols["id"][n_e:] = dev_ids
    cols["start"][:n_e] = start
    cols["dur"][:n_e] = dur
    cols["is_cpu_op"][n_e:] = 0

    # communication: the op that carries the transfer in Kineto (an NCCL kernel, a gloo span matched
    # to an ET op) becomes the comm node; the ET host comm node above it is demoted
    comm_cols = ("comm_type", "comm_bytes", "comm_group", "comm_peer", "comm_tag")
    comm_types = [int(t) for t in COMM_NODE_TYPES]
    dtype = cols["type"]
    is_nccl = np.fromiter((strings[int(x)].startswith(NCCL_PREFIXES) for x in cols["name"][n_e:]), bool, n_d)
    dev_comm = np.isin(dtype[n_e:], comm_types) | is_nccl
    et_parent = _parents(et, EdgeKind.NEST)
    carriers: list[tuple[int, int, bool]] = [(n_e + d, int(dev_et_row[d]), True) for d in np.flatnonzero(dev_comm)]
    host_k_comm = km[np.isin(k.type[km], comm_types)]
    for kr in host_k_comm.tolist():
        er = int(matched[kr])
        if int(et.type[er]) in comm_types:
            continue  # the ET already calls this op the collective
        dtype[er] = k.type[kr]
        for c in comm_cols:
            v = k.columns[c][kr]
            cols[c][er] = (kmap[v] if v >= 0 else -1) if c == "comm_group" else v
        # the op that issued it: Kineto's LAUNCH edge (gloo span -> c10d op) beats the ET parent,
        # which ET gets wrong around gloo collectives
        lk = int(k_launcher[kr])
        issuer = int(matched[lk]) if lk >= 0 and matched[lk] >= 0 else int(et_parent[er])
        carriers.append((er, issuer, False))
    host_comm_attrs: dict[str, tuple[list[int], list[Any]]] = {
        "host_comm_type": ([], []), "host_comm_bytes": ([], []), "host_comm_group": ([], [])}
    demoted: set[int] = set()
    for row, r, device in carriers:
        while r >= 0 and int(et.type[r]) not in comm_types:
            r = int(et_parent[r])
        if r < 0:
            continue  # no ET collective above it: keeps what Kineto says (or stays compute)
        if dtype[row] not in comm_types:
            dtype[row] = et.type[r]
        for c in comm_cols:
            if cols[c][row] < 0 or (not device and et.columns[c][r] >= 0):
                cols[c][row] = et.columns[c][r]  # ET facts win on host carriers, fill gaps on kernels
        if r not in demoted:
            demoted.add(r)
            host_comm_attrs["host_comm_type"][0].append(r)
            host_comm_attrs["host_comm_type"][1].append(int(et.comm_type[r]))
            host_comm_attrs["host_comm_bytes"][0].append(r)
            host_comm_attrs["host_comm_bytes"][1].append(int(et.comm_bytes[r]))
            host_comm_attrs["host_comm_group"][0].append(r)
            host_comm_attrs["host_comm_group"][1].append(et.group_name(r))
    for r in demoted:
        dtype[r] = int(NodeType.COMP_NODE)
        for c in comm_cols:
            cols[c][r] = -1

    # edges: the ET's, then LAUNCH and stream ORDER for device ops
    e_cnt = np.diff(et.dep_ptr)
    launch_ids = et.id[dev_et_row].astype(np.uint64)
    res = cols["resource"][n_e:]
    prev = np.full(n_d, -1, np.int64)
    last: dict[int, int] = {}
    for d, rr in enumerate(res.tolist()):
        p = last.get(rr)
        if p is not None:
            prev[d] = p
        last[rr] = d
    d_cnt = 1 + (prev >= 0)
    dep_ptr = np.zeros(n_e + n_d + 1, np.int64)
    np.cumsum(np.concatenate([e_cnt, d_cnt]), out=dep_ptr[1:])
    dep_id = np.empty(int(dep_ptr[-1]), np.uint64)
    dep_kind = np.empty(int(dep_ptr[-1]), np.uint8)
    ne = len(et.dep_id)
    dep_id[:ne] = et.dep_id
    dep_kind[:ne] = et.dep_kind
    starts = dep_ptr[n_e:-1]
    dep_id[starts] = launch_ids
    dep_kind[starts] = int(EdgeKind.LAUNCH)
    has_prev = prev >= 0
    dep_id[starts[has_prev] + 1] = dev_ids[prev[has_prev]]
    dep_kind[starts[has_prev] + 1] = int(EdgeKind.ORDER)

    # attributes: the ET's, the Kineto ones of device ops, launch facts, and on each matched
    # ET op the External id of its Kineto op (to find the event again)
    attrs = dict(et.attrs)
    ext = k.attrs.get("ext_id")
    if ext is not None and len(km):
        ext_full = _full_int(k, "ext_id", -1)[km]
        has = ext_full >= 0
        rows = matched[km][has]
        o = np.argsort(rows, kind="stable")
        attrs["kineto_ext_id"] = AttrColumn("int64_val", rows[o], ext_full[has][o].tolist())
    for name, (rows, vals) in host_comm_attrs.items():
        if rows:
            o = np.argsort(rows)
            kind = "string_val" if name == "host_comm_group" else "int64_val"
            attrs[name] = AttrColumn(kind, np.asarray(rows, np.int64)[o], [vals[i] for i in o])
    pos_in_dev = np.full(len(k), -1, np.int64)
    pos_in_dev[dev] = np.arange(n_d)
    for name, col in k.attrs.items():
        if not len(col.rows):
            continue
        m = pos_in_dev[col.rows] >= 0
        if not m.any():
            continue
        new_rows = n_e + pos_in_dev[col.rows[m]]
        vals = [v for v, keep in zip(col.values, m.tolist()) if keep]
        o = np.argsort(new_rows, kind="stable")
        key = name if name not in attrs else f"kineto_{name}"
        attrs[key] = AttrColumn(col.kind, new_rows[o], [vals[i] for i in o.tolist()])
    if n_d:
        lr = np.arange(n_e, n_e + n_d, dtype=np.int64)
        has_l = dev_launch >= 0
        offs = np.where(has_l, k.start[np.maximum(dev_launch, 0)] - start[dev_et_row], math.nan)
        attrs["launch_offset_us"] = AttrColumn("double_val", lr[has_l], offs[has_l].tolist())
        attrs["launch_api"] = AttrColumn(
            "string_val", lr[has_l], [k.strings[int(x)] for x in k.name[dev_launch[has_l]].tolist()])

    n_t = n_e + n_d
    in_ptr = np.concatenate([et.in_ptr, np.full(n_d, et.in_ptr[-1], np.int64)])
    out_ptr = np.concatenate([et.out_ptr, np.full(n_d, et.out_ptr[-1], np.int64)])
    assert len(in_ptr) == n_t + 1
    return RankGraph(
        et.rank, strings, cols, dep_ptr, dep_id, dep_kind, attrs, et.tensors,
        in_ptr, et.in_tensor, out_ptr, et.out_tensor, dict(et.meta),
    )


def link_et_kineto(et: Trace, kineto: Trace) -> tuple[Trace, LinkReport]:
    """Link an ET trace with a Kineto trace of the same run (see the module docstring).

    Ranks are paired by number (a single rank on each side is paired whatever its number);
    an ET rank with no Kineto rank is kept unlinked.
    """
    t0 = time.perf_counter()
    strings = StringTable(et.strings[i] for i in range(len(et.strings)))
    meta = TraceMeta(
        world_size=max(et.meta.world_size, kineto.meta.world_size),
        process_groups=dict(et.meta.process_groups),
        device_properties=list(kineto.meta.device_properties or et.meta.device_properties),
        source="pytorch_et+kineto",
        extra={**kineto.meta.extra, **et.meta.extra},
    )
    report = LinkReport()
    warnings: list[str] = []
    for grp in kineto.meta.process_groups.values():
        try:
            meta.add_group(grp)
        except ValueError as e:
            warnings.append(f"Kineto process group ignored: {e}")
    pairs: dict[int, int | None] = {}
    if len(et.graphs) == 1 and len(kineto.graphs) == 1:
        pairs[et.ranks[0]] = kineto.ranks[0]
    else:
        for r in et.ranks:
            pairs[r] = r if r in kineto.graphs else None
    graphs: dict[int, RankGraph] = {}
    methods = set()
    for r, kr in pairs.items():
        eg = et.graphs[r]
        if kr is None:
            warnings.append(f"rank {r}: no Kineto trace, left unlinked")
            graphs[r] = RankGraph(eg.rank, strings, dict(eg.columns), eg.dep_ptr, eg.dep_id, eg.dep_kind,
                                  dict(eg.attrs), eg.tensors, eg.in_ptr, eg.in_tensor, eg.out_ptr,
                                  eg.out_tensor, dict(eg.meta))
            report.et_host_ops += len(eg)
            continue
        g, stats = _link_rank(_only_kineto_steps(eg, kineto.graphs[kr]), kineto.graphs[kr], strings)
        # what the Kineto side measured (steps, [memory] events, launch latency, …) stays with
        # the rank: the linked graph keeps Kineto's time base
        for key, value in kineto.graphs[kr].meta.items():
            g.meta.setdefault(key, value)
        g.meta["link"] = stats
        graphs[r] = g
        report.per_rank[r] = stats
        methods.add(stats["method"])
        for key in ("et_host_ops", "host_ops_matched", "kineto_host_ops", "anchors", "device_ops_total",
                    "device_ops_in_window", "device_ops_attached"):
            setattr(report, key, getattr(report, key) + stats[key])
        warnings.extend(f"rank {r}: {w}" for w in stats["warnings"])
    report.method = methods.pop() if len(methods) == 1 else ("mixed" if methods else "none")
    report.warnings = warnings
    report.seconds = time.perf_counter() - t0
    meta.extra["link"] = report.to_dict()
    return Trace(meta, graphs, strings), report


def read_linked(
    et_path: str | Path | list[Path], kineto_path: str | Path | list[Path], steps: Any = None
) -> tuple[Trace, LinkReport]:
    """Read an ET file (or rank files / directory) and a Kineto trace and link them.

    ``steps`` is passed to the Kineto reader. ``LinkReport.seconds`` covers only the linking.
    """
    from ettools.converters.kineto import read_kineto
    from ettools.converters.pytorch_et import read_pytorch_et

    et = read_pytorch_et(et_path)
    kineto = read_kineto(kineto_path, steps=steps) if steps is not None else read_kineto(kineto_path)
    return link_et_kineto(et, kineto)
