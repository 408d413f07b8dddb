"""Kineto events → columns: the fast first stage of :mod:`ettools.converters.kineto`.

Everything here works on whole columns: one ``itemgetter`` pass pulls the fields of every complete
(``ph: X``) event, categories are classified once per distinct string, and the steps chosen by
``--steps`` select events with numpy masks. Per-event Python work is limited to a handful of
C-level ``map``/comprehension passes, so a 100K-event trace costs a fraction of its JSON parse.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.replayable import prev_ge

# Event classes (the graph keeps classes HOST_OP..MEMSET; SYNC_EV feeds SYNC edges; the rest are skipped).
CPU_OP, ANNOT, PYFN, RUNTIME, KERNEL, MEMCPY, MEMSET, SYNC_EV, SKIP, UNKNOWN = range(10)
HOST_CLASSES = (CPU_OP, ANNOT, PYFN, RUNTIME)
DEVICE_CLASSES = (KERNEL, MEMCPY, MEMSET)

CATEGORY_CLASS: dict[str, int] = {
    "cpu_op": CPU_OP,
    # the 2021 Kineto spellings (PyTorch 1.8/1.9): Operator, Runtime, Kernel, Memcpy, Memset
    "operator": CPU_OP,
    "runtime": RUNTIME,
    "driver": RUNTIME,
    "memcpy": MEMCPY,
    "memset": MEMSET,
    "user_annotation": ANNOT,
    "python_function": PYFN,
    "cuda_runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "xpu_runtime": RUNTIME,
    "mtia_runtime": RUNTIME,
    "privateuse1_runtime": RUNTIME,
    "privateuse1_driver": RUNTIME,
    "hip_runtime": RUNTIME,
    "xpu_driver": RUNTIME,
    "mlu_runtime": RUNTIME,
    "glow_runtime": RUNTIME,
    "kernel": KERNEL,
    "hpu_op": KERNEL,  # Gaudi device ops
    "mtia_ccp_events": KERNEL,  # MTIA device ops
    "gpu_memcpy": MEMCPY,
    "mlu_memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "mlu_memset": MEMSET,
    "cuda_sync": SYNC_EV,
    # Known and deliberately not nodes: the profiler's own span, device-side copies of host
    # annotations (they only group device ops), profiler overhead, counters. Range-profiler events
    # are counted and warned about (RANGE_CATEGORIES).
    "trace": SKIP,
    "gpu_user_annotation": SKIP,
    "mlu_user_annotation": SKIP,
    "overhead": SKIP,
    "cuda_profiler_range": SKIP,
    "mlu_profiler_range": SKIP,
    "cpu_instant_event": SKIP,
    "gpu_pm_counter": SKIP,
    "mtia_counters": SKIP,
    "external_correlation": SKIP,
}
# CUPTI range-profiler events: hardware counters per kernel or per user range, their times an even
# split of the profiling span (Kineto writes no measured time for them, and the range profiler runs
# only without kernel tracing): there is no device time to replay, so they are skipped with a warning.
RANGE_CATEGORIES = frozenset(("cuda_profiler_range", "mlu_profiler_range"))

_OTHER_PH = frozenset(("s", "f", "i"))  # flow ends (fwdbwd) and instants ([memory])
_X_FIELDS = ("ts", "dur", "name", "tid", "cat", "args")  # pid: read for device events only
_XGET = itemgetter(*_X_FIELDS)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def classify(cat: Any) -> int:
    """Event class of a Kineto category string."""
    if not isinstance(cat, str):
        return UNKNOWN
    return CATEGORY_CLASS.get(cat.lower(), UNKNOWN)


def parse_steps(steps: str | None) -> set[int] | None:
    """``"2"``, ``"2-4"``, ``"2,5"`` (or a mix) → set of ProfilerStep numbers; None → all."""
    if steps is None or str(steps).strip() in ("", "all"):
        return None
    out: set[int] = set()
    for part in str(steps).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            if b < a:
                raise ValueError(f"bad step range {part!r}: end before start")
            out.update(range(a, b + 1))
        elif part.isdigit():
            out.add(int(part))
        else:
            raise ValueError(f"bad steps {steps!r}: expected N, N-M or a comma list of those")
    return out


def _index_of(ev: list[Any], obj: Any) -> int:
    for i, e in enumerate(ev):
        if e is obj:
            return i
    return -1


def _pick(seq: Any, idx: np.ndarray) -> list[Any]:
    """``[seq[i] for i in idx]`` at C speed."""
    if len(idx) == 0:
        return []
    if len(idx) == 1:
        return [seq[int(idx[0])]]
    return list(itemgetter(*idx.tolist())(seq))


@dataclass
class Events:
    """The complete events of one file as columns (row = position among the ``X`` events)."""

    path: Path
    n: int
    ts: np.ndarray
    dur: np.ndarray
    name: tuple[Any, ...]
    tid: tuple[Any, ...]
    events: list[Any]  # the X events themselves (for rarely needed fields such as pid)
    cat: tuple[Any, ...]
    args: tuple[Any, ...]
    cls: np.ndarray  # int8 event class
    name_code: np.ndarray  # int32 index into ``names``
    names: list[Any]
    tid_code: np.ndarray  # int64 index into ``tids``
    tids: list[Any]
    flows: list[dict[str, Any]] = field(default_factory=list)  # fwdbwd flow events
    memory: list[dict[str, Any]] = field(default_factory=list)  # "[memory]" instant events
    skipped: dict[str, int] = field(default_factory=dict)
    negative_dur: int = 0

    def pick(self, column: str, idx: np.ndarray) -> list[Any]:
        """Values of a tuple column at rows ``idx``."""
        return _pick(getattr(self, column), idx)

    def pids(self, idx: np.ndarray) -> list[Any]:
        """``pid`` of the events at rows ``idx`` (0 when absent)."""
        return [e.get("pid", 0) for e in _pick(self.events, idx)]


def extract(path: Path, ev: list[Any]) -> Events:
    """Columns of every complete event of ``ev``; bad events raise :class:`TraceError`."""
    try:
        xs = [e for e in ev if e["ph"] == "X"]
        # fwdbwd flow ends and [memory] instants (the many ac2g flows are not needed: correlation
        # ids join launches to kernels)
        others = [e for e in ev if e["ph"] in _OTHER_PH and (e.get("cat") == "fwdbwd" or e.get("name") == "[memory]")]
    except (KeyError, TypeError):
        for i, e in enumerate(ev):
            if not isinstance(e, dict):
                raise TraceError(path, f"traceEvents[{i}] is not an object") from None
            if "ph" not in e:
                raise TraceError(path, f"traceEvents[{i}] has no 'ph' field") from None
        raise
    try:
        rows = list(map(_XGET, xs))
    except KeyError:
        rows = _fields_slow(path, ev, xs)
    n = len(rows)
    if n:
        ts, dur, name, tid, cat, args = zip(*rows)
    else:
        ts = dur = name = tid = cat = args = ()
    ts_a = _floats(path, ev, xs, ts, "ts")
    dur_a = _floats(path, ev, xs, dur, "dur")
    neg = dur_a < 0
    negative = int(neg.sum())
    if negative:
        dur_a[neg] = 0.0
    cat_ids = {c: i for i, c in enumerate(dict.fromkeys(cat))}
    cls_of = np.array([classify(c) for c in cat_ids], np.int8)
    cls = cls_of[np.fromiter(map(cat_ids.__getitem__, cat), np.int32, n)] if n else np.zeros(0, np.int8)
    flows = [e for e in others if e.get("cat") == "fwdbwd"]
    memory = [e for e in others if e.get("name") == "[memory]" and e["ph"] == "i"]
    try:
        name_c, names = _codes(name, np.int32)
        tid_c, tids = _codes(tid, np.int64)
    except TypeError:  # an unhashable name/tid (a list): use its text
        name_c, names = _codes(tuple(map(_text, name)), np.int32)
        tid_c, tids = _codes(tuple(map(_text, tid)), np.int64)
    out = Events(path, n, ts_a, dur_a, name, tid, xs, cat, args, cls, name_c, names, tid_c, tids,
                 flows, memory, {}, negative)
    skip = (cls == SKIP) | (cls == UNKNOWN)
    if skip.any():
        for c, k in zip(*np.unique(np.asarray([str(cat[i]) for i in np.flatnonzero(skip)]), return_counts=True)):
            out.skipped[str(c)] = int(k)
    return out


UNSEEN_LAUNCH = "launch outside the trace"  # name, thread and category of a stand-in launch
TOL_US = 1.0  # clock granularity of integer-µs traces
UNSEEN_LAUNCH_US = 1e-3  # a stand-in launch lasts 1 ns and ends where its op starts (a zero-length
# call would have no launch point of its own on its thread)


def unseen_launches(e: Events, dv: np.ndarray, orphan: np.ndarray) -> tuple[Events, np.ndarray, np.ndarray] | None:
    """Stand-in launches for device ops whose launch the trace does not hold (device-only traces,
    work launched before the profiling window) and that started on an idle stream.

    An op that started on an idle stream started when it was launched (plus the launch latency): the
    idle time before it was the host's, as host gaps are, and a replay must keep it. One 1 ns
    ``launch outside the trace`` call (class RUNTIME, its own thread) is added, ending where each
    such op starts; the op is launched by it. An op queued behind the previous op of its stream (it started
    within a few back-to-back gaps of that op's end) says nothing about its launch: it only follows
    stream order. ``dv``: device rows; ``orphan``: mask over ``dv`` of kept ops without a launcher.

    Returns (events with the new rows appended, new rows, positions in ``dv`` they launch) or None.
    """
    if not orphan.any():
        return None
    pid_c, _ = codes(e.pids(dv), np.int64)
    key = pid_c * (int(e.tid_code.max()) + 1) + e.tid_code[dv]
    o = np.lexsort((e.ts[dv], key))
    k, t0 = key[o], e.ts[dv][o]
    t1 = t0 + e.dur[dv][o]
    same = np.zeros(len(o), bool)
    same[1:] = k[1:] == k[:-1]
    # the latest end among the earlier ops of the same stream (a stream's ops may overlap in traces)
    seg = np.maximum.accumulate(np.where(~same, np.arange(len(o)), 0))
    prev_end = _prev_max_by_segment(t1, seg)
    gap = t0 - prev_end
    back = gap[np.isfinite(gap) & (gap >= 0)]
    typical = float(np.percentile(back, 25)) if len(back) else 0.0
    idle = ~np.isfinite(gap) | (gap > max(TOL_US, 2.0 * typical))
    pick = o[idle & orphan[o]]
    if not len(pick):
        return None
    pick.sort()
    rows = dv[pick]
    n, m = e.n, len(rows)
    new = np.arange(n, n + m)
    names = list(e.names)
    tids = list(e.tids)
    if UNSEEN_LAUNCH not in names:
        names.append(UNSEEN_LAUNCH)
    if UNSEEN_LAUNCH not in tids:
        tids.append(UNSEEN_LAUNCH)
    nm_code, tid_code = names.index(UNSEEN_LAUNCH), tids.index(UNSEEN_LAUNCH)
    ev = {"ph": "X", "cat": UNSEEN_LAUNCH, "name": UNSEEN_LAUNCH, "tid": UNSEEN_LAUNCH, "dur": UNSEEN_LAUNCH_US}
    out = Events(
        e.path, n + m, np.concatenate((e.ts, e.ts[rows] - UNSEEN_LAUNCH_US)),
        np.concatenate((e.dur, np.full(m, UNSEEN_LAUNCH_US))),
        e.name + (UNSEEN_LAUNCH,) * m, e.tid + (UNSEEN_LAUNCH,) * m, e.events + [ev] * m,
        e.cat + (UNSEEN_LAUNCH,) * m, e.args + ({},) * m,
        np.concatenate((e.cls, np.full(m, RUNTIME, np.int8))),
        np.concatenate((e.name_code, np.full(m, nm_code, e.name_code.dtype))), names,
        np.concatenate((e.tid_code, np.full(m, tid_code, e.tid_code.dtype))), tids,
        e.flows, e.memory, e.skipped, e.negative_dur)
    return out, new, pick


def _prev_max_by_segment(t1: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """For each position, the max of ``t1`` over the earlier positions of its segment (-inf if none);
    ``seg`` is the segment's first position (segments are contiguous)."""
    out = np.full(len(t1), -np.inf)
    if len(t1) < 2:
        return out
    # a running max that restarts at each segment: offset each segment above all earlier ones
    span = float(np.nanmax(t1) - np.nanmin(t1)) + 1.0
    rank = np.cumsum(seg == np.arange(len(seg))) - 1
    lifted = (t1 - np.nanmin(t1)) + rank * span
    run = np.maximum.accumulate(lifted)
    out[1:] = run[:-1] - rank[1:] * span + np.nanmin(t1)
    out[seg == np.arange(len(seg))] = -np.inf
    return out


def _text(v: Any) -> Any:
    return v if isinstance(v, (str, int, float)) else str(v)


def codes(values: tuple[Any, ...] | list[Any], dtype: Any) -> tuple[np.ndarray, list[Any]]:
    """Dense codes of ``values`` (first-seen order) and the distinct values (unhashables as text)."""
    try:
        return _codes(values, dtype)
    except TypeError:
        return _codes(tuple(map(_text, values)), dtype)


def _codes(values: tuple[Any, ...] | list[Any], dtype: Any) -> tuple[np.ndarray, list[Any]]:
    """Dense codes of ``values`` (first-seen order) and the distinct values."""
    index = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return np.fromiter(map(index.__getitem__, values), dtype, len(values)), list(index)


def _fields_slow(path: Path, ev: list[Any], xs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Field extraction that names the first event missing a required field."""
    rows = []
    for e in xs:
        for key in ("ts", "dur", "name"):
            if key not in e:
                raise TraceError(path, f"traceEvents[{_index_of(ev, e)}] (ph X) has no {key!r} field")
        args = e.get("args")
        rows.append((e["ts"], e["dur"], e["name"], e.get("tid", 0), e.get("cat", ""),
                     args if isinstance(args, dict) else {}))
    return rows


def _floats(path: Path, ev: list[Any], xs: list[Any], values: tuple[Any, ...], key: str) -> np.ndarray:
    try:
        arr = np.array(values, np.float64)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 1 or np.isnan(arr).any():
        for e, v in zip(xs, values):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
                raise TraceError(path, f"traceEvents[{_index_of(ev, e)}] has a non-numeric {key!r}: {v!r}")
        raise TraceError(path, f"bad {key!r} values")
    return arr


@dataclass
class Step:
    """One ``ProfilerStep#N`` annotation."""

    number: int
    name: str
    start: float
    end: float


def find_steps(e: Events) -> list[Step]:
    """Every ``ProfilerStep#N`` host annotation, in time order (a ``user_annotation``, or an
    ``Operator`` in the 2021 format, which had no annotation category)."""
    codes = [k for k, nm in enumerate(e.names) if isinstance(nm, str) and _STEP.match(nm)]
    if not codes:
        return []
    idx = np.flatnonzero(np.isin(e.name_code, codes) & ((e.cls == ANNOT) | (e.cls == CPU_OP)))
    steps = []
    for i in idx.tolist():
        nm = e.names[int(e.name_code[i])]
        steps.append(Step(int(_STEP.match(nm).group(1)), nm, float(e.ts[i]), float(e.ts[i] + e.dur[i])))
    steps.sort(key=lambda s: s.start)
    return steps


def annotation_steps(e: Events, launch_rows: np.ndarray) -> list[Step]:
    """Steps marked by user annotations, for a trace without ``ProfilerStep#N``.

    Serving frameworks mark each model execution with a ``user_annotation`` (vLLM's and SGLang's
    ``execute_…``) instead of the profiler's step. A step annotation is a top-level annotation (not
    inside another host event of its thread) on the thread that launches most device work; they are
    steps when together they hold at least half of that thread's launches (an annotation around the
    optimizer alone marks a part of the work, not an iteration). Numbered 0.. in time order.
    """
    ann = np.flatnonzero(e.cls == ANNOT)
    if not len(ann) or not len(launch_rows):
        return []
    # the launching thread: the one with most launch calls
    ltid = e.tid_code[launch_rows]
    main = int(np.bincount(ltid).argmax())
    ann = ann[e.tid_code[ann] == main]
    if not len(ann):
        return []
    host = np.flatnonzero(np.isin(e.cls, HOST_CLASSES) & (e.tid_code == main))
    host = host[np.lexsort((host, -e.dur[host], e.ts[host]))]
    end = e.ts[host] + e.dur[host]
    outer = prev_ge(end, end)  # inside an earlier-starting event that ends no earlier
    top_host = host[outer < 0]
    top = ann[np.isin(ann, top_host)]
    if not len(top):
        return []
    top = top[np.argsort(e.ts[top], kind="stable")]
    lts = np.sort(e.ts[launch_rows[ltid == main]])
    s0, s1 = e.ts[top], e.ts[top] + e.dur[top]
    inside = np.searchsorted(lts, s1, side="left") - np.searchsorted(lts, s0, side="left")
    if inside.sum() * 2 < len(lts):
        return []
    return [Step(k, str(e.names[int(e.name_code[i])]), float(e.ts[i]), float(e.ts[i] + e.dur[i]))
            for k, i in enumerate(top.tolist())]


def choose_steps(path: Path, steps: list[Step], wanted: set[int] | None) -> list[Step]:
    """Steps selected by ``wanted`` (None: all); an absent request raises :class:`TraceError`."""
    if wanted is None:
        return steps
    chosen = [s for s in steps if s.number in wanted]
    if not chosen:
        present = ", ".join(str(s.number) for s in steps) or "none"
        want = ", ".join(str(w) for w in sorted(wanted))
        raise TraceError(path, f"no ProfilerStep#{want} in the trace (steps present: {present})")
    return chosen
