"""Kineto (PyTorch profiler Chrome trace JSON) → the ettools graph model.

``read_kineto(paths, steps=None)`` reads one file or a directory of per-rank files (plain or gzip)
into a :class:`~ettools.graph.Trace`: one :class:`~ettools.graph.RankGraph` per rank. The rank of a
file is ``distributedInfo.rank``, else the number in its name (``rank3``, ``rank-3``; else, when several
files are read, the last number), else 0. GPU (CUDA and ROCm: HIP calls arrive under the same categories), CPU-only, NCCL and
gloo traces are supported.

Trace metadata
    ``world_size`` from ``distributedInfo`` (else ranks seen); process groups from
    ``distributedInfo.pg_config`` (``ranks`` are global ranks; an empty list means every rank) and
    from NCCL event args (``Process Group Name``/``Process Group Ranks``); a world group is created
    when a collective names none. ``deviceProperties`` → ``TraceMeta.device_properties``. Times are
    µs relative to one origin shared by all ranks (``meta.extra["kineto_time_origin_us"]`` is that
    origin in Kineto's own clock): ranks are placed on one clock (``baseTimeNanoseconds`` + ``ts``,
    or wall-clock ``ts`` in older files), ``meta.extra["rank_clock"] = "common"``; when the files
    cannot say (relative ``ts`` without a base), every rank starts at 0, ``"none"``. Either is
    corrected by the collectives when their kernels, which end together on every member, say the
    clocks differ (ranks on hosts with unsynchronized clocks) or there was no clock: ``"collectives"``,
    with ``meta.extra["rank_clock_offsets_us"]``.

Steps
    ``steps`` = ``"2"``, ``"2-4"``, ``"2,5"`` (numbers N of ``ProfilerStep#N``) or None for every step
    present; with no ``ProfilerStep`` in a file the whole file is kept. Host events are kept when they
    start inside the chosen steps' span; device events when the runtime call that launched them is kept
    (or, with no launcher in the trace, when they start inside the span). The 2021 format's steps are
    ``Operator`` events. A file without ``ProfilerStep`` whose launching thread has top-level
    ``user_annotation`` spans holding at least half of its launches (vLLM's and SGLang's ``execute_…``)
    reports those spans as its steps, numbered 0.. (they select events only when ``steps`` is given).

Nodes: one per kept complete event (``ph: X``) of these categories
    ``cpu_op``, ``user_annotation`` (``ProfilerStep#N`` included), ``python_function``,
    ``cuda_runtime``/``cuda_driver`` (and the other ``*_runtime`` categories) → host COMP nodes,
    resource ``"thread <tid>"``, ``is_cpu_op`` 1. ``kernel``, ``gpu_memcpy``, ``gpu_memset`` → device
    nodes, resource ``"stream <tid>"`` (``"device <d> stream <tid>"`` when a rank uses several
    devices; ``meta["devices"]`` lists them), ``is_cpu_op`` 0, ``tensor_size`` = ``bytes`` of copies
    and sets. The 2021 spellings ``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset`` are
    the same categories. Kernels of a CUDA/HIP graph launch share its correlation id: every one is a
    node launched by that call. Not nodes: ``cuda_sync`` (read into SYNC edges),
    ``gpu_user_annotation`` (device copies of host annotations, they only group kernels), ``Trace``,
    ``overhead``, counters, ``cuda_profiler_range`` (range-profiler counters whose times Kineto makes
    up as an even split of the span: logged as a warning); unknown categories are skipped and logged.
    Every skipped category is counted in ``meta["skipped"]``.
    A device op without a launch in the trace (a device-only trace, work launched before the window)
    that started on an idle stream gets a stand-in launch: a 1 ns host node ``launch outside the
    trace`` on a thread of that name, ending where the op starts (the idle time before it was the
    host's, and a replay keeps it as a host gap); one queued behind its stream's previous op only
    follows stream order. ``meta["host_timeline"]`` is True: the host threads are a measured timeline
    (the replay slices them even when nothing nests, as in a trace without CPU ops).

Attributes (a contract with the ET linker): ``cat`` (string_val, the Kineto category), ``ext_id``
    (``External id``), ``rf_id`` (``Record function id`` when nonzero), ``correlation`` (runtime calls
    and device ops), ``seq`` (``Sequence number``), all int64_val. Also: ``gap_before_us`` (double_val:
    idle time on the thread before a host node — since its previous sibling ended, or since its parent
    started for a first child, or since the previous top-level op ended), ``launch_blocked`` (bool_val:
    a launch that waited for a slot in a full launch queue), ``blocking`` (bool_val: a synchronous
    runtime call such as ``cudaMemcpy`` or a copy from pageable memory, which returns only when the
    copy it launched is done), ``fwdbwd`` (int64_val: the id of a forward→backward flow, on both ends),
    ``comm_seq`` (int64_val: NCCL ``Seq``), ``comm_source`` (string_val: where a comm node's metadata
    came from).

Edges (``dep_kind``)
    * ORDER — between consecutive top-level host ops of a thread, and consecutive ops of a stream.
    * NEST — from a host op to its direct parent (the op whose span contains it; a child may end up to
      ``NEST_TOL_US`` = 1 µs after its parent, as separately rounded timestamps do). This is containment,
      NOT a completion dependency: the child finishes before its parent. :func:`ettools.replayable.
      to_replayable` turns nesting into a chain with completion semantics.
    * LAUNCH — from each device op to the runtime call that launched it (joined on ``correlation``,
      which is what the ``ac2g`` flows encode), and from a gloo transfer to the ``c10d::`` op that
      issued it.
    * SYNC — read from the trace: ``cuda_sync`` events (``Stream Wait Event``: the first op launched on
      the waiting stream after the wait depends on the last op launched on ``wait_on_stream`` before
      the ``cudaEventRecord`` named by ``wait_on_cuda_event_record_corr_id``; ``Event Sync``/``Stream
      Sync``/``Context Sync``: the blocking host call depends on those ops), and
      ``cudaDeviceSynchronize``/``hipDeviceSynchronize`` (every stream). Non-blocking
      ``cudaEventQuery`` gets no edge.
    * SYNC_GUESSED — waits inferred without the event naming its target (older traces without
      ``cuda_sync`` events: ``cudaStreamSynchronize``, ``cudaEventSynchronize`` and
      ``cudaStreamWaitEvent`` paired with the latest ``cudaEventRecord`` and launches of the same
      thread; a thread that sat idle until a gloo transfer it issued finished). A guess contradicting
      the measured times is dropped. ``meta["sync_guessed"]``/``["sync_rejected"]`` count them.
    * CTRL — from a backward op to its forward op (``fwdbwd`` flow); they are on different threads
      and the flow is the only cross-thread link Kineto records.

Collectives
    NCCL: each ``ncclKernel_*``/``ncclDevKernel_*`` kernel becomes the COMM node (COMM_COLL, or
    COMM_SEND/COMM_RECV), metadata from its own args or else from the ``record_param_comms`` op /
    ``nccl:<op>`` annotation around its launch: ``comm_bytes`` = ``In msg nelems`` × dtype size (or
    ``Input Dims`` × ``Input type``), ``comm_group`` = ``Process Group Name``. Send/recv: ``comm_peer``
    = ``Dst Rank``/``Src Rank`` (global), ``comm_tag`` = how many messages the same sender sent the
    same receiver in the group before (NCCL has no tags; both sides count alike, so pairs match).
    gloo: each ``gloo:<op>`` span (the real transfer, on a ``pt_gloo_runloop`` thread, or on the
    caller thread for send/recv) becomes the COMM node, paired in time order with the ``c10d::<op>``
    that issued it (LAUNCH edge): the type is the c10d op's (``reduce_scatter`` although gloo runs an
    all-reduce), bytes come from the span's ``Input Dims``, peer = ``Concrete Inputs[2]`` of
    ``c10d::send``/``recv_`` (group rank → global rank), tag = ``Concrete Inputs[3]``; the group is
    the default group (gloo events do not name theirs; counted in ``meta["comm_group_guessed"]``).
    gloo send/recv spans overlap their caller's later work, so they are kept out of nesting and get
    the resource ``"thread <tid> p2p"``.

``RankGraph.meta``
    ``steps`` [(name, start, end)], ``step_times_us``, ``span_us`` (start, end), ``skipped``
    {category: count}, ``outside_steps`` (events dropped by step selection), ``memory``
    ({"ts", "total_allocated", "total_reserved", "bytes", "device_id", "device_type"} arrays from
    ``[memory]`` events), ``launch_latency_us`` (median launch→start delay of ops launched onto an
    idle stream: the unblocked launch latency), ``launch_latency_after_call_us`` (same, from the
    call's end), ``stream_gap_us`` (median gap between back-to-back ops of a stream),
    ``launch_queue_depth`` (ops outstanding when launches blocked; None if none did),
    ``launch_blocked`` (count), ``sync_events`` (``cuda_sync`` events read), ``sync_edges``,
    ``sync_guessed`` (``gloo_waits_guessed`` of them from gloo), ``sync_rejected`` (guesses the
    times contradict), ``sync_contradicting`` (exact waits the times contradict, kept),
    ``sync_unresolved``, ``devices``, ``comm_nodes``, ``comm_unknown`` (NCCL kernels whose
    collective could not be told: kept as collectives of unknown type), ``comm_bytes_unknown`` (comm
    nodes whose size is unknown: ``comm_bytes`` -1),
    ``comm_group_guessed`` (comm nodes put in the default group), ``negative_durations`` (clamped
    to 0), ``source_file``.

Bad input raises :class:`~ettools.errors.TraceError` naming the file (and the event index): not JSON,
truncated gzip, no ``traceEvents`` list, an event without ``ph``, an ``X`` event without
``ts``/``dur``/``name`` or with non-numeric times.
"""

