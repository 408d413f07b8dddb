"""Composing the passes: :func:`scale_trace`, what ``ettools scale`` runs.

Order (each pass proves its result structurally sound, :mod:`ettools.scaler.proof`):

1. a multi-rank **data-parallel capture** asked for another plan is first reduced to one replica
   (:func:`strip_data_parallel`: rank 0 without its data-parallel collectives); asked only for
   more or fewer ranks, it is resharded (:func:`ettools.scaler.reshard.reshard`), keeping its own
   buckets;
2. :func:`~ettools.scaler.rescale.rescale` (batch, sequence, named dimensions; per replica);
3. :func:`~ettools.scaler.ep.expert_parallel`, :func:`~ettools.scaler.tp.tensor_parallel` (+SP),
   :func:`~ettools.scaler.pp.pipeline_parallel`, :func:`~ettools.scaler.dp.data_parallel` — each
   adds its axis as the slowest rank digit, so ranks are ``((d·pp + p)·tp + t)·ep + e``;
4. ``world``: the data-parallel degree that makes the world that size (resharding an existing
   ``dp`` axis, else adding one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.graph import NodeType, Trace, TraceMeta
from ettools.scaler.dp import data_parallel
from ettools.scaler.ep import expert_parallel
from ettools.scaler.mesh import axes_of, used_groups
from ettools.scaler.model import ScaleError
from ettools.scaler.pp import pipeline_parallel
from ettools.scaler.proof import prove
from ettools.scaler.rescale import rescale
from ettools.scaler.reshard import reshard
from ettools.scaler.tp import tensor_parallel


def _world(trace: Trace) -> int:
    return max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)


def is_data_parallel_capture(trace: Trace) -> bool:
    """A captured multi-rank trace whose collectives all use one group spanning every rank, without send/recv."""
    W = _world(trace)
    if W <= 1 or axes_of(trace.meta):
        return False
    world = {n for n, pg in trace.meta.process_groups.items() if sorted(pg.ranks) == list(range(W))}
    if not used_groups(trace.graphs) <= world:
        return False
    return not any(np.isin(g.type, [int(NodeType.COMM_SEND_NODE), int(NodeType.COMM_RECV_NODE)]).any()
                   for g in trace.graphs.values())


def strip_data_parallel(trace: Trace) -> Trace:
    """Rank 0 of a data-parallel capture without its data-parallel collectives, as a one-rank trace."""
    if not is_data_parallel_capture(trace):
        raise ScaleError("strip_data_parallel needs a data-parallel capture (one world group, no send/recv)")
    g = trace.graphs[min(trace.graphs)]
    coll = g.type == NodeType.COMM_COLL_NODE
    out = g.select(~coll).with_rank(0)
    meta = TraceMeta(world_size=1, device_properties=list(trace.meta.device_properties), source=trace.meta.source,
                     extra=dict(trace.meta.extra))
    return prove(Trace(meta, {0: out}, trace.strings), "strip_data_parallel")


def scale_trace(
    trace: Trace,
    batch: int | None = None,
    seq: int | None = None,
    dims: dict[str, Any] | None = None,
    dp: int | None = None,
    tp: int | None = None,
    sp: bool = False,
    pp: int | None = None,
    schedule: str = "1f1b",
    micro_batches: int | None = None,
    ep: int | None = None,
    world: int | None = None,
    fit: Any = None,
    bucket_mb: float = 25.0,
    stages: list[int] | None = None,
    device_bytes: int | None = None,
    ddp_host_work: bool = True,
    pp_split: str = "time",
    dp_overlap: bool = True,
) -> Trace:
    """Rescale and re-parallelize ``trace`` (see the module docstring); every step is structurally proven.

    ``dims`` maps other dimension names to ``new`` or ``(old, new)``; ``fit`` is a calibrated
    compute model (:class:`ettools.replay.calibrate.Fit` or its file) for rescaled durations;
    ``stages`` gives the layers per pipeline stage; ``device_bytes`` adds the memory check (peak
    live tensor bytes per rank within the device) to the final proof; ``ddp_host_work`` adds DDP's
    reducer host work to the data-parallel pass (:func:`~ettools.scaler.dp.data_parallel`);
    ``pp_split`` is ``"time"`` (stages balanced by measured time) or ``"ops"`` (TrioSim's equal
    forward-op counts); ``dp_overlap=False`` is standard data parallelism (every gradient
    all-reduce after the whole backward pass) instead of DDP's overlapped buckets. Returns ``trace`` itself
    when nothing is asked.
    """
    before = set(trace.meta.process_groups)
    parallel = any(x not in (None, 1) for x in (tp, pp, ep)) or (micro_batches not in (None, 1) and pp)
    W = _world(trace)
    if W > 1 and not axes_of(trace.meta):
        if parallel:
            dp = dp if dp is not None else (None if world is not None else W)
            trace = strip_data_parallel(trace)
        elif dp is not None or world is not None:
            target = world if world is not None else dp * 1
            if dp is not None and world is not None and dp != world:
                raise ScaleError(f"dp={dp} and world={world} disagree for a data-parallel capture")
            if batch is not None or seq is not None or dims:
                trace = rescale(trace, batch=batch, seq=seq, dims=dims, fit=fit)
            return mark_rewritten(reshard(trace, int(target)))
    if batch is not None or seq is not None or dims:
        trace = rescale(trace, batch=batch, seq=seq, dims=dims, fit=fit)
    if ep and ep > 1:
        trace = expert_parallel(trace, ep, bucket_mb=bucket_mb)
    if tp and tp > 1:
        trace = tensor_parallel(trace, tp, sp=sp)
    elif sp:
        raise ScaleError("sequence parallelism (--sp) needs tensor parallelism (--tp > 1)")
    if (pp and pp > 1) or (pp and micro_batches not in (None, 1)):
        trace = pipeline_parallel(trace, pp, schedule=schedule, micro_batches=micro_batches, stages=stages,
                                  split=pp_split)
    if world is not None:
        cur = _world(trace)
        want_dp = world // cur if dp is None else dp
        if dp is not None and cur * dp != world:
            raise ScaleError(f"world={world} is not the {cur} ranks of the plan times dp={dp}")
        if world % cur:
            raise ScaleError(f"world={world} is not a multiple of the plan's {cur} ranks")
        dp = want_dp
    if dp and dp > 1:
        axes = axes_of(trace.meta)
        if axes and axes[-1][0] == "dp":
            trace = reshard(trace, axes[-1][1] * dp)
        else:
            trace = data_parallel(trace, dp, bucket_mb=bucket_mb, host_work=ddp_host_work, overlap=dp_overlap)
    if device_bytes is not None:
        prove(trace, "scale_trace", device_bytes)
    _require_used_groups(before, trace)
    return mark_rewritten(trace)


def mark_rewritten(trace: Trace) -> Trace:
    """Say in each rank graph's metadata (``durations = "rewritten"``, kept in Chakra files) that its
    durations are a rewrite's, derived from measured ones of another plan: a replay then compares
    nothing with the source's measured step as if this plan had been measured. Estimates stay
    estimates."""
    for g in trace.graphs.values():
        if str(g.meta.get("durations", "")) != "estimated":
            g.meta["durations"] = "rewritten"
    return trace


def _require_used_groups(before: set[str], trace: Trace) -> None:
    """A process group the rewrite declared that no communication node uses is an error (a silent no-op pass)."""
    new = set(trace.meta.process_groups) - before
    unused = sorted(new - used_groups(trace.graphs))
    if unused:
        pg = trace.meta.process_groups[unused[0]]
        raise ScaleError(f"the rewrite declares process group {unused[0]!r} (ranks {list(pg.ranks)[:8]}) but no "
                         f"communication uses it{f' (and {len(unused) - 1} more)' if len(unused) > 1 else ''}: "
                         "the pass found nothing to communicate")


__all__ = ["is_data_parallel_capture", "scale_trace", "strip_data_parallel"]
