"""Compare two traces the way the STAGE paper's Tables VI–VIII do: ``ettools validate REF CAND``.

REFERENCE is usually measured, CANDIDATE synthesized or rewritten; both are
:class:`~ettools.graph.Trace` objects read from any format. :func:`validate` returns a
:class:`ValidationResult` with one :class:`Table` per *measure*; that result model and its
rendering (Markdown, HTML with charts) are in :mod:`ettools.validate_report` (re-exported here).

Measures (table names)
----------------------
``op_counts``     operators by class (:data:`ettools.classify.CLASSES`), counted as below.
``comm_counts``   communication nodes by type: AllReduce, AllGather, ReduceScatter, AllToAll,
                  Broadcast, Send, Recv always; Reduce, Gather, Scatter, Barrier, Unknown when present.
``comm_bytes``    their bytes (Chakra ``comm_size`` meaning: the per-rank buffer).
``compute_time``  µs spent by the counted operators of each class (inclusive durations of host ops,
                  kernel durations on devices). A (rank, class) cell is compared only when every
                  counted op of that class has a duration on both sides.
``peak_memory``   peak allocated bytes per rank, from the first source a rank has: the profiler's
                  ``[memory]`` events (``RankGraph.meta["memory"]``: largest ``Total Allocated``
                  of the accelerator devices, else of the CPU), a synthesizer's
                  ``meta["peak_memory_bytes"]``, else :func:`ettools.checks.peak_memory` from tensor
                  lifetimes (device tensors only; 0 means no information).
``step_time``     µs per training step: the mean length of the ``meta["steps"]`` spans (Kineto
                  ``ProfilerStep#N``), else the mean duration of ``ProfilerStep#N`` nodes, else the
                  span of the timed nodes (first start to last end). Absent without times.

A measure is compared only where both sides have it; otherwise it is listed in
``ValidationResult.skipped`` with the reason.

Which nodes count as operators (the counting rule)
--------------------------------------------------
A trace records one operator at several levels (``aten::linear`` ⊃ ``aten::matmul`` ⊃
``aten::mm``; ``aten::to`` ⊃ ``aten::_to_copy`` ⊃ ``aten::empty_strided`` + ``aten::copy_``), so
counting every node double counts. Per rank, the unit is chosen (``unit="auto"``) as:

* **device** — when the rank has device ops (``is_cpu_op == 0``; kernels, memcpys, memsets, and
  a synthesizer's nodes): every device op counts once, plus every communication node. Host ops do
  not count: the kernels they launched do.
* **host** — otherwise (CPU captures, execution traces without kernels): every communication node
  (``COMM_COLL``/``COMM_SEND``/``COMM_RECV``; readers make exactly one per call) counts as
  Communication. In the containment forest of ``NEST`` edges, a host op that classifies as
  anything but Others is an *anchor*; an anchor counts when no ancestor is an anchor (the
  outermost op of a chain is the operator; what runs inside it is its implementation). A
  Communication-class host op that is not a comm node (``c10d::allreduce_`` around its
  ``gloo:all_reduce`` span, ``record_param_comms``) is an anchor that does not count itself: its
  comm node is the count. Wrappers (:func:`ettools.classify.is_wrapper`: autograd nodes such as
  ``MmBackward0``, ``evaluate_function`` wrappers, ``Optimizer.step#…`` annotations) that contain
  ops are transparent: ``MmBackward0`` ⊃ 2 × ``aten::mm`` counts 2 GeMM; a wrapper without
  children counts as the op it stands for (TrioSim traces record only those). Others: the root of
  each maximal subtree holding no anchor counts once (``aten::t`` ⊃ ``aten::transpose`` ⊃
  ``aten::as_strided`` is one Others op), unless an anchor encloses it. A host op without a
  parent that runs inside a comm node's span is that collective's own work (gloo's runloop
  thread; an execution trace loses its parent, Kineto nests it under the ``gloo:*`` span) and
  does not count either. Without times (an execution trace read without its Kineto file) that
  work cannot be told from the step's own ops and counts (on the tp_sp capture: 6 Memory/Others
  ops per all-gather).

On the sample captures this gives 27 GeMM ops for the 2-layer GPT (9 forward ``aten::linear`` +
18 backward ``aten::mm``), the count the synthesizer makes (``matmul`` + ``matmul.dgrad`` +
``matmul.wgrad``), and the same counts whether a capture is read from Kineto alone or linked with
its execution trace. ``unit="host"`` or ``"device"`` forces a unit; ``ValidationResult.units``
says which was used on each side (a note warns when they differ).

Errors
------
Each cell holds reference *r*, candidate *c* and ``error_pct`` = \\|c − r\\| / r × 100 (0 when
both are 0; 100 when r = 0 and c ≠ 0: what the reference lacks is wholly wrong). A column's
(one rank's) error, and a measure's total error — the paper's "total error" — are
Σ\\|c − r\\| / Σ r × 100 over its known cells (all rows, all ranks for the total: errors on
different ranks do not cancel). The ``total`` column of additive tables (counts, bytes, times)
holds sums over ranks; of ``peak_memory`` and ``step_time`` the largest rank value.
``max_error_pct`` is the largest measure total error, so ``exceeds(t)`` is non-empty exactly when
``max_error_pct > t``.

Ranks
-----
Same rank sets: rank by rank. One side with a single rank, the other with several: that rank is
compared with each rank of the other side (a single-process capture against every rank of a
plan; columns are labelled by the multi-rank side's ranks). Otherwise the ranks present on both
sides (the others are named in ``notes``); none in common is a ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ettools.classify import CLASSES, classify_names, wrapper_names
from ettools.graph import COMM_NODE_TYPES, EdgeKind, NodeType, RankGraph, Trace
from ettools.summary import comm_table
from ettools.validate_report import (
    ADDITIVE,
    MEASURES,
    TITLES,
    UNITS,
    Cell,
    Table,
    ValidationResult,
    _total_error,
    error_pct,
)

COMM_ROWS = ("AllReduce", "AllGather", "ReduceScatter", "AllToAll", "Broadcast", "Send", "Recv")
_COMM_NAMES = {
    "ALL_REDUCE": "AllReduce", "ALL_GATHER": "AllGather", "REDUCE_SCATTER": "ReduceScatter",
    "REDUCE_SCATTER_BLOCK": "ReduceScatter", "ALL_TO_ALL": "AllToAll", "BROADCAST": "Broadcast",
    "SEND": "Send", "RECV": "Recv", "REDUCE": "Reduce", "GATHER": "Gather", "SCATTER": "Scatter",
    "BARRIER": "Barrier", "UNKNOWN": "Unknown",
}
_EXTRA_COMM_ORDER = ("Reduce", "Gather", "Scatter", "Barrier", "Unknown")
_COUNTED_TYPES = (NodeType.COMP_NODE, NodeType.MEM_LOAD_NODE, NodeType.MEM_STORE_NODE) + COMM_NODE_TYPES
_COMM_CLASS = CLASSES.index("Communication")
_OTHERS = CLASSES.index("Others")


# ---- per-rank profile ----------------------------------------------------------------------------

def nest_parents(g: RankGraph) -> np.ndarray:
    """Row of each node's ``NEST`` parent (-1 for roots; the first if a node names several)."""
    n = len(g)
    parent = np.full(n, -1, np.int64)
    nest = g.dep_kind == EdgeKind.NEST
    if not nest.any():
        return parent
    src, dst, _ = g.edge_rows()
    ok = nest & (src >= 0) & (src != dst)
    # first NEST edge per child wins: assign in reverse so earlier edges overwrite later ones
    parent[dst[ok][::-1]] = src[ok][::-1]
    return parent


