"""Plan search for serving (``ettools serve --search``): engine plans and the prefill:decode split.

The candidates on ``gpus`` GPUs are every engine plan ``tp × pp × ep`` from the given axis values
that divides the GPUs (colocated: prefill and decode on the same engines), and every
disaggregated split — a prefill pool of ``prefill_gpus`` for each given fraction of the GPUs, each
pool with its own plan (prefill and decode prefer different degrees: STAGE's finding that prefill
wants low EP and decode high EP). Each candidate serves the same workload in
:func:`.sim.simulate_serving`; its engine costs (:class:`.cost.StepCost` or a serving fit) are built
once per plan and shared. A plan *meets the SLO* when the share of its requests within both
``slo_ttft_ms`` and ``slo_tpot_ms`` is at least ``attainment``; plans are ranked meeting first, then
by goodput (requests within the SLOs per second) per GPU, then by P90 end-to-end latency. A plan
the synthesizer refuses (heads or experts that do not divide) or with no room for the KV cache is
listed as invalid with its reason.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from .cost import StepCost
from .sim import simulate_serving
from .workload import Workload


def _plans(n: int, tps: list[int], pps: list[int], eps: list[int]) -> list[tuple[int, int, int]]:
    return [(t, p, e) for t, p, e in itertools.product(tps, pps, eps) if n % (t * p * e) == 0]


def _label(plan: dict[str, Any]) -> str:
    d = plan["decode"]
    dec = f"tp{d[0]} pp{d[1]} ep{d[2]}"
    if not plan["prefill_gpus"]:
        return f"colocated {dec}"
    p = plan["prefill"]
    return f"prefill {plan['prefill_gpus']} GPUs tp{p[0]} pp{p[1]} ep{p[2]} | decode {dec}"


def search_serving(model: str | Path, workload: Workload, *, gpus: int, slo_ttft_ms: float | None,
                   slo_tpot_ms: float | None, tps: list[int] = (1, 2, 4, 8), pps: list[int] = (1,),
                   eps: list[int] = (1,), prefill_fractions: list[float] = (0.25, 0.5, 0.75),
                   attainment: float = 0.9, system: str | Path | dict[str, Any] = "H100",
                   dims: dict[str, int] | None = None, dtype: str = "bf16", timing: str = "measured",
                   fit: dict[str, Any] | None = None, **serve_kw: Any) -> list[dict[str, Any]]:
    """Every candidate plan (see the module docstring), ranked; each row: ``rank``, ``label``,
    ``decode``/``prefill`` plans (tp, pp, ep), ``prefill_gpus``, ``meets_slo``, ``goodput_per_gpu``
    and the serve metrics, or ``invalid`` with a reason."""
    if slo_ttft_ms is None and slo_tpot_ms is None:
        raise ValueError("a serving search needs an SLO: --slo-ttft and/or --slo-tpot")
    costs: dict[tuple[int, int, int], StepCost | str] = {}

    def cost(plan: tuple[int, int, int]) -> StepCost | str:
        if plan not in costs:
            t, p, e = plan
            try:
                if fit is not None:
                    from .fit import FitCost

                    costs[plan] = FitCost(fit, model, tp=t, pp=p, ep=e, system=system, dims=dims, dtype=dtype)
                else:
                    costs[plan] = StepCost(model, tp=t, pp=p, ep=e, system=system, dims=dims, dtype=dtype,
                                           timing=timing, network=serve_kw.get("network"))
            except ValueError as err:
                costs[plan] = str(err)
        return costs[plan]

    cands: list[dict[str, Any]] = [{"prefill_gpus": 0, "prefill": None, "decode": d}
                                   for d in _plans(gpus, tps, pps, eps)]
    for f in prefill_fractions:
        pg = int(round(f * gpus))
        if not 0 < pg < gpus:
            continue
        for pre in _plans(pg, tps, pps, eps):
            for dec in _plans(gpus - pg, tps, pps, eps):
                cands.append({"prefill_gpus": pg, "prefill": pre, "decode": dec})
    rows = []
    for c in cands:
        row: dict[str, Any] = {"label": _label(c), **c}
        dc = cost(c["decode"])
        pc = cost(c["prefill"]) if c["prefill"] else None
        bad = next((x for x in (dc, pc) if isinstance(x, str)), None)
        if bad is None:
            try:
                res = simulate_serving(model, workload, gpus=gpus, system=system, dims=dims, dtype=dtype,
                                       prefill_gpus=c["prefill_gpus"] or None, slo_ttft_ms=slo_ttft_ms,
                                       slo_tpot_ms=slo_tpot_ms, cost=dc, prefill_cost=pc, **serve_kw)
            except ValueError as err:
                bad = str(err)
        if bad is not None:
            row["invalid"] = bad
            rows.append(row)
            continue
        j = res.to_json()
        row.update({"meets_slo": bool((j["slo_attainment"] or 0.0) >= attainment),
                    "slo_attainment": j["slo_attainment"], "goodput_rps": j["goodput_rps"],
                    "goodput_per_gpu": j["goodput_rps"] / gpus, "throughput_rps": j["throughput_rps"],
                    "ttft_ms": j["ttft_ms"], "tpot_ms": j["tpot_ms"], "e2e_ms": j["e2e_ms"],
                    "preemptions": j["preemptions"]})
        rows.append(row)
    valid = [r for r in rows if "invalid" not in r]
    valid.sort(key=lambda r: (not r["meets_slo"], -r["goodput_per_gpu"],
                              r["e2e_ms"]["p90"] if r["e2e_ms"]["p90"] is not None else float("inf")))
    for i, r in enumerate(valid, 1):
        r["rank"] = i
    return valid + [r for r in rows if "invalid" in r]


def search_lines(rows: list[dict[str, Any]], top: int = 10) -> list[str]:
    """Human lines: the ranked plans (best first), then how many were invalid."""
    out = ["rank  SLO   goodput/GPU  attain  TTFT p90 ms  TPOT p90 ms  plan"]
    for r in rows[:top]:
        if "invalid" in r:
            break
        out.append(f"{r['rank']:>4}  {'yes' if r['meets_slo'] else 'no ':3}  {r['goodput_per_gpu']:11.3f}  "
                   f"{100 * (r['slo_attainment'] or 0):5.1f}%  {r['ttft_ms']['p90'] or 0:11.1f}  "
                   f"{r['tpot_ms']['p90'] or 0:11.1f}  {r['label']}")
    bad = [r for r in rows if "invalid" in r]
    if bad:
        out.append(f"{len(bad)} invalid plan(s), e.g. {bad[0]['label']}: {bad[0]['invalid']}")
    return out


def parse_space(text: str) -> dict[str, list[Any]]:
    """``"tp=1,2,4 pp=1 ep=1 prefill=0.25,0.5"`` → the keyword axes of :func:`search_serving`."""
    out: dict[str, list[Any]] = {}
    names = {"tp": "tps", "pp": "pps", "ep": "eps", "prefill": "prefill_fractions"}
    for item in text.replace(";", " ").split():
        key, _, vals = item.partition("=")
        if key not in names or not vals:
            raise ValueError(f"--space: expected tp=, pp=, ep= or prefill= with values, got {item!r}")
        try:
            v = [float(x) if key == "prefill" else int(x) for x in vals.split(",")]
        except ValueError:
            raise ValueError(f"--space: bad value in {item!r}") from None
        if key != "prefill" and any(x < 1 for x in v) or key == "prefill" and any(not 0 <= x < 1 for x in v):
            raise ValueError(f"--space: {item!r} out of range (degrees >= 1, prefill fractions in [0, 1))")
        out[names[key]] = [x for x in v if x > 0] if key == "prefill" else v
    return out
