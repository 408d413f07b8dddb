"""``ettools calibrate --serving``: fit per-iteration cost on serving traces (:mod:`.fit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ettools.cli_options import _fail


def _lines(rows: list[dict[str, Any]], head: str) -> list[str]:
    out = [head]
    for r in rows:
        out.append(f"  {r['kind']:>7} {r['tokens']:>6,} tokens, context {r['decode_context']:>7,}, "
                   f"pairs {r['prefill_pairs']:>12,.0f}: measured {r['measured_us'] / 1e3:9.3f} ms, "
                   f"predicted {r['predicted_us'] / 1e3:9.3f} ms ({100 * r['error']:+.1f} %)")
    return out


def calibrate_serving(inputs: list[Path], out: Path, steps: str | None, model: str | None,
                      dims: dict[str, int], predict_fit: Path | None) -> None:
    """Fit ``inputs``' serving iterations, write the fit to ``out`` and print its own errors (and,
    with ``predict_fit``, another fit's prediction of these iterations scaled to ``model``)."""
    from ettools.formats import load_trace

    from .fit import fit_serving, load_fit, model_features, predict, save_fit
    from .steps import serving_steps

    rows: list[dict[str, Any]] = []
    for p in inputs:  # one trace per file: each is its own iteration set
        rows += serving_steps(load_trace([p], steps=steps).trace)
    if not rows:
        _fail(f"{inputs[0]}: cannot calibrate: no serving iterations (vLLM/SGLang execute_… spans)")
    feats = None
    if model is not None:
        try:
            feats = model_features(model, dims or None)
        except (ValueError, KeyError) as e:
            _fail(f"calibrate --model {model}: {e}")
    other = None
    if predict_fit is not None:
        try:
            other = load_fit(predict_fit)
        except ValueError as e:
            _fail(str(e))
        if bool(other.get("features")) != bool(feats):
            _fail(f"{predict_fit}: predicting across models needs --model here and in the fit's calibrate")
    fit = fit_serving(rows, feats, model, " ".join(map(str, inputs)))
    save_fit(fit, out)
    c = fit["coef"]
    lines = [f"wrote {out} ({len(rows)} iterations): a {c['a_us'] / 1e3:.3f} ms + b {c['b_us_per_token']:.3f} us/token"
             f" + c {c['c_us_per_context_token'] * 1e3:.3f} ns/context token + d {c['d_us_per_pair'] * 1e6:.3f} ps/pair"]
    lines += [f"  note: {n}" for n in fit["notes"]]
    h = fit.get("host")
    if h is not None:
        lines.append(f"host overhead (GPU waiting for the host): {h['const_us'] / 1e3:.3f} ms + "
                     f"{h['per_seq_us']:.2f} us/sequence per iteration")
        lines += [f"  note: {n}" for n in h["notes"]]
        for r in h["iterations"]:
            lines.append(f"  {r['kind']:>7} {r['seqs']:>4} seqs: GPU waits {r['device_wait_us'] / 1e3:6.3f} ms "
                         f"(fit {r['predicted_us'] / 1e3:6.3f}); host busy {r['host_us'] / 1e3:7.3f} ms, graph launch "
                         f"{r['graph_launch_us'] / 1e3:6.3f} ms, {r['python_events']:,} Python events profiled")
    lines += _lines(fit["iterations"], "own iterations:")
    if other is not None:
        pred = predict(other, rows, feats)
        lines += _lines(pred, f"predicted by {predict_fit} ({other.get('model')}, scaled to {model}):")
    click.echo("\n".join(lines))