def _depths(parent: np.ndarray, limit: int = 4096) -> np.ndarray:
    """Depth of each node in the parent forest (``parent`` is modified: nodes whose ancestor chain
    is longer than ``limit`` — a cycle — become roots)."""
    n = len(parent)
    depth = np.zeros(n, np.int64)
    anc = parent.copy()
    for _ in range(limit):
        live = np.flatnonzero(anc >= 0)
        if not len(live):
            return depth
        depth[live] += 1
        anc[live] = parent[anc[live]]
    parent[anc >= 0] = -1
    return _depths(parent, limit)


def counted_ops(g: RankGraph, unit: str = "auto") -> tuple[np.ndarray, np.ndarray, str]:
    """``(counted mask, class code per node, unit)`` under the module's counting rule.

    Class codes index :data:`ettools.classify.CLASSES`; comm nodes are Communication whatever
    their name. ``unit`` is ``"auto"``, ``"host"`` or ``"device"``.
    """
    if unit not in ("auto", "host", "device"):
        raise ValueError(f"unit must be auto, host or device, not {unit!r}")
    n = len(g)
    codes = classify_names(g.name, g.strings).astype(np.int64) if n else np.zeros(0, np.int64)
    comm = np.isin(g.type, COMM_NODE_TYPES)
    codes[comm] = _COMM_CLASS
    kept_type = np.isin(g.type, _COUNTED_TYPES)
    # comm nodes are not CPU ops in Chakra (ASTRA-sim rejects those) yet are no device kernel: they
    # do not make a host-only rank count device ops
    device = (g.is_cpu_op == 0) & kept_type & ~comm
    hold = g.strings.lookup("device_hold")
    if hold >= 0:  # a replayable graph's measured wait before a device op (ettools.replayable): no operator
        device &= g.name != hold
    if unit == "auto":
        unit = "device" if device.any() else "host"
    if unit == "device":
        return device | comm, codes, unit

    parent = nest_parents(g)
    has_child = np.zeros(n, bool)
    has_child[parent[parent >= 0]] = True
    eff = codes.copy()
    eff[wrapper_names(g.name, g.strings) & has_child & ~comm] = _OTHERS
    anchor = (eff != _OTHERS) & kept_type
    depth = _depths(parent)
    order = np.argsort(depth, kind="stable")
    levels = np.split(order, np.cumsum(np.bincount(depth))[:-1]) if n else []
    # top-down: blocked = some ancestor is an anchor (or inside a comm node's span, see _in_comm_spans)
    blocked = _in_comm_spans(g, parent, comm)
    for rows in levels[1:]:
        p = parent[rows]
        blocked[rows] = blocked[p] | anchor[p]
    # bottom-up: impure = an anchor in the subtree (itself included)
    impure = anchor.copy()
    for rows in reversed(levels[1:]):
        p = parent[rows]
        hit = p[impure[rows]]
        impure[hit] = True
    host_comm = anchor & (eff == _COMM_CLASS) & ~comm
    counted_anchor = anchor & ~blocked & ~host_comm
    root_pure = ~impure & ~blocked & kept_type
    pure_parent = np.zeros(n, bool)
    has_p = parent >= 0
    pure_parent[has_p] = ~impure[parent[has_p]] & kept_type[parent[has_p]]
    counted_other = root_pure & ~pure_parent
    codes = np.where(counted_anchor | comm, codes, np.where(counted_other, _OTHERS, codes))
    return counted_anchor | counted_other | comm, codes, unit


