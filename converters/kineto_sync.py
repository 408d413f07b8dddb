"""Synchronization edges and launch facts of a Kineto rank (used by :mod:`ettools.converters.kineto`).

Launch order is CUPTI's ``correlation`` id (one global counter per process), so "the last op launched
on stream S before call C" is a binary search among S's ops sorted by correlation. A recorded CUDA
event stands for the last op launched on its stream before the ``cudaEventRecord`` call.

Exact waits come from ``cuda_sync`` events (newer PyTorch): ``Stream Wait Event``, ``Event Sync``,
``Stream Sync``, ``Context Sync``; and from ``cudaDeviceSynchronize`` (waits for every stream). Older
traces name no stream or event: ``cudaStreamSynchronize``/``cudaEventSynchronize``/
``cudaStreamWaitEvent`` are then paired with the same thread's latest ``cudaEventRecord`` and
launches, and marked SYNC_GUESSED; a guess the measured times contradict (the waiter finished before
its target) is dropped and counted.

Launch facts (``replay-fidelity.md``): the unblocked launch latency (launch → start of ops launched
onto an idle stream), the gap between back-to-back ops of a stream, and launches blocked by a full
launch queue (a long launch call made while about as many ops were outstanding as ever in the trace).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.converters.kineto_columns import percentile, unique
from ettools.converters.kineto_events import RUNTIME, UNSEEN_LAUNCH, distinct, median, member
from ettools.graph import EdgeKind

(OTHER, LAUNCH, DEV_SYNC, STREAM_SYNC, EVENT_SYNC, STREAM_WAIT, EVENT_RECORD, EVENT_QUERY, BLOCKING,
 ASYNC_COPY) = range(10)
TOL_US = 1.0  # clock granularity of integer-µs traces
_WAITS = np.zeros(10, bool)  # kinds that wait without a cuda_sync event saying on what
_WAITS[[DEV_SYNC, STREAM_SYNC, EVENT_SYNC, STREAM_WAIT]] = True
# Kernel launch latency onto an idle GPU is 2–20 µs on CUDA and ROCm (vendor launch-overhead
# figures; 6–33 µs medians in the real traces of ../shared/traces). A median idle-stream launch
# delay above MAX_LAUNCH_LATENCY_US is not a latency but a hold; DEFAULT_LAUNCH_LATENCY_US stands
# in when a trace has no unheld launch to measure.
MAX_LAUNCH_LATENCY_US = 1000.0
DEFAULT_LAUNCH_LATENCY_US = 10.0


def runtime_kind(name: str) -> int:
    """What a CUDA/HIP runtime or driver call does, for synchronization purposes."""
    s = name.lower()
    for p in ("cuda", "hip", "cu"):
        if s.startswith(p):
            s = s[len(p):]
            break
    for suf in ("_v2", "_ptsz", "_ptds", "_spt"):
        if s.endswith(suf):
            s = s[: -len(suf)]
    if s in ("devicesynchronize", "ctxsynchronize"):
        return DEV_SYNC
    if s == "streamsynchronize":
        return STREAM_SYNC
    if s == "eventsynchronize":
        return EVENT_SYNC
    if s == "streamwaitevent":
        return STREAM_WAIT
    if s.startswith("eventrecord"):
        return EVENT_RECORD
    if s == "eventquery":
        return EVENT_QUERY
    if s.startswith(("memcpy", "memset")):
        return ASYNC_COPY if "async" in s else BLOCKING
    if "launch" in s:
        return LAUNCH
    return OTHER


class _ByCorr:
    """Rows grouped by a key, each group sorted by correlation: last-before / first-after queries."""

    def __init__(self, keys: np.ndarray, corr: np.ndarray, rows: np.ndarray) -> None:
        o = np.lexsort((corr, keys))
        self.keys, self.corr, self.rows = keys[o], corr[o], rows[o]
        uk, first = np.unique(self.keys, return_index=True)
        last = np.append(first[1:], len(self.keys))
        self.span = {int(k): (int(a), int(b)) for k, a, b in zip(uk.tolist(), first.tolist(), last.tolist())}

    def last_before(self, key: int, c: int) -> int:
        """Row of the group's last entry with correlation < c (-1 if none)."""
        a, b = self.span.get(key, (0, 0))
        k = a + int(np.searchsorted(self.corr[a:b], c)) - 1
        return int(self.rows[k]) if k >= a else -1

    def first_after(self, key: int, c: int) -> int:
        """Row of the group's first entry with correlation > c (-1 if none)."""
        a, b = self.span.get(key, (0, 0))
        k = a + int(np.searchsorted(self.corr[a:b], c, side="right"))
        return int(self.rows[k]) if k < b else -1

    def groups(self) -> list[int]:
        """Keys present."""
        return list(self.span)


