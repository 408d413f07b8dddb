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
import os
from collections.abc import Iterable
from pathlib import Path

from ettools.converters import kineto_comm as kc
from ettools.converters.kineto_build import _build_rank
from ettools.converters.kineto_clock import (
    COLLECTIVE_END_TOL_US,
    _base_time_ns,
    _collective_clock_offsets,
    _common_clock,
    _shift,
)
from ettools.converters.kineto_edges import NEST_TOL_US  # noqa: F401  (documented here)
from ettools.converters.kineto_events import parse_steps
from ettools.converters.kineto_meta import _fix_all_rank_groups, _merge_meta, _rank_of
from ettools.errors import TraceError
from ettools.graph import EdgeKind, RankGraph, StringTable, Trace, TraceMeta  # noqa: F401  (EdgeKind: re-exported)
from ettools.json_chunks import load_chunked

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