def _in_comm_spans(g: RankGraph, parent: np.ndarray, comm: np.ndarray, tol_us: float = 1.0) -> np.ndarray:
    """Roots (no NEST parent, not comm nodes) lying within the union of comm nodes' spans.

    A collective's own work on another thread (gloo's runloop) nests under its ``gloo:*`` span in
    Kineto, but an execution trace loses that parent; such an orphan is part of the collective.
    """
    out = np.zeros(len(g), bool)
    start, dur = g.start, g.dur
    cm = comm & np.isfinite(start) & np.isfinite(dur)
    roots = np.flatnonzero((parent < 0) & ~comm & np.isfinite(start) & np.isfinite(dur))
    if not cm.any() or not len(roots):
        return out
    o = np.argsort(start[cm], kind="stable")
    cs = start[cm][o]
    ce = np.maximum.accumulate((start[cm] + dur[cm])[o])
    k = np.searchsorted(cs, start[roots] + tol_us, side="right") - 1
    ok = k >= 0
    inside = np.zeros(len(roots), bool)
    inside[ok] = start[roots][ok] + dur[roots][ok] <= ce[k[ok]] + tol_us
    out[roots[inside]] = True
    return out


@dataclass
class RankProfile:
    """What :func:`validate` compares of one rank."""

    unit: str
    op_counts: dict[str, int]
    op_time: dict[str, float | None]  # None: some counted op of the class has no duration
    comm_counts: dict[str, int]
    comm_bytes: dict[str, int]
    peak_memory: int | None
    peak_memory_source: str
    step_time: float | None
    step_time_source: str
    flattened: bool = False  # host ops already sliced into completion semantics: no operator nesting left


