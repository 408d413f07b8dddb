"""Pipeline schedules: which forward/backward work a stage runs, in which order.

A *unit* is ``("F"|"B", micro_batch, chunk)``: the forward or backward pass of one micro-batch
through one model chunk of the stage (a stage holds ``vpp`` chunks under the interleaved
schedule, one otherwise). Orders follow Megatron-LM:

* ``gpipe``: every forward, then every backward (micro-batches in order);
* ``1f1b``: ``pp - stage - 1`` warm-up forwards, then alternate one forward and one backward,
  then the remaining backwards (with ``pp == 1`` this is F0 B0 F1 B1 …);
* ``interleaved``: Megatron's interleaved 1F1B over ``vpp`` chunks per stage, micro-batches in
  groups of ``pp`` (needs ``micro_batches % pp == 0``);
* ``deepspeed``: DeepSpeed's pipeline engine (``TrainSchedule``): ``2·(m + pp − 1)`` steps; a
  stage runs forwards on steps of its own parity and backwards on the others, so a step may be
  idle (``"IF"``/``"IB"`` units, micro-batch −1: no compute, but the step still exchanges with its
  neighbours — a forward step receives its activation then sends the previous step's input
  gradient, a backward step sends the previous step's activation then receives its gradient;
  each exchange is blocking);
* ``zb-h1``: zero-bubble ZB-H1 (Qi et al., ICLR 2024): the backward split into ``B`` (input
  gradients) and ``W`` (weight gradients, ``"W"`` units); 1F1B's warm-up, then F, B and a W
  whenever more than ``stage`` weight gradients are pending (stage 0 computes each W right after
  its B; stage s keeps s pending, which it runs while later stages' gradients are on their way),
  one W after each cool-down B, the rest at the end. Same in-flight forwards as 1F1B; bubble
  (p − 1)(T_F + T_B − T_W) instead of 1F1B's (p − 1)(T_F + T_B + T_W);
* ``dualpipe``: DeepSeek-V3's bidirectional DualPipe (two copies of the model, two chunks per
  stage, overlapped forward/backward pairs ``OF``/``OB``, some backwards split ``I``/``W``): see
  :mod:`.dualpipe`.
"""

from __future__ import annotations

from .dualpipe import Unit, dualpipe_units


def stage_units(schedule: str, pp: int, stage: int, micro_batches: int, vpp: int = 1) -> list[Unit]:
    """The ordered units of ``stage`` (0-based) under ``schedule``."""
    m = micro_batches
    if schedule == "deepspeed":
        return deepspeed_steps(pp, stage, m)
    if schedule == "zb-h1":
        return zb_h1_units(pp, stage, m)
    if schedule == "dualpipe":
        return dualpipe_units(pp, stage, m)
    if schedule == "gpipe":
        return [("F", i, c) for i in range(m) for c in range(vpp)] + \
               [("B", i, c) for i in range(m) for c in reversed(range(vpp))]
    if schedule == "1f1b" or vpp == 1:
        warm = min(pp - stage - 1, m)
        out: list[Unit] = [("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            out.append(("F", warm + i, 0))
            out.append(("B", i, 0))
        out += [("B", i, 0) for i in range(m - warm, m)]
        return out
    if schedule != "interleaved":
        raise ValueError(f"unknown schedule {schedule!r}")
    if m % pp:
        raise ValueError(f"the interleaved schedule needs micro-batches ({m}) to be a multiple of pp ({pp})")
    total = m * vpp

    def fwd(k: int) -> Unit:
        return ("F", (k // (pp * vpp)) * pp + k % pp, (k // pp) % vpp)

    def bwd(k: int) -> Unit:
        return ("B", (k // (pp * vpp)) * pp + k % pp, vpp - 1 - (k // pp) % vpp)

    warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp, total)
    out = [fwd(k) for k in range(warm)]
    for i in range(total - warm):
        out.append(fwd(warm + i))
        out.append(bwd(i))
    out += [bwd(k) for k in range(total - warm, total)]
    return out


def deepspeed_steps(pp: int, stage: int, micro_batches: int) -> list[Unit]:
    """DeepSpeed ``TrainSchedule``'s steps of ``stage``: a forward on the steps whose parity is the
    stage's, a backward on the others; the micro-batch of a step lags the step by the stage's
    distance from the first stage (forward) or the last (backward). A step whose micro-batch is out
    of range is idle: ``("IF"|"IB", -1, 0)``."""
    m, out = micro_batches, []
    for t in range(2 * (m + pp - 1)):
        fwd = t % 2 == stage % 2
        half = t // 2 if t % 2 == 0 else (t - 1) // 2
        if fwd:
            mb = half - stage // 2
        elif t % 2 == 0:  # even step, odd stage
            mb = half - pp + (stage + 1) // 2
        else:  # odd step, even stage
            mb = half - pp + 1 + stage // 2
        kind = "F" if fwd else "B"
        out.append((kind, mb, 0) if 0 <= mb < m else ("I" + kind, -1, 0))
    return out


def zb_h1_units(pp: int, stage: int, micro_batches: int) -> list[Unit]:
    """ZB-H1's order on ``stage``: ``pp - stage - 1`` warm-up forwards; then F, B and a W whenever
    more than ``stage`` weight gradients are pending; in the cool-down a W after each B; the
    remaining Ws last."""
    m = micro_batches
    warm = min(pp - stage - 1, m)
    out: list[Unit] = [("F", i, 0) for i in range(warm)]
    nb = nw = 0
    for i in range(m - warm):
        out += [("F", warm + i, 0), ("B", nb, 0)]
        nb += 1
        if nb - nw > stage:
            out.append(("W", nw, 0))
            nw += 1
    while nb < m:
        out.append(("B", nb, 0))
        nb += 1
        if nw < nb:
            out.append(("W", nw, 0))
            nw += 1
    out += [("W", i, 0) for i in range(nw, m)]
    return out


def split_layers(n_layers: int, parts: int) -> list[int]:
    """Layers per virtual stage: as even as possible, earlier parts take the remainder."""
    if parts > n_layers:
        raise ValueError(f"{parts} pipeline chunks for only {n_layers} layers")
    base, extra = divmod(n_layers, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