def sync_edges(r: Any, sync_args: list[dict[str, Any]]) -> None:
    """Add SYNC / SYNC_GUESSED edges to rank ``r`` and mark blocking calls."""
    rt = np.flatnonzero(r.cls == RUNTIME)
    ids = r.name_id[rt]
    kind_of = np.zeros(int(ids.max()) + 1 if len(ids) else 0, np.int8)  # runtime_kind per distinct name
    used = distinct(ids)
    kind_of[used] = [runtime_kind(r.strings[i]) for i in used.tolist()]
    kind = kind_of[ids]
    r.rt_kind = np.full(r.n, -1, np.int8)
    r.rt_kind[rt] = kind
    dev = np.flatnonzero(r.is_dev)
    launched = dev[r.launcher[dev] >= 0]
    rec = rt[kind == EVENT_RECORD]
    waits = _WAITS[kind]
    if sync_args or waits.any():
        streams = _ByCorr(r.res[dev].astype(np.int64), r.corr[dev], dev)
        by_thread = _ByCorr(r.res[r.launcher[launched]].astype(np.int64), r.corr[launched], launched)
        records = _ByCorr(r.res[rec].astype(np.int64), r.corr[rec], rec)
    else:  # nothing waits: no launch-order lookups (the loops below do not run)
        streams = by_thread = records = None  # type: ignore[assignment]
    corr_row = dict(zip(r.corr[rt].tolist(), rt.tolist())) if sync_args else {}
    dev_streams: dict[Any, list[int]] = {}
    for (p, _t), rid in r.stream_key.items():
        dev_streams.setdefault(p, []).append(rid)

    exact_dst: list[int] = []
    exact_src: list[int] = []
    guess_dst: list[int] = []
    guess_src: list[int] = []
    stats = {"contradicting": 0, "rejected": 0, "unresolved": 0}

    def exact(d: int, s: int, host: bool) -> None:
        if d < 0 or s < 0 or d == s:
            stats["unresolved"] += 1
            return
        limit = r.end[d] if host else r.start[d]
        if r.end[s] > limit + TOL_US:
            stats["contradicting"] += 1
        exact_dst.append(d)
        exact_src.append(s)

    def guess(d: int, s: int, host: bool) -> None:
        if d < 0 or s < 0 or d == s:
            stats["unresolved"] += 1
            return
        limit = r.end[d] if host else r.start[d]
        if r.end[s] > limit + TOL_US:
            stats["rejected"] += 1
            return
        guess_dst.append(d)
        guess_src.append(s)

    handled: set[int] = set()
    for a in sync_args:
        c = a.get("correlation")
        call = corr_row.get(c, -1) if isinstance(c, int) else -1
        if call < 0:
            continue  # its runtime call is outside the kept steps
        handled.add(call)
        sk = a.get("cuda_sync_kind") or ""
        devid = a.get("device", 0)
        if sk == "Stream Wait Event":
            tgt_stream = r.stream_key.get((devid, a.get("wait_on_stream")), -1)
            rec_corr = a.get("wait_on_cuda_event_record_corr_id", -1)
            wait_stream = r.stream_key.get((devid, a.get("stream")), -1)
            if tgt_stream < 0 or wait_stream < 0 or not isinstance(rec_corr, int) or rec_corr < 0:
                stats["unresolved"] += 1
                continue
            exact(streams.first_after(wait_stream, c), streams.last_before(tgt_stream, rec_corr), False)
        elif sk == "Event Sync":
            if r.rt_kind[call] == EVENT_QUERY:
                continue  # a query does not wait
            tgt_stream = r.stream_key.get((devid, a.get("wait_on_stream")), -1)
            rec_corr = a.get("wait_on_cuda_event_record_corr_id", -1)
            if tgt_stream < 0 or not isinstance(rec_corr, int) or rec_corr < 0:
                stats["unresolved"] += 1
                continue
            exact(call, streams.last_before(tgt_stream, rec_corr), True)
        elif sk == "Stream Sync":
            s = r.stream_key.get((devid, a.get("stream")), -1)
            exact(call, streams.last_before(s, c), True) if s >= 0 else None
        elif sk == "Context Sync":
            for s in dev_streams.get(devid, streams.groups()):
                t = streams.last_before(s, c)
                if t >= 0:
                    exact(call, t, True)

    # calls without a cuda_sync event
    for call, k in zip(rt[waits].tolist(), kind[waits].tolist()):
        if call in handled:
            continue
        c = int(r.corr[call])
        thread = int(r.res[call])
        if k == DEV_SYNC:
            for s in streams.groups():
                t = streams.last_before(s, c)
                if t >= 0:
                    exact(call, t, True)
        elif k == STREAM_SYNC:
            last = by_thread.last_before(thread, c)
            if last >= 0:
                guess(call, streams.last_before(int(r.res[last]), c), True)
        elif k in (EVENT_SYNC, STREAM_WAIT):
            rec_row = records.last_before(thread, c)
            if rec_row < 0 and k == STREAM_WAIT and len(rec) == 0:
                # the trace records no cudaEventRecord (older Kineto): see _unrecorded_stream_wait
                d, t = _unrecorded_stream_wait(r, c, thread, streams, by_thread, dev_streams)
                guess(d, t, False) if d >= 0 else stats.__setitem__("unresolved", stats["unresolved"] + 1)
                continue
            if rec_row < 0:
                stats["unresolved"] += 1
                continue
            rc = int(r.corr[rec_row])
            last = by_thread.last_before(thread, rc)
            if last < 0:
                stats["unresolved"] += 1
                continue
            tgt = streams.last_before(int(r.res[last]), rc)
            if k == EVENT_SYNC:
                guess(call, tgt, True)
            else:
                nxt = by_thread.first_after(thread, c)
                if nxt >= 0 and r.res[nxt] != r.res[last]:
                    guess(nxt, tgt, False)

    _add_unique(r, exact_dst, exact_src, EdgeKind.SYNC)
    _add_unique(r, guess_dst, guess_src, EdgeKind.SYNC_GUESSED)
    # synchronous copies: the call returns when its copy is done (a copy from pageable memory too)
    calls = r.launcher[launched]
    k = r.rt_kind[calls]
    blocks = k == BLOCKING
    copies = np.flatnonzero(k == ASYNC_COPY)
    if len(copies):
        names = distinct(r.name_id[launched[copies]])
        pageable = [i for i in names.tolist() if "Pageable" in r.strings[i]]
        blocks[copies] = member(r.name_id[launched[copies]], pageable)
    blocking = unique(calls[blocks]).astype(np.int64)
    r.set_attr("blocking", "bool_val", blocking, [True] * len(blocking))
    r.blocking = blocking
    m = r.meta
    m["sync_edges"] = len(set(zip(exact_dst, exact_src)))
    m["sync_guessed"] = len(set(zip(guess_dst, guess_src)))
    m["sync_rejected"] = stats["rejected"]
    m["sync_contradicting"] = stats["contradicting"]
    m["sync_unresolved"] = stats["unresolved"]