def peak_memory_of(g: RankGraph) -> tuple[int | None, str]:
    """``(peak bytes, source)`` of one rank (see the module docstring), ``(None, "")`` if unknown."""
    mem = g.meta.get("memory")
    if isinstance(mem, dict) and len(mem.get("total_allocated", ())):
        total = np.asarray(mem["total_allocated"], np.int64)
        dtype = np.asarray(mem.get("device_type", np.full(len(total), -1)), np.int64)
        ok = total >= 0
        accel = ok & (dtype > 0)
        pick = accel if accel.any() else ok
        if pick.any():
            return int(total[pick].max()), "memory events"
    peak = g.meta.get("peak_memory_bytes")
    if isinstance(peak, (int, np.integer)) and peak > 0:
        return int(peak), "synthesizer"
    from ettools.checks import peak_memory

    live, _ = peak_memory(g)
    if live > 0:
        return int(live), "tensor lifetimes"
    return None, ""


def step_time_of(g: RankGraph) -> tuple[float | None, str]:
    """``(µs per step, source)`` of one rank (see the module docstring), ``(None, "")`` if untimed."""
    steps = g.meta.get("steps")
    if steps:
        spans = [float(s[2]) - float(s[1]) for s in steps]
        return float(np.mean(spans)), "profiler steps"
    names = g.strings
    sid = [i for i in np.unique(g.name).tolist() if i >= 0 and names[i].startswith("ProfilerStep#")]
    if sid:
        # a step written for completion-semantics formats (Chakra) is cut into slices that share
        # its name: the step is the span of its slices, not any one slice
        spans = []
        for i in sid:
            rows = np.flatnonzero(g.name == i)
            s, d = g.start[rows], g.dur[rows]
            ok = np.isfinite(s) & np.isfinite(d)
            if len(rows) > 1 and ok.any():
                spans.append(float((s[ok] + d[ok]).max() - s[ok].min()))
            elif np.isfinite(d).any():
                spans.append(float(d[np.isfinite(d)].max()))
        if spans:
            return float(np.mean(spans)), "ProfilerStep nodes"
    start = g.start
    ok = np.isfinite(start)
    if ok.any():
        end = start[ok] + np.where(np.isfinite(g.dur[ok]), g.dur[ok], 0.0)
        return float(end.max() - start[ok].min()), "span"
    return None, ""


def profile_rank(g: RankGraph, unit: str = "auto") -> RankProfile:
    """Everything :func:`validate` compares of one rank graph."""
    counted, codes, used = counted_ops(g, unit)
    c = codes[counted]
    counts = np.bincount(c, minlength=len(CLASSES))
    dur = g.dur[counted]
    timed = np.isfinite(dur)
    time = np.bincount(c[timed], weights=dur[timed], minlength=len(CLASSES))
    untimed = np.bincount(c[~timed], minlength=len(CLASSES))
    op_time = {cls: (float(time[i]) if untimed[i] == 0 else None) for i, cls in enumerate(CLASSES)}
    comm_counts: dict[str, int] = {}
    comm_bytes: dict[str, int] = {}
    for key, v in comm_table(g).items():
        row = _COMM_NAMES.get(key, key)
        comm_counts[row] = comm_counts.get(row, 0) + v["count"]
        comm_bytes[row] = comm_bytes.get(row, 0) + v["bytes"]
    peak, peak_src = peak_memory_of(g)
    step, step_src = step_time_of(g)
    # a host-op graph that went through ettools.replayable (e.g. Chakra written from a capture)
    # is a chain of time slices named after the innermost op: operators can no longer be counted
    flattened = used == "host" and "orig" in g.attrs and not bool((g.dep_kind == EdgeKind.NEST).any())
    return RankProfile(used, {cls: int(counts[i]) for i, cls in enumerate(CLASSES)}, op_time,
                       comm_counts, comm_bytes, peak, peak_src, step, step_src, flattened)


# ---- validate ------------------------------------------------------------------------------------

