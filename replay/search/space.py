"""The plan space of ``ettools search``: which parallel plans exist, which are distinct, which are valid.

A *plan* is a plain dict (see :data:`PLAN_KEYS`): ``dp``/``tp``/``pp``/``ep``/``cp`` degrees, ``sp``
(Megatron sequence parallelism over the TP group), ``zero`` (0 DDP, 1/2 sharded optimizer/gradients,
3 FSDP), ``recompute`` (full activation recomputation), ``micro_batch`` (samples per data-parallel
rank per micro-batch, Megatron's ``--micro-batch-size``), ``schedule`` (gpipe, 1f1b, interleaved),
``vpp`` (model chunks per stage under interleaved) and ``bucket_mb`` (DDP gradient bucket MiB; None:
one bucket per module). ``dp`` follows from the GPU count: ``gpus / (tp · cp · pp)``.

Plans that cannot differ are one plan (their canonical form): a schedule with ``pp == 1``, ``sp`` with
``tp == 1``, a ZeRO stage with ``dp == 1``, ``vpp`` off the interleaved schedule. Validity is checked
arithmetically here (no synthesis): the degrees must multiply to the GPU count, the batch must split
into whole micro-batches per data-parallel rank, the sequence, heads and experts must divide as the
synthesizer requires (its own check), each virtual pipeline stage needs a layer, and the interleaved
schedule needs micro-batches in multiples of ``pp`` (Megatron-LM's rule).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

PLAN_KEYS = ("dp", "tp", "pp", "ep", "cp", "sp", "zero", "recompute", "micro_batch", "schedule", "vpp",
             "bucket_mb")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
# what each axis ranges over when the user does not restrict it
DEFAULTS: dict[str, list[Any]] = {
    "tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8, 16], "cp": [1], "ep": [1], "sp": [False, True],
    "zero": [0, 1, 2, 3], "recompute": [False, True], "micro_batch": [1, 2, 4, 8],
    "schedule": list(SCHEDULES), "vpp": [2], "bucket_mb": [None],
}
AXES = tuple(DEFAULTS) + ("dp",)


# what one axis value may be: a parallel degree sizes a plan's ranks, a micro-batch its tensors, a
# bucket its buffers; beyond these they overflowed (or divided by zero) in the plan's arithmetic
MAX_DEGREE = 1 << 20
MAX_MICRO_BATCH = 1 << 40
MAX_BUCKET_MB = float(1 << 20)
MAX_VPP = 1 << 10


def parse_values(axis: str, text: str) -> list[Any]:
    """``"1,2,4"`` → values of ``axis`` (ints, booleans, schedule names, bucket MiB or ``none``),
    each range-checked (a ValueError naming the option otherwise)."""
    name = f"--{axis.replace('_', '-')}"
    out: list[Any] = []
    for part in str(text).split(","):
        p = part.strip().lower()
        if not p:
            continue
        if axis == "schedule":
            if p not in SCHEDULES:
                raise ValueError(f"--schedule: unknown schedule {p!r} ({', '.join(SCHEDULES)})")
            out.append(p)
        elif axis in ("sp", "recompute"):
            if p not in ("0", "1", "true", "false", "on", "off", "yes", "no"):
                raise ValueError(f"--{axis}: expected 0/1, got {p!r}")
            out.append(p in ("1", "true", "on", "yes"))
        elif axis == "bucket_mb":
            if p in ("none", "0"):
                out.append(None)
                continue
            try:
                mb = float(p)
            except ValueError:
                raise ValueError(f"{name}: expected MiB or 'none', got {p!r}") from None
            if not 0 < mb <= MAX_BUCKET_MB:  # NaN and inf too
                raise ValueError(f"{name}: {p} is outside (0, {MAX_BUCKET_MB:,.0f}] MiB")
            out.append(mb)
        else:
            try:
                v = int(p)
            except ValueError:
                raise ValueError(f"{name}: expected integers, got {p!r}") from None
            lo, hi = {"zero": (0, 3), "micro_batch": (1, MAX_MICRO_BATCH), "vpp": (1, MAX_VPP)}.get(axis, (1, MAX_DEGREE))
            if not lo <= v <= hi:
                raise ValueError(f"{name}: {v} is out of range {lo}..{hi:,}")
            out.append(v)
    if not out:
        raise ValueError(f"--{axis.replace('_', '-')}: no values given")
    return list(dict.fromkeys(out))


@dataclass
class Space:
    """The values each axis may take (``dp`` None: whatever the GPU count leaves)."""

    values: dict[str, list[Any]] = field(default_factory=lambda: {k: list(v) for k, v in DEFAULTS.items()})
    dp: list[int] | None = None

    def restrict(self, axis: str, values: list[Any]) -> None:
        """Limit ``axis`` to ``values``."""
        if axis == "dp":
            self.dp = [int(v) for v in values]
        elif axis in self.values:
            self.values[axis] = list(values)
        else:
            raise ValueError(f"unknown search axis {axis!r} ({', '.join(AXES)})")

    def describe(self) -> dict[str, Any]:
        """JSON-ready description of the space."""
        return {**self.values, "dp": self.dp if self.dp is not None else "gpus / (tp*cp*pp)"}

    def canonical_plans(self, gpus: int) -> Iterator[dict[str, Any]]:
        """Every distinct plan of the space, canonical form, each once (invalid ones included)."""
        seen: set[str] = set()
        v = self.values
        for tp, cp, pp, ep, sp, zero, rc, mb, sched, vpp, bucket in itertools.product(
                v["tp"], v["cp"], v["pp"], v["ep"], v["sp"], v["zero"], v["recompute"], v["micro_batch"],
                v["schedule"], v["vpp"], v["bucket_mb"]):
            n = tp * cp * pp
            dp = gpus // n if gpus % n == 0 else gpus / n
            if self.dp is not None and dp not in self.dp:
                continue
            plan = canonical({"dp": dp, "tp": tp, "pp": pp, "ep": ep, "cp": cp, "sp": sp, "zero": zero,
                              "recompute": rc, "micro_batch": mb, "schedule": sched, "vpp": vpp,
                              "bucket_mb": bucket})
            k = plan_key(plan)
            if k not in seen:
                seen.add(k)
                yield plan


def canonical(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan with settings that change nothing normalized (see the module docstring)."""
    p = dict(plan)
    p["sp"] = bool(p["sp"]) and p["tp"] > 1
    p["recompute"] = bool(p["recompute"])
    if p["pp"] == 1:
        p["schedule"] = "1f1b"
    if p["schedule"] != "interleaved":
        p["vpp"] = 1
    if isinstance(p["dp"], int) and p["dp"] == 1:
        p["zero"] = 0
    if isinstance(p["dp"], float) and p["dp"].is_integer():
        p["dp"] = int(p["dp"])
    return {k: p[k] for k in PLAN_KEYS}


