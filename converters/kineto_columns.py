"""Kineto events as columns: the vocabulary both readers of :mod:`ettools.converters.kineto_events`
share — the block reader (:mod:`ettools.converters.kineto_blocks`) and the checked one.

Event classes and the categories that map to them, phase codes, the field getters, the args read
into int columns, the :class:`Events` record they fill, and the small column helpers (dense
codes, picks, ``[memory]`` rows, usable flow ends). Below both readers and
:mod:`ettools.converters.kineto_comm`; :mod:`ettools.converters.kineto_events` re-exports every name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import and_, itemgetter
from pathlib import Path
from typing import Any

import numpy as np

# Event classes (the graph keeps classes HOST_OP..MEMSET; SYNC_EV feeds SYNC edges; the rest are skipped).
CPU_OP, ANNOT, PYFN, RUNTIME, KERNEL, MEMCPY, MEMSET, SYNC_EV, SKIP, UNKNOWN = range(10)
HOST_CLASSES = (CPU_OP, ANNOT, PYFN, RUNTIME)
DEVICE_CLASSES = (KERNEL, MEMCPY, MEMSET)


def class_mask(classes: tuple[int, ...]) -> np.ndarray:
    """Lookup table: ``class_mask(C)[cls]`` is ``np.isin(cls, C)`` without isin's fixed cost."""
    t = np.zeros(UNKNOWN + 1, bool)
    t[list(classes)] = True
    return t


IS_HOST = class_mask(HOST_CLASSES)
IS_DEVICE = class_mask(DEVICE_CLASSES)


def distinct(ids: np.ndarray) -> np.ndarray:
    """Sorted distinct values of non-negative integer ids (``np.unique`` of dense codes)."""
    if len(ids) == 0:
        return np.zeros(0, np.int64)
    return np.flatnonzero(np.bincount(ids))


def member(values: np.ndarray, ids: Any) -> np.ndarray:
    """``np.isin(values, ids)`` for non-negative integer codes, by a lookup table."""
    ids = np.asarray(ids, np.int64)
    if len(values) == 0 or len(ids) == 0:
        return np.zeros(len(values), bool)
    t = np.zeros(max(int(values.max()), int(ids.max())) + 1, bool)
    t[ids] = True
    return t[values]


_INT = frozenset((int,))


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def int_column(values: Sequence[Any], name: str = "an integer arg") -> np.ndarray:
    """An int64 array of arg values (non-integers become the absent sentinel); an integer beyond
    64 bits is refused with a ValueError naming ``name`` (no id, size or count of a real trace
    reaches 2^63: such a value is corrupt, and would be silently wrapped or crash later)."""
    if not values:
        return np.zeros(0, np.int64)
    try:
        arr = np.array(values, np.int64)
        if arr.ndim == 1:
            return arr
    except (TypeError, ValueError, OverflowError):
        pass
    ints = [v if isinstance(v, int) and not isinstance(v, bool) else ABSENT for v in values]
    bad = next((v for v in ints if not _I64_MIN <= v <= _I64_MAX), None)
    if bad is not None:
        raise ValueError(f"{name} = {bad} is beyond a 64-bit integer")
    return np.array(ints, np.int64)


def median(x: np.ndarray) -> float:
    """``float(np.median(x))`` without its fixed cost on small arrays (the same value: the middle
    element, or the mean of the two middle ones), nor its check for a masked array, whose first
    call imports ``numpy.ma`` (~11 ms of CPU on every ``ettools info``, issue 27): a sort up to
    256 values, a partition beyond (as numpy does); empty or NaN-holding arrays go to ``np.median``."""
    n = len(x)
    if n == 0:
        return float(np.median(x))
    a = np.asarray(x, np.float64)
    k = n // 2
    if n <= 256:
        s = np.sort(a)
        if np.isnan(s[-1]):  # NaN sorts last: the median is NaN
            return float(np.median(x))
    else:
        if np.isnan(a).any():
            return float(np.median(x))
        s = np.partition(a, k if n % 2 else [k - 1, k])
    return float(s[k]) if n % 2 else float((s[k - 1] + s[k]) / 2)


def unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` (sorted distinct values) of an integer or bool array, without numpy 2's
    ``np.ma.is_masked`` check, whose first call imports ``numpy.ma`` (~11 ms of CPU on every
    ``ettools info``, issue 27); any other dtype goes to ``np.unique`` (NaNs are merged there)."""
    s = np.sort(np.asarray(a).ravel())
    if s.dtype.kind not in "iub":
        return np.unique(a)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def percentile(x: np.ndarray, q: float) -> float:
    """``float(np.percentile(x, q))`` (linear, numpy's default) of a float64 array, the same float:
    numpy's formula (virtual index ``(n - 1) * q / 100``, its interpolation rounding, NaN when the
    array holds one) on a sorted copy, without the ``np.unique`` of the neighbour indices inside
    ``np.percentile`` that imports ``numpy.ma`` (see :func:`unique`). Other dtypes and empty
    arrays go to ``np.percentile``."""
    a = np.asarray(x)
    if a.dtype != np.float64 or a.size == 0 or not 0 <= q <= 100:
        return float(np.percentile(x, q))
    s = np.sort(a.ravel())
    n = len(s)
    if np.isnan(s[-1]):  # NaN sorts last
        return math.nan
    vi = (n - 1) * float(np.true_divide(q, 100))
    prev = -1 if vi >= n - 1 else math.floor(vi)  # past the last index: the last value (index -1)
    nxt = -1 if prev == -1 else prev + 1
    t = vi - prev
    lo, hi = float(s[prev]), float(s[nxt])
    d = hi - lo
    return hi - d * (1 - t) if t >= 0.5 else lo + d * t


def arg_values(args: Sequence[dict[str, Any]], key: str, default: Any) -> list[Any]:
    """``[a.get(key, default) for a in args]`` at C speed (``args`` are dicts: :func:`extract`
    replaces any other value by an empty dict)."""
    return list(map(dict.get, args, repeat(key), repeat(default)))

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

_PH_OTHER, _PH_X, _PH_FLOW, _PH_INSTANT = range(4)  # complete events, flow ends (fwdbwd), instants ([memory])


class _PhaseKind(dict):
    """Phase string -> _PH_* code (any other phase: _PH_OTHER)."""

    def __missing__(self, key: Any) -> int:
        return _PH_OTHER


_PH_KIND = _PhaseKind(X=_PH_X, s=_PH_FLOW, f=_PH_FLOW, i=_PH_INSTANT)
_PH_TABLE = np.full(128, _PH_OTHER, np.int8)  # ASCII phase letter -> _PH_* code
for _ph, _code in _PH_KIND.items():
    _PH_TABLE[ord(_ph)] = _code
_PH, _TS, _DUR, _NAME, _TID, _CAT, _ARGS = map(itemgetter, ("ph", "ts", "dur", "name", "tid", "cat", "args"))
_XGET = itemgetter("ts", "dur", "name", "tid", "cat", "args")
ABSENT = -(2**62)  # sentinel for a missing integer arg
# args read into int columns (with their defaults), for the attributes and the launch join, and the
# event classes that use each (the columns hold the default on rows of other classes)
ARG_COLUMNS: dict[str, Any] = {"correlation": ABSENT, "External id": ABSENT, "Record function id": 0,
                               "Sequence number": ABSENT}
ARG_CLASSES: dict[str, np.ndarray] = {
    "correlation": class_mask((RUNTIME, *DEVICE_CLASSES)),  # the launch join
    "External id": class_mask(tuple(range(UNKNOWN + 1))),  # every node
    "Record function id": class_mask((CPU_OP, ANNOT)),
    "Sequence number": class_mask((CPU_OP, ANNOT)),
}
# the args of ARG_COLUMNS grouped by the classes that use them (one pick of their events' args each)
_ARG_GROUPS: list[tuple[np.ndarray, list[tuple[str, Any]]]] = []
for _k, _default in ARG_COLUMNS.items():
    _g = next((g for g in _ARG_GROUPS if (g[0] == ARG_CLASSES[_k]).all()), None)
    if _g is None:
        _ARG_GROUPS.append((ARG_CLASSES[_k], [(_k, _default)]))
    else:
        _g[1].append((_k, _default))



def classify(cat: Any) -> int:
    """Event class of a Kineto category string."""
    if not isinstance(cat, str):
        return UNKNOWN
    return CATEGORY_CLASS.get(cat.lower(), UNKNOWN)


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
    name: Sequence[Any]  # raw values per row; empty when only codes were read (cat_code set)
    tid: Sequence[Any]  # (likewise)
    events: list[Any]  # the X events themselves (for rarely needed fields such as pid)
    cat: Sequence[Any]  # (likewise)
    args: Sequence[Any]
    cls: np.ndarray  # int8 event class
    name_code: np.ndarray  # int32 index into ``names``
    names: list[Any]
    tid_code: np.ndarray  # int64 index into ``tids``
    tids: list[Any]
    flows: list[dict[str, Any]] = field(default_factory=list)  # fwdbwd flow events
    memory: list[tuple[Any, ...]] = field(default_factory=list)  # "[memory]" instants: memory_rows
    skipped: dict[str, int] = field(default_factory=dict)
    negative_dur: int = 0
    pid: Sequence[Any] = ()  # ``pid`` of each event (0 when absent; read for device events)
    arg: dict[str, Sequence[Any]] = field(default_factory=dict)  # ARG_COLUMNS: raw arg values, or
    arg_int: dict[str, np.ndarray] = field(default_factory=dict)  # ... the int64 columns (all ints)
    cat_code: np.ndarray | None = None  # int32 index into ``cats`` (None: use ``cat``)
    cats: list[Any] = field(default_factory=list)
    # read while the block reader had the events in the CPU cache (empty: read from the events):
    flow_fields: dict[str, list[Any]] = field(default_factory=dict)  # usable_flows(flows)
    kernel_geom: dict[str, Any] = field(default_factory=dict)  # "grid"/"block" arg of each KERNEL row
    # (row order), "int_only": every grid/block that is a list holds ints only (when both are lists)
    # the block reader keeps no event objects: where each row is in traceEvents, and what later
    # passes read of the CPU ops' args (row -> kineto_blocks.operand_value; None: read from args)
    index: np.ndarray | None = None
    operands: dict[int, Any] | None = None
    memory_events: int = 0  # "[memory]" instants in the file (some may not be rows of ``memory``)

    def pick(self, column: str, idx: np.ndarray) -> list[Any]:
        """Values of a tuple column at rows ``idx``."""
        return _pick(getattr(self, column), idx)

    def int_arg(self, key: str, idx: np.ndarray) -> np.ndarray:
        """Arg ``key`` (of :data:`ARG_COLUMNS`) at rows ``idx`` of the classes that use it
        (:data:`ARG_CLASSES`), as :func:`int_column` makes it."""
        col = self.arg_int.get(key)
        if col is not None:  # every value an int: the array is what int_column would give
            return col[idx]
        return int_column(_pick(self.arg[key], idx), repr(key))

    def pick_cat(self, idx: np.ndarray) -> list[Any]:
        """Categories of rows ``idx``."""
        if self.cat_code is None:
            return _pick(self.cat, idx)
        cats = np.empty(len(self.cats), object)
        cats[:] = self.cats
        return cats[self.cat_code[idx]].tolist()

    def pids(self, idx: np.ndarray) -> list[Any]:
        """``pid`` of the device events at rows ``idx`` (0 when absent)."""
        if isinstance(self.pid, np.ndarray):
            return self.pid[idx].tolist()
        return _pick(self.pid, idx)


def memory_rows(instants: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(ts, Total Allocated, Total Reserved, Bytes, Device Id, Device Type) of each ``[memory]``
    instant with a numeric ``ts`` and object ``args`` (absent args: -1, -1, 0, -1, -1), in order."""
    out = []
    for x in instants:
        ts, a = x.get("ts"), x.get("args")
        if isinstance(ts, (int, float)) and isinstance(a, dict):
            out.append((ts, a.get("Total Allocated", -1), a.get("Total Reserved", -1), a.get("Bytes", 0),
                        a.get("Device Id", -1), a.get("Device Type", -1)))
    return out


FLOW_KEYS = ("ts", "ph", "tid", "id")  # the fields of a fwdbwd flow end that bind it
BLOCK = 2048  # events read per block: a block's objects stay in the CPU cache while every field is read


class _Irregular(Exception):
    """An event the block reader does not take as is (the checked reader handles or names it)."""


def _count_skipped(out: Events, cls_of: dict[Any, int]) -> None:
    """``out.skipped``: events per category that are not nodes (skipped or unknown)."""
    if any(k in (SKIP, UNKNOWN) for k in cls_of.values()):
        skip = (out.cls == SKIP) | (out.cls == UNKNOWN)
        cat = out.pick_cat(np.flatnonzero(skip))
        for c, k in zip(*np.unique(np.asarray([str(x) for x in cat]), return_counts=True)):
            out.skipped[str(c)] = int(k)


_HASHABLE_TYPES = frozenset((int, float, str, bool, type(None)))


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def usable_flows(flows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The :data:`FLOW_KEYS` columns of the flow ends (dicts) that can bind: a numeric ``ts``, phase
    ``s``/``f``, a hashable ``tid`` and ``id`` (a list/object id joins nothing); in order, by C-level
    passes, the hash test only when a value is not of a plain JSON scalar type."""
    cols = {k: list(map(dict.get, flows, repeat(k))) for k in FLOW_KEYS}
    keep = list(map(and_, map(isinstance, cols["ts"], repeat((int, float))), map(("s", "f").__contains__, cols["ph"])))
    if not all(keep):
        cols = {k: list(compress(v, keep)) for k, v in cols.items()}
    if not set(map(type, cols["tid"])) | set(map(type, cols["id"])) <= _HASHABLE_TYPES:
        keep = [_hashable(t) and _hashable(i) for t, i in zip(cols["tid"], cols["id"])]
        cols = {k: list(compress(v, keep)) for k, v in cols.items()}
    return cols


class _FirstSeen(dict):
    """value -> dense code, a new value getting the next code on its first lookup (one C-level pass)."""

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self)
        return code