def _unrecorded_stream_wait(r: Any, c: int, thread: int, streams: _ByCorr, by_thread: _ByCorr,
                            dev_streams: dict[Any, list[int]]) -> tuple[int, int]:
    """``(waiter, target)`` rows of a ``cudaStreamWaitEvent`` whose event the trace does not name.

    The waiter is the next op the thread launches (PyTorch waits, then launches onto the waiting
    stream). The event was recorded on another stream of the device before the call, so it marks at
    most that stream's last op launched before the call; of those, the one that ended last while
    still ending before the waiter started (within the clock's granularity) is the guess: a waiter
    held back by an unrecorded wait (e.g. compute waiting for an NCCL kernel) starts right after it.
    """
    d = by_thread.first_after(thread, c)
    if d < 0:
        return -1, -1
    s_d = int(r.res[d])
    same_dev = next((v for v in dev_streams.values() if s_d in v), streams.groups())
    best, best_end = -1, -np.inf
    for s in same_dev:
        if s == s_d:
            continue
        t = streams.last_before(int(s), c)
        if t >= 0 and best_end < r.end[t] <= r.start[d] + TOL_US:
            best, best_end = t, float(r.end[t])
    return d, best


def _add_unique(r: Any, dst: list[int], src: list[int], kind: int) -> None:
    if not dst:
        return
    d, s = np.array(dst, np.int64), np.array(src, np.int64)
    m = int(s.max()) + 1
    key = unique(d * m + s)  # the distinct (dst, src) pairs, sorted by dst then src
    r.add_edges(key // m, key % m, kind)


def launch_facts(r: Any) -> None:
    """Unblocked launch latency, back-to-back stream gap, launches blocked by a full queue; then
    device ops held back by waits the trace does not record (:func:`device_holds`)."""
    _launch_facts(r)
    device_holds(r)


def _launch_facts(r: Any) -> None:
    m = r.meta
    dn = r.dev_sorted  # device rows grouped by stream, start order inside
    m["launch_latency_us"] = None
    m["launch_latency_after_call_us"] = None
    m["stream_gap_us"] = None
    m["launch_queue_depth"] = None
    m["launch_blocked"] = 0
    if len(dn) == 0:
        return
    same = np.zeros(len(dn), bool)
    same[1:] = r.res[dn[1:]] == r.res[dn[:-1]]
    prev = np.full(len(dn), -1, np.int64)
    prev[1:] = np.where(same[1:], dn[:-1], -1)
    call = r.launcher[dn]
    has = call >= 0
    idle = has & ((prev < 0) | (r.end[np.maximum(prev, 0)] <= r.start[np.maximum(call, 0)]))
    lat = r.start[dn] - r.start[np.maximum(call, 0)]
    ok = idle & (lat >= 0)
    # a stand-in launch (an op whose launch is outside the trace) ends where its op starts by
    # construction: it says nothing about the launch latency
    standin = r.strings.lookup(UNSEEN_LAUNCH)
    if standin >= 0:
        ok &= r.name_id[np.maximum(call, 0)] != standin
    # a launch onto an idle stream starts within tens of µs on every GPU runtime: delays beyond
    # MAX_LAUNCH_LATENCY_US were held by something the trace does not show (work before the trace
    # window, another process), and device_holds keeps them as measured holds instead
    ok &= lat <= MAX_LAUNCH_LATENCY_US
    if ok.any():
        m["launch_latency_us"] = median(lat[ok])
        m["launch_latency_after_call_us"] = median((r.start[dn] - r.end[np.maximum(call, 0)])[ok])
        m["launch_latency_source"] = "measured"
    elif (has & idle).any():  # every launch onto an idle stream was held: a typical latency
        m["launch_latency_us"] = DEFAULT_LAUNCH_LATENCY_US
        m["launch_latency_after_call_us"] = DEFAULT_LAUNCH_LATENCY_US
        m["launch_latency_source"] = "default (every launch onto an idle stream was held)"
    L = m["launch_latency_us"] or 0.0
    # back-to-back: the op was queued (launched + latency) before its predecessor ended
    b2b = has & (prev >= 0)
    b2b &= r.start[np.maximum(call, 0)] + L < r.end[np.maximum(prev, 0)]
    gaps = (r.start[dn] - r.end[np.maximum(prev, 0)])[b2b]
    gaps = gaps[gaps >= 0]
    if len(gaps):
        # the cluster near the smallest gaps: larger ones hide waits the trace does not show
        low = percentile(gaps, 10)
        m["stream_gap_us"] = median(gaps[gaps <= max(4.0 * low, low + 1.0)])
    # launch queue: ops launched but not started when each launch call began
    launched = np.flatnonzero(r.launcher >= 0)
    calls = distinct(r.launcher[launched])  # np.unique of row numbers, by a bincount
    if len(calls) < 2:
        return
    lc = np.sort(r.corr[launched])
    ls = np.sort(r.start[launched])
    outstanding = np.searchsorted(lc, r.corr[calls]) - np.searchsorted(ls, r.start[calls], side="right")
    peak = int(outstanding.max())
    cdur = r.dur[calls]
    slow = cdur > max(20.0, 5.0 * median(cdur))
    blocked = slow & (outstanding >= 0.9 * peak) & (peak >= 64)
    if blocked.any():
        rows = calls[blocked]
        m["launch_queue_depth"] = int(median(outstanding[blocked]))
        m["launch_blocked"] = int(len(rows))
        r.set_attr("launch_blocked", "bool_val", rows, [True] * len(rows))


def device_holds(r: Any) -> None:
    """Device ops held back by something the trace does not record (run after :func:`launch_facts`).

    An op is *ready* at the latest of: its launch call's start plus the unblocked launch latency
    ``L``, the end of its stream predecessor, and the end of every op it is known to wait for (SYNC
    and SYNC_GUESSED edges). An op that started more than ``L`` after it was ready was held:

    * if an op of another stream ended within ``L`` before it started (and after it was ready), it
      waited for that op — an event wait whose event the trace does not name (older traces record
      ``cudaStreamWaitEvent`` without its event, or no call at all for waits inside a CUDA graph).
      A ``SYNC_GUESSED`` edge makes the replay wait too, so a what-if that moves the target moves
      the waiter (and any host call blocked on the waiter: a pageable copy, a stream sync).
    * otherwise nothing in the trace explains the hold (work inside a CUDA graph that the profiler
      does not show, a wait on another process): the op gets ``device_hold_us`` (float_val), the
      measured hold, which the replay keeps as a measured delay before the op
      (:func:`ettools.replayable.to_replayable`).

    Counts go to ``meta["device_holds_waits"]`` and ``meta["device_holds_unexplained"]`` (with
    ``meta["device_holds_unexplained_us"]``, their total).
    """
    m = r.meta
    m["device_holds_waits"] = 0
    m["device_holds_unexplained"] = 0
    m["device_holds_unexplained_us"] = 0.0
    dn = r.dev_sorted
    lat = m.get("launch_latency_us")
    if len(dn) < 2 or lat is None:
        return
    L = max(float(lat), TOL_US)
    same = np.zeros(len(dn), bool)
    same[1:] = r.res[dn[1:]] == r.res[dn[:-1]]
    ready = np.full(r.n, -np.inf)
    # the replay runs back-to-back ops of a stream the stream's gap apart: count it as not held
    gap = float(m.get("stream_gap_us") or 0.0)
    ready[dn[1:][same[1:]]] = r.end[dn[:-1][same[1:]]] + gap
    call = r.launcher[dn]
    has = call >= 0
    ready[dn[has]] = np.maximum(ready[dn[has]], r.start[call[has]] + L)
    for dst, src, kind in r.edges:
        if kind in (EdgeKind.SYNC, EdgeKind.SYNC_GUESSED):
            d = r.is_dev[dst]
            np.maximum.at(ready, dst[d], r.end[src[d]])
    hold = r.start - ready
    held = dn[np.isfinite(hold[dn]) & (hold[dn] > L)]
    if not len(held):
        return
    # latest end of an op of another stream, at most TOL after the held op started
    best_end = np.full(len(held), -np.inf)
    best_row = np.full(len(held), -1, np.int64)
    for sid in unique(r.res[dn]).tolist():
        rows = dn[r.res[dn] == sid]
        rows = rows[np.argsort(r.end[rows], kind="stable")]
        ends = r.end[rows]
        k = np.searchsorted(ends, r.start[held] + TOL_US, side="right") - 1
        ok = (k >= 0) & (r.res[held] != sid)
        e = np.where(ok, ends[np.maximum(k, 0)], -np.inf)
        better = e > best_end
        best_end[better] = e[better]
        best_row[better] = rows[np.maximum(k, 0)][better]
    waited = (best_row >= 0) & (best_end >= r.start[held] - L) & (best_end > ready[held])
    if waited.any():
        _add_unique(r, held[waited].tolist(), best_row[waited].tolist(), EdgeKind.SYNC_GUESSED)
    rest = held[~waited]
    if len(rest):
        r.set_attr("device_hold_us", "float_val", rest, hold[rest].tolist())
    m["device_holds_waits"] = int(waited.sum())
    m["device_holds_unexplained"] = int(len(rest))
    m["device_holds_unexplained_us"] = float(hold[rest].sum())
    m["sync_guessed"] = m.get("sync_guessed", 0) + int(waited.sum())
