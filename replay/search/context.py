"""What every trial of one ``ettools search`` shares, and how a trial times compute: the search's
:class:`Context`, the ``synthesize`` arguments of a plan, and the replay's compute model for the
bounds (:mod:`.evaluate`, :mod:`.bound`, :mod:`.pathbound` all read these; none of them is read here).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

INF = float("inf")


@dataclass
class Context:
    """What every trial of one search shares (plain values: it travels to workers)."""

    model: str
    dims: dict[str, int] = field(default_factory=dict)
    gpus: int = 8
    batch: int = 8
    seq: int | None = None
    dtype: str = "bf16"
    system: str | None = None
    network: str | None = None
    collectives: str | None = None
    timing: str = "measured"
    memory_bytes: int = 0  # device memory per GPU (0: from the system)
    peak_flops: float = 0.0  # FLOP/s the bound divides by (the replay's own peak for the system)
    sample_flops: float = 0.0  # FLOPs of one sample through the model, no recompute (MFU numerator)
    sample_flops_rc: float = 0.0  # the same with activation recomputation
    default_seq: int = 0  # the model's sequence length when --seq is not given (tokens/s)

    def key(self) -> dict[str, Any]:
        """The fields results depend on (the cache key)."""
        d = asdict(self)
        for k in ("sample_flops", "sample_flops_rc", "peak_flops", "default_seq"):
            d.pop(k)
        return d


def synth_kwargs(ctx: Context, plan: dict[str, Any]) -> dict[str, Any]:
    """``synthesize`` keyword arguments of ``plan`` under ``ctx``."""
    return dict(dims=dict(ctx.dims), dp=plan["dp"], tp=plan["tp"], sp=bool(plan["sp"]), cp=plan["cp"],
                pp=plan["pp"], ep=plan["ep"], zero=plan["zero"], schedule=plan["schedule"],
                vpp=plan["vpp"] if plan["schedule"] == "interleaved" else None,
                recompute=bool(plan["recompute"]), batch=ctx.batch,
                micro_batch=plan["dp"] * plan["micro_batch"], seq=ctx.seq, dtype=ctx.dtype,
                bucket_mb=plan["bucket_mb"])


def timing_model(ctx: Context) -> tuple[str, Any, Any] | None:
    """``(mode, hardware, fit)`` the replay of a trial times compute nodes with, or None when an
    ASTRA-sim system file brings its own roofline (then no bound is claimed)."""
    from ettools.replay import compute as cm

    if ctx.collectives:
        return None
    hw = cm.load_hardware(ctx.system if ctx.system is not None else "H100", ctx.gpus)
    fit = None
    mode = ctx.timing
    if mode.startswith("calibrated:"):
        from ettools.replay.calibrate import Fit

        mode, fit = "calibrated", Fit.load(mode.split(":", 1)[1])
    return mode, hw, fit


def compute_us(g: Any, model: tuple[str, Any, Any]) -> np.ndarray:
    """Per node of a synthesized rank graph ``g`` (estimated durations already dropped): µs of
    each compute node as the replay's compute model times it, 0 elsewhere."""
    from ettools.graph import NodeType
    from ettools.replay import compute as cm

    mode, hw, fit = model
    dur, _src = cm.node_durations(g, mode, hw, fit)
    comp = cm.is_model_target(g) & (g.type == NodeType.COMP_NODE)
    return np.where(comp, np.nan_to_num(dur, nan=0.0), 0.0)