def pair_ranks(ref_ranks: list[int], cand_ranks: list[int]) -> tuple[list[tuple[str, int, int]], list[str]]:
    """``(pairs, notes)``: which reference rank is compared with which candidate rank."""
    notes: list[str] = []
    if not ref_ranks or not cand_ranks:
        raise ValueError("a trace has no ranks")
    if ref_ranks == cand_ranks:
        return [(str(r), r, r) for r in ref_ranks], notes
    if len(cand_ranks) == 1:
        c = cand_ranks[0]
        notes.append(f"candidate has one rank ({c}): compared with each reference rank")
        return [(str(r), r, c) for r in ref_ranks], notes
    if len(ref_ranks) == 1:
        r = ref_ranks[0]
        notes.append(f"reference has one rank ({r}): compared with each candidate rank")
        return [(str(c), r, c) for c in cand_ranks], notes
    common = sorted(set(ref_ranks) & set(cand_ranks))
    if not common:
        raise ValueError(f"no ranks in common: reference {_ranks(ref_ranks)}, candidate {_ranks(cand_ranks)}")
    only_ref = sorted(set(ref_ranks) - set(common))
    only_cand = sorted(set(cand_ranks) - set(common))
    if only_ref:
        notes.append(f"ranks only in the reference, not compared: {_ranks(only_ref)}")
    if only_cand:
        notes.append(f"ranks only in the candidate, not compared: {_ranks(only_cand)}")
    return [(str(r), r, r) for r in common], notes


def _ranks(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, …, {ranks[-1]}] ({len(ranks)})"


def _build_table(name: str, rows: list[str], pairs: list[tuple[str, int, int]],
                 values: dict[str, tuple[dict[str, float | None], dict[str, float | None]]]) -> Table:
    """``values[column] = (reference {row: value|None}, candidate {row: value|None})``."""
    additive = ADDITIVE[name]
    columns = [c for c, _, _ in pairs] + ["total"]
    cells: dict[str, dict[str, Cell]] = {}
    col_err: dict[str, float | None] = {}
    all_known: list[tuple[float, float]] = []
    per_row: dict[str, list[tuple[float, float]]] = {row: [] for row in rows}
    for col, _, _ in pairs:
        ref, cand = values[col]
        cells[col] = {}
        known = []
        for row in rows:
            r, c = ref.get(row), cand.get(row)
            if r is None or c is None:
                cells[col][row] = Cell(r, c, None)
                continue
            cells[col][row] = Cell(r, c, error_pct(r, c))
            known.append((r, c))
            per_row[row].append((r, c))
        col_err[col] = _total_error(known)
        all_known += known
    cells["total"] = {}
    for row in rows:
        k = per_row[row]
        if not k:
            cells["total"][row] = Cell(None, None, None)
            continue
        if additive:
            r, c = sum(x for x, _ in k), sum(y for _, y in k)
        else:
            r, c = max(x for x, _ in k), max(y for _, y in k)
        cells["total"][row] = Cell(r, c, error_pct(r, c))
    col_err["total"] = _total_error(all_known)
    return Table(name, TITLES[name], UNITS[name], rows, columns, cells, col_err, additive)


