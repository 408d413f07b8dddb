"""Kineto events → columns: the fast first stage of :mod:`ettools.converters.kineto`.

Everything here works on whole columns: one ``itemgetter`` pass pulls the fields of every complete
(``ph: X``) event, categories are classified once per distinct string, and the steps chosen by
``--steps`` select events with numpy masks. Per-event Python work is limited to a handful of
C-level ``map``/comprehension passes, so a 100K-event trace costs a fraction of its JSON parse.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import eq
from pathlib import Path
from typing import Any

import numpy as np

from ettools.converters.kineto_blocks import extract_blocks
from ettools.converters.kineto_columns import (  # F401: re-exported (kineto.py, kineto_sync and tests read them here)
    _PH,
    _PH_FLOW,
    _PH_INSTANT,
    _PH_KIND,
    _PH_X,
    _XGET,
    ABSENT,  # noqa: F401
    ANNOT,
    ARG_CLASSES,  # noqa: F401
    ARG_COLUMNS,
    BLOCK,  # noqa: F401
    CATEGORY_CLASS,  # noqa: F401
    CPU_OP,
    DEVICE_CLASSES,  # noqa: F401
    FLOW_KEYS,  # noqa: F401
    HOST_CLASSES,  # noqa: F401
    IS_DEVICE,  # noqa: F401
    IS_HOST,
    KERNEL,  # noqa: F401
    MEMCPY,  # noqa: F401
    MEMSET,  # noqa: F401
    PYFN,  # noqa: F401
    RANGE_CATEGORIES,  # noqa: F401
    RUNTIME,
    SKIP,  # noqa: F401
    SYNC_EV,  # noqa: F401
    UNKNOWN,  # noqa: F401
    Events,
    _count_skipped,
    _FirstSeen,
    _Irregular,
    _pick,
    arg_values,
    class_mask,  # noqa: F401
    classify,
    distinct,  # noqa: F401
    int_column,  # noqa: F401
    median,  # noqa: F401
    member,
    memory_rows,
    percentile,
    usable_flows,  # noqa: F401
)
from ettools.errors import TraceError

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


MAX_STEP_RANGE = 1 << 20  # steps in one --steps range: the selection is a set of step numbers


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
            if b - a >= MAX_STEP_RANGE:
                raise ValueError(f"bad step range {part!r}: more than {MAX_STEP_RANGE:,} steps")
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


def extract(path: Path, ev: list[Any] | Any) -> Events:
    """Columns of every complete event of ``ev``; bad events raise :class:`TraceError`.

    ``ev``: the ``traceEvents`` list, or its :class:`~ettools.json_chunks.ItemChunks` (parsed a
    slice at a time; released here once read). Events are read in blocks of
    :data:`BLOCK` (:mod:`ettools.converters.kineto_blocks`): every field of a block's events (and
    the args that :data:`ARG_COLUMNS` names) is read while they are still in the CPU cache, each
    with one C-level ``map`` — a pass over all the events per field would fetch every event from
    memory again. An irregular event (a missing field, a non-numeric time, an unhashable name) sends
    the file to the checked reader, which reads fields with their defaults or names the bad event
    (from the whole parsed list: the chunks hand it over; also when a slice does not parse,
    ``ChunkError``, a ValueError: the whole parse then names the error).
    """
    chunks = None if isinstance(ev, list) else ev
    try:
        out = _extract_blocks(path, ev)
    except (_Irregular, KeyError, TypeError, ValueError, OverflowError):
        if chunks is not None:
            ev = chunks.full()["traceEvents"]
        out = _extract_checked(path, ev)
    finally:
        if chunks is not None:
            chunks.close()  # the text is read: free it before the graph is built
    _check_times(path, ev, out)
    return out


def _extract_blocks(path: Path, ev: list[Any] | Any) -> Events:
    """The block reader (:func:`ettools.converters.kineto_blocks.extract_blocks`; a name of this
    module, so that a test can send every file to the checked reader)."""
    return extract_blocks(path, ev)


# Times become int64 nanoseconds downstream: a time at or past 2^63 ns (~292 years) from the trace's
# zero is no clock reading (a duration of 2^64, a timestamp of 1e30) and would wrap there.
MAX_TIME_US = 2.0**63 / 1e3


def _check_times(path: Path, ev: list[Any] | Any, e: Events) -> None:
    """Refuse (naming the first such event) a start or an end beyond :data:`MAX_TIME_US`."""
    if not e.n:
        return
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~((np.abs(e.ts) < MAX_TIME_US) & (e.ts + e.dur < MAX_TIME_US))
    if bad.any():
        i = int(np.argmax(bad))
        at = int(e.index[i]) if e.index is not None else _index_of(ev, e.events[i])
        raise TraceError(path, f"traceEvents[{at}] (ph X) has ts {e.ts[i]:.6g} µs, "
                         f"dur {e.dur[i]:.6g} µs: beyond 2^63 ns (~292 years), not a clock reading")


def _extract_checked(path: Path, ev: list[Any]) -> Events:
    """:func:`extract` event by event: defaults for missing optional fields, errors naming the event."""
    try:  # the one pass that reads every event: its phase, as a small code
        kind = np.fromiter(map(_PH_KIND.__getitem__, map(_PH, ev)), np.int8, len(ev))
    except (KeyError, TypeError):
        for i, e in enumerate(ev):
            if not isinstance(e, dict):
                raise TraceError(path, f"traceEvents[{i}] is not an object") from None
            if "ph" not in e:
                raise TraceError(path, f"traceEvents[{i}] has no 'ph' field") from None
            if not isinstance(e["ph"], str):
                raise TraceError(path, f"traceEvents[{i}] has a 'ph' that is {type(e['ph']).__name__}, "
                                 "not a string") from None
        raise
    xs = _pick(ev, np.flatnonzero(kind == _PH_X))
    n = len(xs)
    try:  # one pass over the event objects (each a cache miss), then a transpose of compact tuples
        rows = list(map(_XGET, xs))
    except KeyError:
        rows = _fields_slow(path, ev, xs)
    ts, dur, name, tid, cat, args = zip(*rows) if n else ((), (), (), (), (), ())
    del rows
    if not all(map(dict.__instancecheck__, args)):  # args that are not objects: no args
        args = [a if isinstance(a, dict) else {} for a in args]
    ts_a = _floats(path, ev, xs, ts, "ts")
    dur_a = _floats(path, ev, xs, dur, "dur")
    neg = dur_a < 0
    negative = int(neg.sum())
    if negative:
        dur_a[neg] = 0.0
    cls_of = _Classes()
    try:
        cls = np.fromiter(map(cls_of.__getitem__, cat), np.int8, n)
    except TypeError:  # an unhashable category (an object, a list): name the event
        i = next(i for i, c in enumerate(cat) if not isinstance(c, (str, int, float, type(None))))
        raise TraceError(path, f"traceEvents[{_index_of(ev, xs[i])}] has a 'cat' that is "
                         f"{type(cat[i]).__name__}, not a string") from None
    # fwdbwd flow ends and [memory] instants (the many ac2g flows are not needed: correlation ids
    # join launches to kernels)
    flow_ev = _pick(ev, np.flatnonzero(kind == _PH_FLOW))
    flows = list(compress(flow_ev, map(eq, map(dict.get, flow_ev, repeat("cat")), repeat("fwdbwd"))))
    inst = _pick(ev, np.flatnonzero(kind == _PH_INSTANT))
    memory = list(compress(inst, map(eq, map(dict.get, inst, repeat("name")), repeat("[memory]"))))
    n_memory, memory = len(memory), memory_rows(memory)
    try:
        name_c, names = _codes(name, np.int32)
        tid_c, tids = _codes(tid, np.int64)
    except TypeError:  # an unhashable name/tid (a list): use its text
        name_c, names = _codes(tuple(map(_text, name)), np.int32)
        tid_c, tids = _codes(tuple(map(_text, tid)), np.int64)
    pid = [e.get("pid", 0) for e in xs]
    arg = {k: arg_values(args, k, default) for k, default in ARG_COLUMNS.items()}
    out = Events(path, n, ts_a, dur_a, name, tid, xs, cat, args, cls, name_c, names, tid_c, tids,
                 flows, memory, {}, negative, pid, arg, memory_events=n_memory)
    _count_skipped(out, cls_of)
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
    typical = percentile(back, 25) if len(back) else 0.0
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
        _extended(e.name, UNSEEN_LAUNCH, m), _extended(e.tid, UNSEEN_LAUNCH, m), e.events + [ev] * m,
        _extended(e.cat, UNSEEN_LAUNCH, m),
        e.args if isinstance(e.args, dict) else [*e.args, *[{}] * m],  # SparseArgs: new rows read as {}
        np.concatenate((e.cls, np.full(m, RUNTIME, np.int8))),
        np.concatenate((e.name_code, np.full(m, nm_code, e.name_code.dtype))), names,
        np.concatenate((e.tid_code, np.full(m, tid_code, e.tid_code.dtype))), tids,
        e.flows, e.memory, e.skipped, e.negative_dur, [*e.pid, *[0] * m],
        {k: [*v, *[ARG_COLUMNS[k]] * m] for k, v in e.arg.items()},
        {k: np.concatenate((v, np.full(m, ARG_COLUMNS[k], np.int64))) for k, v in e.arg_int.items()},
        None if e.cat_code is None else np.concatenate((e.cat_code, np.full(m, len(e.cats), np.int32))),
        e.cats + [UNSEEN_LAUNCH], e.flow_fields, e.kernel_geom,  # new rows: no flows, no kernels
        None if e.index is None else np.concatenate((e.index, np.full(m, -1, np.int64))), e.operands,
        e.memory_events)
    return out, new, pick


def _extended(values: Sequence[Any], value: Any, m: int) -> list[Any]:
    """``values`` with ``m`` copies of ``value`` appended (an empty, unkept raw column stays empty)."""
    return [*values, *[value] * m] if len(values) else []


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


class _Classes(dict):
    """Kineto category -> event class, classified once per distinct category."""

    def __missing__(self, key: Any) -> int:
        c = self[key] = classify(key)
        return c


def _codes(values: Sequence[Any], dtype: Any) -> tuple[np.ndarray, list[Any]]:
    """Dense codes of ``values`` (first-seen order) and the distinct values."""
    index = _FirstSeen()
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
    idx = np.flatnonzero(member(e.name_code, codes) & ((e.cls == ANNOT) | (e.cls == CPU_OP)))
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
    host = np.flatnonzero(IS_HOST[e.cls] & (e.tid_code == main))
    host = host[start_order(e.ts[host], e.dur[host])]
    end = e.ts[host] + e.dur[host]
    # top level: no earlier-starting event ends no earlier (the running maximum of the ends before)
    top_level = np.ones(len(host), bool)
    top_level[1:] = np.maximum.accumulate(end)[:-1] < end[1:]
    top_host = host[top_level]
    top = ann[member(ann, top_host)]
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


def start_order(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """``np.lexsort((-dur, ts))``: by start, the longer first among equal starts, then file order.

    One stable sort by start (events come nearly in time order: cheap), then only the runs of equal
    starts are ordered by duration: a lexsort of every row costs a full sort of the durations."""
    o = np.argsort(ts, kind="stable")
    st = ts[o]
    tie = st[1:] == st[:-1]
    if not tie.any():
        return o
    # positions inside runs of equal starts: sort them by (run, -dur, file order), in place
    in_run = np.zeros(len(o), bool)
    in_run[1:] = tie
    in_run[:-1] |= tie
    pos = np.flatnonzero(in_run)
    run = np.cumsum(~np.concatenate(([False], tie)))[pos]
    sub = o[pos]
    o[pos] = sub[np.lexsort((sub, -dur[sub], run))]
    return o


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