from __future__ import annotations

import gc
import logging
import os
import re
from collections.abc import Iterable
from itertools import chain, repeat
from operator import eq, itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from ettools.converters import kineto_comm as kc
from ettools.converters import kineto_sync as ks
from ettools.converters.kineto_blocks import HUGE, operand_value
from ettools.converters.kineto_events import (
    ABSENT,
    ANNOT,
    CATEGORY_CLASS,
    CPU_OP,
    IS_DEVICE,
    IS_HOST,
    KERNEL,
    MEMCPY,
    MEMSET,
    RANGE_CATEGORIES,
    RUNTIME,
    SYNC_EV,
    Events,
    _FirstSeen,
    _pick,
    annotation_steps,
    arg_values,
    choose_steps,
    class_mask,
    codes,
    distinct,
    extract,
    find_steps,
    int_column,
    member,
    parse_steps,
    start_order,
    unseen_launches,
    usable_flows,
)
from ettools.errors import TraceError
from ettools.graph import (
    MAX_WORLD_SIZE,
    AttrColumn,
    EdgeKind,
    NodeType,
    ProcessGroup,
    RankGraph,
    StringTable,
    Trace,
    TraceMeta,
)
from ettools.io import short
from ettools.json_chunks import ItemChunks, load_chunked
from ettools.replayable import prev_ge