def validate(
    reference: Trace,
    candidate: Trace,
    *,
    measures: list[str] | tuple[str, ...] | None = None,
    unit: str = "auto",
    reference_name: str = "reference",
    candidate_name: str = "candidate",
    op_classes: list[str] | tuple[str, ...] | None = None,
) -> ValidationResult:
    """Compare ``candidate`` with ``reference`` per rank and in total (see the module docstring).

    ``measures`` limits the tables built (default: all of :data:`MEASURES`); ``unit`` forces the
    operator-counting unit (``"host"``/``"device"``) on both sides; ``op_classes`` limits the rows
    of the op-count and time tables (e.g. ``["GeMM", "Attention"]``: a synthesized trace models
    matmuls and attention exactly but not every elementwise kernel of a framework).
    """
    class_rows = list(CLASSES) if not op_classes else [c for c in CLASSES if c in op_classes]
    bad_classes = [c for c in (op_classes or []) if c not in CLASSES]
    if bad_classes:
        raise ValueError(f"unknown operator class(es) {', '.join(bad_classes)}; known: {', '.join(CLASSES)}")
    wanted = list(MEASURES) if measures is None else [m for m in MEASURES if m in measures]
    unknown = [m for m in (measures or []) if m not in MEASURES]
    if unknown:
        raise ValueError(f"unknown measure(s) {', '.join(unknown)}; known: {', '.join(MEASURES)}")
    pairs, notes = pair_ranks(reference.ranks, candidate.ranks)
    ref_prof = {r: profile_rank(reference[r], unit) for r in sorted({r for _, r, _ in pairs})}
    cand_prof = {c: profile_rank(candidate[c], unit) for c in sorted({c for _, _, c in pairs})}

    units = {"reference": sorted({p.unit for p in ref_prof.values()}),
             "candidate": sorted({p.unit for p in cand_prof.values()})}
    if units["reference"] != units["candidate"]:
        notes.append(f"operators counted as {'/'.join(units['reference'])} ops in the reference but "
                     f"{'/'.join(units['candidate'])} ops in the candidate: op counts compare different units")
    sources = {
        "reference": {"peak_memory": sorted({p.peak_memory_source for p in ref_prof.values() if p.peak_memory_source}),
                      "step_time": sorted({p.step_time_source for p in ref_prof.values() if p.step_time_source})},
        "candidate": {"peak_memory": sorted({p.peak_memory_source for p in cand_prof.values() if p.peak_memory_source}),
                      "step_time": sorted({p.step_time_source for p in cand_prof.values() if p.step_time_source})},
    }

    tables: dict[str, Table] = {}
    skipped: dict[str, str] = {}

    def per_pair(get: Any) -> dict[str, tuple[dict, dict]]:
        return {col: (get(ref_prof[r]), get(cand_prof[c])) for col, r, c in pairs}

    flat = [side for side, prof in (("reference", ref_prof), ("candidate", cand_prof))
            if any(p.flattened for p in prof.values())]
    if flat:
        reason = (f"the {' and the '.join(flat)} holds host ops sliced into completion semantics (a Chakra/"
                  "ASTRA-sim file written from a nested trace): operators cannot be counted; compare "
                  "before conversion, or on device kernels")
        for name in ("op_counts", "compute_time"):
            if name in wanted:
                skipped[name] = reason
                wanted = [m for m in wanted if m != name]
    if "op_counts" in wanted:
        tables["op_counts"] = _build_table("op_counts", class_rows, pairs, per_pair(lambda p: dict(p.op_counts)))
    comm_rows = list(COMM_ROWS)
    present = set()
    for p in list(ref_prof.values()) + list(cand_prof.values()):
        present |= set(p.comm_counts)
    comm_rows += [r for r in _EXTRA_COMM_ORDER if r in present]
    comm_rows += sorted(present - set(comm_rows))
    if "comm_counts" in wanted:
        tables["comm_counts"] = _build_table(
            "comm_counts", comm_rows, pairs, per_pair(lambda p: {k: p.comm_counts.get(k, 0) for k in comm_rows}))
    if "comm_bytes" in wanted:
        tables["comm_bytes"] = _build_table(
            "comm_bytes", comm_rows, pairs, per_pair(lambda p: {k: p.comm_bytes.get(k, 0) for k in comm_rows}))
    if "compute_time" in wanted:
        def has_time(p: RankProfile) -> bool:
            return any(v is not None and p.op_counts[k] > 0 for k, v in p.op_time.items())

        if not any(has_time(p) for p in ref_prof.values()):
            skipped["compute_time"] = "the reference has no operator durations"
        elif not any(has_time(p) for p in cand_prof.values()):
            skipped["compute_time"] = "the candidate has no operator durations"
        else:
            tables["compute_time"] = _build_table("compute_time", class_rows, pairs,
                                                  per_pair(lambda p: dict(p.op_time)))
    for name, attr, what in (("peak_memory", "peak_memory", "memory information"),
                             ("step_time", "step_time", "times")):
        if name not in wanted:
            continue
        ref_has = any(getattr(p, attr) is not None for p in ref_prof.values())
        cand_has = any(getattr(p, attr) is not None for p in cand_prof.values())
        if not ref_has or not cand_has:
            side = "reference" if not ref_has else "candidate"
            skipped[name] = f"the {side} has no {what}"
            continue
        row = "peak" if name == "peak_memory" else "step"
        tables[name] = _build_table(name, [row], pairs,
                                    per_pair(lambda p, a=attr, rw=row: {rw: getattr(p, a)}))
    ordered = {m: tables[m] for m in MEASURES if m in tables}
    for m in wanted:
        if m in ordered and ordered[m].error_pct is None and m not in skipped:
            skipped[m] = "no rank has it on both sides"
            del ordered[m]
    return ValidationResult(reference_name, candidate_name, pairs, ordered, skipped, notes, units, sources)