def plan_key(plan: dict[str, Any]) -> str:
    """A stable text key of a plan (cache key, de-duplication)."""
    b = plan["bucket_mb"]
    return (f"dp={plan['dp']},tp={plan['tp']},pp={plan['pp']},ep={plan['ep']},cp={plan['cp']},"
            f"sp={int(plan['sp'])},zero={plan['zero']},rc={int(plan['recompute'])},mb={plan['micro_batch']},"
            f"sched={plan['schedule']},vpp={plan['vpp']},bucket={'none' if b is None else f'{b:g}'}")


def state_key(plan: dict[str, Any]) -> str:
    """What a plan's resident state (weights, gradients, optimizer states per rank) depends on: the
    plan without micro-batch size, recompute and — when each stage holds one chunk — the schedule."""
    p = dict(plan, micro_batch=0, recompute=False)
    if p["vpp"] == 1:
        p["schedule"] = "-"
    return plan_key(p)


def plan_label(plan: dict[str, Any]) -> str:
    """Short human label: ``dp16 tp8 pp8 sp z1 mb1 1f1b`` (only what is on)."""
    parts = [f"dp{plan['dp']}", f"tp{plan['tp']}", f"pp{plan['pp']}"]
    if plan["cp"] > 1:
        parts.append(f"cp{plan['cp']}")
    if plan["ep"] > 1:
        parts.append(f"ep{plan['ep']}")
    if plan["sp"]:
        parts.append("sp")
    parts.append(f"z{plan['zero']}")
    if plan["recompute"]:
        parts.append("rc")
    parts.append(f"mb{plan['micro_batch']}")
    if plan["pp"] > 1:
        parts.append(plan["schedule"] + (f"/v{plan['vpp']}" if plan["schedule"] == "interleaved" else ""))
    if plan["bucket_mb"] is not None:
        parts.append(f"b{plan['bucket_mb']:g}")
    return " ".join(parts)


def micro_batches(plan: dict[str, Any], batch: int) -> int:
    """Micro-batches per step of a valid plan."""
    return batch // (plan["dp"] * plan["micro_batch"])


def invalid_reason(plan: dict[str, Any], gpus: int, batch: int, dims: dict[str, int]) -> str | None:
    """Why ``plan`` cannot run (one line), or None. Arithmetic only: no synthesis."""
    from ettools.converters.symbolic.distribute import Plan
    from ettools.converters.symbolic.synth import _check_divisible

    dp, tp, pp, cp = plan["dp"], plan["tp"], plan["pp"], plan["cp"]
    if not isinstance(dp, int) or dp * tp * pp * cp != gpus:
        return f"tp*cp*pp = {tp * cp * pp} does not divide {gpus} GPUs"
    if dp % plan["ep"]:
        return f"ep {plan['ep']} does not divide dp {dp}"
    if batch % (dp * plan["micro_batch"]):
        return f"batch {batch} does not split into micro-batches of {plan['micro_batch']} over dp {dp}"
    m = batch // (dp * plan["micro_batch"])
    L = dims.get("L")
    if L is not None and pp * plan["vpp"] > L:
        return f"{pp * plan['vpp']} pipeline chunks for {L} layers"
    if plan["schedule"] == "interleaved" and m % pp:
        return f"interleaved needs micro-batches ({m}) in multiples of pp ({pp})"
    try:
        p = Plan(tp=tp, cp=cp, dp=dp, ep=plan["ep"], pp=pp, sp=plan["sp"], zero=plan["zero"],
                 schedule=plan["schedule"], vpp=plan["vpp"], micro_batches=m)
        _check_divisible(dims, p, dp * plan["micro_batch"], batch)
    except ValueError as e:
        return str(e)
    return None