log = logging.getLogger(__name__)

_ABSENT = ABSENT  # sentinel for a missing integer arg
_OP_OR_ANNOT = class_mask((CPU_OP, ANNOT))
_COPY_OR_SET = class_mask((MEMCPY, MEMSET))
NEST_TOL_US = 1.0  # a child may end this much after its parent (separately rounded timestamps)
KINETO_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


def kineto_files(paths: Path | str | Iterable[Path | str]) -> list[Path]:
    """The trace files named by ``paths``: files as given, directories expanded to their
    ``*.json``/``*.json.gz`` files (sorted; only those whose name says ``kineto`` or ``.pt.trace.``
    when some do, so a folder of ET + Kineto pairs yields its Kineto halves)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and q.name.endswith((".json", ".json.gz")))
            named = [q for q in found if "kineto" in q.name.lower() or ".pt.trace." in q.name]
            if named:  # a folder of ET + Kineto pairs: the Kineto halves only
                found = named
            if not found:
                raise TraceError(p, "directory holds no .json or .json.gz trace files")
            out.extend(found)
        else:
            out.append(p)
    if not out:
        raise TraceError(".", "no input files")
    return out


def _rank_from_name(path: Path, several: bool = True) -> int | None:
    """The rank a file name states: ``rank3``/``rank-3``/``rank_3``; else, among several files, the
    last number of the name (``trace_3.json``). A lone file's other numbers are not ranks
    (``h100.json.gz``, ``bs_32.json``)."""
    m = re.search(r"rank[-_]?(\d+)", path.name, re.IGNORECASE)
    if m:
        return int(m.group(1))
    if not several:
        return None
    nums = re.findall(r"\d+", path.name.split(".")[0])
    return int(nums[-1]) if nums else None


def _rank_of(path: Path, data: dict[str, Any], several: bool = True) -> int:
    """``distributedInfo.rank``, else the rank the file name states, else 0."""
    info = data.get("distributedInfo")
    if isinstance(info, dict) and "rank" in info:
        r, ws = info["rank"], info.get("world_size")
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < MAX_WORLD_SIZE:
            raise TraceError(path, f"distributedInfo.rank is {short(r)}: expected an integer in "
                             f"0..{MAX_WORLD_SIZE - 1}")
        if isinstance(ws, int) and not isinstance(ws, bool) and r >= ws:
            raise TraceError(path, f"distributedInfo.rank {r} is not below distributedInfo.world_size {ws}")
        return r
    r = _rank_from_name(path, several)
    return r if r is not None else 0


def read_kineto(paths: list[Path] | Path | str, steps: str | None = None) -> Trace:
    """Read Kineto trace file(s) into a :class:`Trace` (see the module docstring).

    ``paths``: a file, a directory of per-rank files, or a list of those. ``steps``: ``"2"``,
    ``"2-4"``, ``"2,5"`` or None (every ``ProfilerStep#N`` present).
    """
    files = kineto_files(paths)
    try:
        wanted = parse_steps(steps)
    except ValueError as e:
        raise TraceError(files[0], str(e)) from None
    strings = StringTable()
    meta = TraceMeta(world_size=1, source="kineto")
    graphs: dict[int, RankGraph] = {}
    origin_of: dict[int, float] = {}
    base_ns: dict[int, int | None] = {}
    rank_file: dict[int, Path] = {}
    empty_pg: list[str] = []
    groups = kc.GroupRegistry(meta, files[0])
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the parse and build allocate millions of objects and free none: GC passes only cost
    try:
        infos = []
        for path in files:
            # the pre-scan refuses what would parse at ~40x its size; the events are then parsed a
            # slice of text at a time and reduced to columns (chunks: None when parsed whole)
            data, chunks = load_chunked(path, "traceEvents")
            if not isinstance(data, dict):
                raise TraceError(path, f"expected a JSON object with 'traceEvents', got {type(data).__name__}")
            ev = data.get("traceEvents")
            if ev is None:
                raise TraceError(path, "no 'traceEvents' key: not a Kineto/Chrome trace")
            if not isinstance(ev, list):
                raise TraceError(path, f"'traceEvents' is {type(ev).__name__}, expected a list")
            rank = _rank_of(path, data, len(files) > 1)
            if rank in rank_file:
                raise TraceError(path, f"rank {rank} already read from {rank_file[rank]}")
            rank_file[rank] = path
            _merge_meta(meta, data, path, empty_pg)
            groups.path = path
            try:
                g, base = _build_rank(path, ev if chunks is None else chunks, rank, wanted, strings, groups)
            except (ValueError, OverflowError) as e:  # a corrupt number in the events
                raise TraceError(path, str(e)) from None
            infos.append({k: data[k] for k in ("schemaVersion", "baseTimeNanoseconds", "traceName")
                          if k in data and not isinstance(data[k], (dict, list))})
            emulated = data.get("ettools")
            if isinstance(emulated, dict) and emulated.get("durations") == "modelled":
                # an emulated capture (ettools capture --emulate): its times were modelled, not measured
                g.meta["durations"] = "modelled"
                g.meta["emulated_gpu"] = str(emulated.get("gpu") or "")
            graphs[rank] = g
            origin_of[rank] = base
            base_ns[rank] = _base_time_ns(data)
            del data, ev, chunks
    finally:
        if gc_was_enabled:
            gc.enable()
    ranks_seen = max(graphs) + 1 if graphs else 1
    if meta.world_size < ranks_seen:
        meta.world_size = ranks_seen
    _fix_all_rank_groups(meta, empty_pg)
    clock = _common_clock(origin_of, base_ns)
    if clock is None:  # no common clock: every rank keeps its own first event as time 0
        origin = min(origin_of.values()) if origin_of else 0.0
        meta.extra["rank_clock"] = "none"
    else:
        origin_of = clock
        origin = min(origin_of.values()) if origin_of else 0.0
        for rank, g in graphs.items():
            _shift(g, origin_of[rank] - origin)
        meta.extra["rank_clock"] = "common"
    offsets = _collective_clock_offsets(graphs, meta)
    if offsets and (clock is None or max(abs(v) for v in offsets.values()) > COLLECTIVE_END_TOL_US):
        # the collectives say the clocks disagree (ranks on hosts whose clocks differ) or there is
        # no clock at all: put the ranks on the clock their collectives' common ends define
        for rank, off in offsets.items():
            _shift(graphs[rank], -off)
        meta.extra["rank_clock"] = "collectives"
        meta.extra["rank_clock_offsets_us"] = {str(r): v for r, v in sorted(offsets.items())}
    meta.extra["kineto_time_origin_us"] = origin
    meta.extra["kineto_files"] = {str(r): str(p) for r, p in sorted(rank_file.items())}
    meta.extra["kineto_info"] = infos
    return Trace(meta, dict(sorted(graphs.items())), strings)


def _merge_meta(meta: TraceMeta, data: dict[str, Any], path: Path, empty_pg: list[str]) -> None:
    """World size, process groups and device properties of one file into ``meta``."""
    info = data.get("distributedInfo")
    if isinstance(info, dict):
        ws = info.get("world_size")
        if ws is not None and (not isinstance(ws, int) or isinstance(ws, bool) or not 1 <= ws <= MAX_WORLD_SIZE):
            raise TraceError(path, f"distributedInfo.world_size is {short(ws)}: expected an integer in "
                             f"1..{MAX_WORLD_SIZE}")
        if isinstance(ws, int) and ws > meta.world_size:
            meta.world_size = ws
        backend = info.get("backend")
        if isinstance(backend, str):
            meta.extra.setdefault("backend", backend)
        if isinstance(info.get("nccl_version"), str):
            meta.extra.setdefault("nccl_version", info["nccl_version"])
        pgs = info.get("pg_config") or []
        if not isinstance(pgs, list):
            raise TraceError(path, f"distributedInfo.pg_config is {type(pgs).__name__}, expected a list")
        for pg in pgs:
            if not isinstance(pg, dict) or "pg_name" not in pg:
                continue
            name = str(pg["pg_name"])
            ranks = pg.get("ranks")
            if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
                continue
            if not ranks:
                empty_pg.append(name)
                size = pg.get("pg_size") if isinstance(pg.get("pg_size"), int) else meta.world_size
                ranks = list(range(max(size, meta.world_size)))
            group = ProcessGroup(name, tuple(ranks), str(pg.get("pg_desc", "")), str(pg.get("backend_config", "")))
            try:
                if name in empty_pg:
                    meta.process_groups[name] = group
                else:
                    meta.add_group(group)
            except ValueError as e:
                raise TraceError(path, str(e)) from None
    props = data.get("deviceProperties")
    if isinstance(props, list) and props and not meta.device_properties:
        meta.device_properties = [p for p in props if isinstance(p, dict)]


def _fix_all_rank_groups(meta: TraceMeta, empty_pg: list[str]) -> None:
    """Groups meaning "every rank" get the final world size (known only after every file)."""
    world = tuple(range(meta.world_size))
    names = set(empty_pg)
    implicit = meta.extra.get("implicit_world_group")
    if implicit:
        names.add(implicit)
    for name in names:
        g = meta.process_groups.get(name)
        if g is not None and g.ranks != world:
            meta.process_groups[name] = ProcessGroup(name, world, g.desc, g.backend)


EPOCH_US_MIN = 1e15  # µs since 1970 of 2001-09: a ts this large is wall-clock time, not relative


def _base_time_ns(data: dict[str, Any]) -> int | None:
    """``baseTimeNanoseconds`` of a file (newer Kineto writes ``ts`` relative to it), else None."""
    b = data.get("baseTimeNanoseconds")
    if isinstance(b, str) and b.strip().isdigit():
        b = int(b)
    return int(b) if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 else None


def _common_clock(origin_of: dict[int, float], base_ns: dict[int, int | None]) -> dict[int, float] | None:
    """Each rank's first event on one clock shared by all ranks, or None when the files cannot say.

    Newer Kineto writes ``ts`` in µs since ``baseTimeNanoseconds`` (the wall clock floored to a
    quarter, so ranks of one job may differ in it); older Kineto writes wall-clock µs. Ranks on one
    host share that clock (across hosts it is as good as their clock sync). The base is added as an
    exact integer difference to the smallest base, so sub-µs timestamps keep their precision.
    """
    if len(origin_of) < 2:
        return dict(origin_of)
    known = [b for b in base_ns.values() if b is not None]
    b0 = min(known) if known else 0
    out: dict[int, float] = {}
    for r, o in origin_of.items():
        b = base_ns.get(r)
        if b is not None:
            out[r] = o + (b - b0) / 1000.0
        elif not known and o >= EPOCH_US_MIN:
            out[r] = o
        else:
            return None  # relative times without a base, or a mix of both kinds: no common clock
    return out


COLLECTIVE_END_TOL_US = 5.0  # kernels of one NCCL collective end this close together on one clock


def _collective_clock_offsets(graphs: dict[int, RankGraph], meta: TraceMeta) -> dict[int, float]:
    """How far each rank's clock runs ahead of the lowest rank's, read from their collectives.

    The device kernels of one collective end together on every member (each waits for the last to
    arrive, then they finish the transfer together: within a µs on the 8-rank DLRM trace), so the
    k-th collective of a group whose members are all in the trace gives one clock difference per
    rank. Only a consistent answer counts: the median difference, when the differences agree within
    ``COLLECTIVE_END_TOL_US`` (median absolute deviation) on at least two collectives; ranks without
    one are left out.
    """
    present = set(graphs)
    ends: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    complete: dict[int, bool] = {}
    for r, g in graphs.items():
        sel = np.flatnonzero((g.type == NodeType.COMM_COLL_NODE) & (g.is_cpu_op == 0)
                             & np.isfinite(g.start) & np.isfinite(g.dur))
        if not len(sel):
            continue
        gid = g.comm_group[sel].astype(np.int64)
        for x in np.unique(gid).tolist():
            if x not in complete:
                pg = meta.process_groups.get(g.strings[x]) if x >= 0 else None
                complete[x] = pg is not None and len(pg.ranks) > 1 and present.issuperset(pg.ranks)
        sel = sel[np.array([complete[x] for x in gid.tolist()], bool)]
        if not len(sel):
            continue
        o = sel[np.lexsort((g.start[sel], g.comm_group[sel]))]
        gid = g.comm_group[o].astype(np.int64)
        new = np.ones(len(o), bool)
        new[1:] = gid[1:] != gid[:-1]
        kth = np.arange(len(o)) - np.maximum.accumulate(np.where(new, np.arange(len(o)), 0))
        ends[r] = (gid * (1 << 32) + kth, g.start[o] + g.dur[o])
    if len(ends) < 2:
        return {}
    ref = min(ends)
    out: dict[int, float] = {}
    for r, (keys, e) in ends.items():
        if r == ref:
            continue
        _, a, b = np.intersect1d(keys, ends[ref][0], return_indices=True)
        if len(a) < 2:
            continue
        d = e[a] - ends[ref][1][b]
        med = float(np.median(d))
        if float(np.median(np.abs(d - med))) <= COLLECTIVE_END_TOL_US:
            out[r] = med
    if out:
        out[ref] = 0.0
    return out


def _shift(g: RankGraph, delta: float) -> None:
    """Move a rank's times from its own base to the trace origin (in place, during reading)."""
    if delta == 0:
        return
    g.columns["start"] = g.columns["start"] + delta
    m = g.meta
    m["steps"] = [(n, s + delta, e + delta) for n, s, e in m["steps"]]
    m["span_us"] = (m["span_us"][0] + delta, m["span_us"][1] + delta)
    if "memory" in m:
        m["memory"]["ts"] = m["memory"]["ts"] + delta


# --------------------------------------------------------------------------------------------
# one rank
# --------------------------------------------------------------------------------------------


_int_column = int_column


def _dense_unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` of small non-negative codes, by a lookup table."""
    if len(keys) == 0 or int(keys.max()) > 4 * len(keys) + 4096:
        return np.unique(keys, return_inverse=True)
    present = np.zeros(int(keys.max()) + 1, bool)
    present[keys] = True
    uniq = np.flatnonzero(present)
    slot = np.cumsum(present) - 1
    return uniq, slot[keys]


def _segments(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start/end offsets of runs of equal values in a grouped array."""
    if len(keys) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cut = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [len(keys)]))
    return starts, ends


class _RowArgs:
    """``args`` of a node row (the event's args dict), looked up when asked."""

    def __init__(self, args: Any, order: np.ndarray) -> None:
        self.args, self.order = args, order

    def __getitem__(self, row: int) -> dict[str, Any]:
        return self.args[int(self.order[row])]


class _Rank:
    """Node-level columns of one rank while its graph is built (rows sorted by start)."""

    def __init__(self, e: Events, order: np.ndarray, strings: StringTable, base: float) -> None:
        self.e = e
        self.order = order
        self.n = n = len(order)
        self.strings = strings
        self.start = e.ts[order] - base
        self.dur = e.dur[order]
        self.end = self.start + self.dur
        self.cls = e.cls[order]
        self.args = _RowArgs(e.args, order)
        codes = e.name_code[order]
        used = distinct(codes)
        table = np.zeros(len(e.names), np.int32)
        table[used] = [strings.intern(x if isinstance(x, str) else str(x)) for x in (e.names[i] for i in used.tolist())]
        self.name_id = table[codes]
        self.is_dev = IS_DEVICE[self.cls]
        self.is_host = ~self.is_dev
        self.type = np.full(n, int(NodeType.COMP_NODE), np.uint8)
        self.comm_type = np.full(n, -1, np.int8)
        self.comm_bytes = np.full(n, -1, np.int64)
        self.comm_group = np.full(n, -1, np.int32)
        self.comm_peer = np.full(n, -1, np.int32)
        self.comm_tag = np.full(n, -1, np.int64)
        self.parent = np.full(n, -1, np.int64)
        self.launcher = np.full(n, -1, np.int64)
        self.edges: list[tuple[np.ndarray, np.ndarray, int]] = []
        self.attrs: dict[str, AttrColumn] = {}
        self.meta: dict[str, Any] = {}
        self._resources(e)

    def _resources(self, e: Events) -> None:
        tcode = e.tid_code[self.order]
        dev_rows = np.flatnonzero(self.is_dev)
        pcode = np.zeros(self.n, np.int64)  # host resources ignore the pid
        dcode, plist = codes(e.pids(self.order[dev_rows]), np.int64)
        pcode[dev_rows] = dcode
        plist = plist or [0]
        tlist = e.tids
        dev_pids = sorted(set(plist) if len(dev_rows) else [], key=str)
        self.devices = dev_pids
        multi = len(dev_pids) > 1
        combo = (self.is_dev.astype(np.int64) * len(plist) + pcode) * len(tlist) + tcode
        uniq, inv = _dense_unique(combo)
        names = []
        self.stream_key: dict[tuple[Any, Any], int] = {}  # (device pid, stream tid) -> resource id
        for c in uniq.tolist():
            t = tlist[c % len(tlist)]
            p = plist[(c // len(tlist)) % len(plist)]
            dev = c // (len(tlist) * len(plist))
            if dev:
                res = f"device {p} stream {t}" if multi else f"stream {t}"
            else:
                res = f"thread {t}"
            rid = self.strings.intern(res)
            names.append(rid)
            if dev:
                self.stream_key[(p, t)] = rid
        self.res = np.asarray(names, np.int32)[inv.reshape(-1)] if len(names) else np.zeros(0, np.int32)
        self.tid_code = tcode

    def add_edges(self, dst: np.ndarray, src: np.ndarray, kind: int) -> None:
        """``dst`` rows depend on ``src`` rows."""
        if len(dst):
            self.edges.append((np.asarray(dst, np.int64), np.asarray(src, np.int64), int(kind)))

    def set_attr(self, name: str, kind: str, rows: np.ndarray, values: list[Any]) -> None:
        """A sparse attribute column (rows any order; sorted here)."""
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            return
        if np.any(rows[1:] < rows[:-1]):
            o = np.argsort(rows, kind="stable")
            values = [values[i] for i in o.tolist()]
            rows = rows[o]
        self.attrs[name] = AttrColumn(kind, rows, list(values))

    def name(self, row: int) -> str:
        """Name of node ``row``."""
        return self.strings[int(self.name_id[row])]


def _build_rank(
    path: Path, ev: list[Any] | ItemChunks, rank: int, wanted: set[int] | None, strings: StringTable, groups: kc.GroupRegistry
) -> tuple[RankGraph, float]:
    """One file's events → (graph with times relative to ``base``, ``base``)."""
    e = extract(path, ev)
    cls, ts, dur = e.cls, e.ts, e.dur
    host = IS_HOST[cls]
    device = IS_DEVICE[cls]
    # correlation ids: runtime calls and device ops (their join is the launch edge)
    rt = np.flatnonzero(cls == RUNTIME)
    dv = np.flatnonzero(device)
    rt_corr = e.int_arg("correlation", rt)
    dv_corr = e.int_arg("correlation", dv)
    launcher_ev = _join(dv_corr, rt_corr, rt)
    steps = find_steps(e)
    inferred = not steps
    if inferred:  # no ProfilerStep: execute spans marked by annotations (serving traces)
        steps = annotation_steps(e, distinct(launcher_ev[launcher_ev >= 0]))
    chosen = choose_steps(path, steps, wanted)
    if chosen and (wanted is not None or not inferred):  # annotation steps alone select nothing
        s0 = min(s.start for s in chosen)
        s1 = max(s.end for s in chosen)
        in_span = (ts >= s0) & (ts < s1)
    else:
        in_span = np.ones(e.n, bool)
    sy = np.flatnonzero(cls == SYNC_EV)
    keep = host & in_span
    has_l = launcher_ev >= 0
    keep[dv] = np.where(has_l, keep[np.maximum(launcher_ev, 0)], in_span[dv])
    # device ops without a launch in the trace that started on an idle stream: a stand-in launch
    unseen = unseen_launches(e, dv, keep[dv] & ~has_l)
    if unseen is not None:
        e, new_rows, launched = unseen
        cls, ts, dur = e.cls, e.ts, e.dur
        m = len(new_rows)
        keep = np.concatenate((keep, np.ones(m, bool)))
        host = np.concatenate((host, np.ones(m, bool)))
        device = np.concatenate((device, np.zeros(m, bool)))
        launcher_ev = launcher_ev.copy()
        launcher_ev[launched] = new_rows
        has_l = launcher_ev >= 0
        rt = np.concatenate((rt, new_rows))
        rt_corr = np.concatenate((rt_corr, np.full(m, _ABSENT, np.int64)))
    sel = np.flatnonzero(keep)
    order = sel[start_order(ts[sel], dur[sel])]
    base = float(ts[order].min()) if len(order) else 0.0
    r = _Rank(e, order, strings, base)
    r.rank = rank
    row_of = np.full(e.n, -1, np.int64)
    row_of[order] = np.arange(r.n)
    # launch edges: device op -> runtime call
    dv_rows = row_of[dv]
    ok = (dv_rows >= 0) & has_l
    r.launcher[dv_rows[ok]] = row_of[launcher_ev[ok]]
    r.corr = np.full(r.n, _ABSENT, np.int64)
    r.corr[row_of[rt][row_of[rt] >= 0]] = rt_corr[row_of[rt] >= 0]
    r.corr[dv_rows[dv_rows >= 0]] = dv_corr[dv_rows >= 0]
    lrows = np.flatnonzero(r.launcher >= 0)
    r.add_edges(lrows, r.launcher[lrows], EdgeKind.LAUNCH)

    gloo_p2p = _gloo_rows(r)
    _nesting(r, gloo_p2p)
    _device_order(r)
    kc.build_collectives(r, groups, gloo_p2p)
    # cuda_sync events kept with their runtime call
    sync_args = e.pick("args", sy)
    ks.sync_edges(r, sync_args)
    ks.launch_facts(r)
    r.meta["sync_guessed"] += r.meta.get("gloo_waits_guessed", 0)
    _attributes(r)
    _fwdbwd(r, e, base)
    _rank_meta(r, e, chosen, base, path, int((~keep & (host | device)).sum()), len(sy))
    g = _assemble(r, rank)
    return g, base


def _join(keys: np.ndarray, ref_keys: np.ndarray, ref_vals: np.ndarray) -> np.ndarray:
    """``ref_vals`` at the position where ``ref_keys == keys`` (-1 where absent)."""
    out = np.full(len(keys), -1, np.int64)
    if len(ref_keys) == 0 or len(keys) == 0:
        return out
    o = np.argsort(ref_keys, kind="stable")
    sk = ref_keys[o]
    pos = np.minimum(np.searchsorted(sk, keys), len(sk) - 1)
    hit = (sk[pos] == keys) & (keys != _ABSENT)
    out[hit] = ref_vals[o[pos[hit]]]
    return out


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


def _attributes(r: _Rank) -> None:
    """The contract attributes cat/ext_id/rf_id/correlation/seq, and tensor_size of copies."""
    n = r.n
    e = r.e
    r.set_attr("cat", "string_val", np.arange(n), e.pick_cat(r.order))
    ids = e.int_arg("External id", r.order)
    rows = np.flatnonzero(ids != _ABSENT)
    r.set_attr("ext_id", "int64_val", rows, ids[rows].tolist())
    host = np.flatnonzero(_OP_OR_ANNOT[r.cls])
    rf = e.int_arg("Record function id", r.order[host])
    ok = (rf != 0) & (rf != _ABSENT)
    r.set_attr("rf_id", "int64_val", host[ok], rf[ok].tolist())
    sq = e.int_arg("Sequence number", r.order[host])
    ok = sq != _ABSENT
    r.set_attr("seq", "int64_val", host[ok], sq[ok].tolist())
    rows = np.flatnonzero(r.corr != _ABSENT)
    r.set_attr("correlation", "int64_val", rows, r.corr[rows].tolist())
    # launch geometry of kernels: what the calibrated compute model keys on
    kern = np.flatnonzero(r.cls == KERNEL)
    geom = e.kernel_geom
    if geom:  # read by the block reader: kernel k of the file is entry k
        at = (np.cumsum(e.cls == KERNEL) - 1)[r.order[kern]]
        grid, block = _pick(geom["grid"], at), _pick(geom["block"], at)
    else:
        ka = e.pick("args", r.order[kern])
        grid = arg_values(ka, "grid", None)
        block = arg_values(ka, "block", None)
    ok = np.fromiter(map(list.__instancecheck__, grid), bool, len(grid))
    ok &= np.fromiter(map(list.__instancecheck__, block), bool, len(block))
    if ok.any():
        sel = np.flatnonzero(ok)
        rows = kern[sel]
        gl, bl = _pick(grid, sel), _pick(block, sel)
        if not geom.get("int_only") and not set(map(type, chain.from_iterable(gl))) | set(
                map(type, chain.from_iterable(bl))) <= {int}:
            # numbers other than ints (the usual [x, y, z] of ints is kept as read)
            try:
                gl = np.asarray(gl, np.int64).tolist()
                bl = np.asarray(bl, np.int64).tolist()
            except (TypeError, ValueError, OverflowError):
                gl = [[int(x) for x in g] for g in gl]
                bl = [[int(x) for x in b] for b in bl]
        r.set_attr("grid", "int64_list", rows, gl)
        r.set_attr("block", "int64_list", rows, bl)
    _operand_shapes(r)
    cp = np.flatnonzero(_COPY_OR_SET[r.cls])
    r.tensor_size = np.full(n, -1, np.int64)
    if len(cp):
        b = _int_column(arg_values(e.pick("args", r.order[cp]), "bytes", _ABSENT))
        r.tensor_size[cp] = np.where(b == _ABSENT, -1, b)


def _operand_shapes(r: _Rank) -> None:
    """``inputs`` (Chakra ``IOInfo``: values, shapes, types) of the host ops recorded with shapes:
    ``Concrete Inputs``, ``Input Dims`` and ``Input type`` as JSON text. A compute model reads the
    work of each kernel off its launching op's operands (another GPU's time, a what-if)."""
    ops = np.flatnonzero(r.cls == CPU_OP)
    if not len(ops):
        return
    e = r.e
    if e.operands is not None:  # read by the block reader (operand_value of each op's args)
        vals = list(map(e.operands.get, r.order[ops].tolist()))
    else:
        vals = list(map(operand_value, e.pick("args", r.order[ops])))
    sel = [k for k, v in enumerate(vals) if v is not None]
    if not sel:
        return
    # operands no device holds (a dimension past 2^40, a tensor past 2^50 elements): not used as
    # shapes, counted (they would size FLOPs and bytes of the op's kernels)
    huge = sum(1 for k in sel if vals[k] is HUGE)
    if huge:
        r.meta["implausible_operands"] = huge
    keep = [k for k in sel if vals[k] is not HUGE and vals[k][1]]
    if keep:
        r.set_attr("inputs", "io", ops[keep], [vals[k] for k in keep])


def _rank_meta(
    r: _Rank, e: Events, chosen: list[Any], base: float, path: Path, outside: int, n_sync: int
) -> None:
    m = r.meta
    m["source_file"] = str(path)
    m["steps"] = [(s.name, s.start - base, s.end - base) for s in chosen]
    m["step_times_us"] = [s.end - s.start for s in chosen]
    m["span_us"] = (float(r.start.min()), float(r.end.max())) if r.n else (0.0, 0.0)
    skipped = dict(e.skipped)
    m["skipped"] = skipped
    unknown = {k: v for k, v in skipped.items() if k.lower() not in CATEGORY_CLASS}
    if unknown:
        log.warning("%s: skipped events of unknown categories: %s", path,
                    ", ".join(f"{k} ({v})" for k, v in sorted(unknown.items())))
    ranges = {k: v for k, v in skipped.items() if k.lower() in RANGE_CATEGORIES}
    if ranges:
        log.warning("%s: skipped range-profiler events (hardware counters; their times are an even split of "
                    "the profiling span, not measured): %s", path,
                    ", ".join(f"{k} ({v})" for k, v in sorted(ranges.items())))
    m["outside_steps"] = outside
    m["sync_events"] = n_sync
    m["negative_durations"] = e.negative_dur
    m["devices"] = r.devices
    m["host_timeline"] = True  # measured host threads: replay slices them (idle gaps are host time)
    if e.memory_events:
        mem = e.memory  # memory_rows: (ts, allocated, reserved, bytes, device id, device type)
        if chosen:
            s0 = min(s.start for s in chosen)
            s1 = max(s.end for s in chosen)
            mem = [x for x in mem if s0 <= x[0] < s1]
        mem = sorted(mem, key=itemgetter(0))
        m["memory"] = {
            "ts": np.array([x[0] for x in mem], np.float64) - base,
            "total_allocated": _int_column([x[1] for x in mem]),
            "total_reserved": _int_column([x[2] for x in mem]),
            "bytes": _int_column([x[3] for x in mem]),
            "device_id": _int_column([x[4] for x in mem]),
            "device_type": _int_column([x[5] for x in mem]),
        }


def _assemble(r: _Rank, rank: int) -> RankGraph:
    """Columns, CSR dependencies and attributes → RankGraph (node id = row)."""
    n = r.n
    if r.edges:
        dst = np.concatenate([d for d, _, _ in r.edges])
        src = np.concatenate([s for _, s, _ in r.edges])
        kind = np.concatenate([np.full(len(d), k, np.uint8) for d, _, k in r.edges])
    else:
        dst = src = np.zeros(0, np.int64)
        kind = np.zeros(0, np.uint8)
    o = np.argsort(dst, kind="stable")
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=dep_ptr[1:])
    columns = {
        "id": np.arange(n, dtype=np.uint64),
        "name": r.name_id,
        "type": r.type,
        "start": r.start,
        "dur": r.dur,
        "resource": r.res,
        "is_cpu_op": r.is_host.astype(np.int8),
        "tensor_size": r.tensor_size,
        "comm_type": r.comm_type,
        "comm_bytes": r.comm_bytes,
        "comm_group": r.comm_group,
        "comm_peer": r.comm_peer,
        "comm_tag": r.comm_tag,
    }
    return RankGraph(rank, r.strings, columns, dep_ptr, src[o].astype(np.uint64), kind[o], r.attrs, meta=r.meta)
