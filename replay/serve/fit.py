"""Per-iteration cost fitted on real serving traces (``ettools calibrate --serving``).

A serving iteration (:func:`.steps.serving_steps`: vLLM's or SGLang's ``execute_…`` spans) is
measured as its device time, split into attention kernels and the rest. The fit is the linear model

    rest      = a + b · tokens                      (weights read once per iteration; work per token)
    attention = c · decode context + d · prefill causal pairs   (KV read per cached token; QK/PV per pair)

``a``, ``b`` by least squares over the iterations' (tokens, rest) and ``c``, ``d`` over their
(decode context, prefill pairs, attention), both non-negative. With one distinct token count the
split of ``rest`` into ``a`` and ``b`` is unknown; ``a`` is then 0 (time proportional to tokens)
and the fit says so in ``notes``.

**Host overhead** (:func:`fit_host`): the GPU's wait for the host per iteration
(``device_wait_us`` of :func:`.steps.host_times`) as ``const + per_seq · sequences``, non-negative
least squares over the iterations (the constant alone, their mean, with one distinct sequence
count). It is the engine's and the host CPU's, so it is not scaled across models; the fit carries
it under ``host`` and :class:`FitCost` adds it to every iteration.

**Across models** each coefficient scales with the quantity that drives it (:func:`model_features`,
from the synthesizer's graph of the stated model): ``a`` with the weight bytes per GPU, ``b`` with
the non-attention FLOPs per token, ``c`` with the KV bytes per token, ``d`` with the attention FLOPs
per causal pair. Across engines (kernels, graph capture, quantization) and GPUs nothing is
scaled; :func:`predict` reports what it gives, error included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .cost import StepCost

FEATURES = ("weights_bytes", "flops_per_token", "kv_bytes_per_token", "attention_flops_per_pair")
COEF = ("a_us", "b_us_per_token", "c_us_per_context_token", "d_us_per_pair")
# which feature drives which coefficient
DRIVER = dict(zip(COEF, FEATURES))


def model_features(model: str | Path, dims: dict[str, int] | None = None, dtype: str = "bf16",
                   seq: int = 2048) -> dict[str, float]:
    """What drives each coefficient, for one GPU holding the whole model: weight bytes, FLOPs per
    token outside attention (a prefill of ``seq`` tokens, per token), KV bytes per token, and
    attention FLOPs per causal query-key pair — all read off synthesized graphs."""
    from ettools.converters.symbolic import synthesize
    from ettools.graph import NodeType

    def split(r: Any) -> tuple[float, float]:
        g = r.trace.graphs[0]
        comp = g.type == int(NodeType.COMP_NODE)
        ids = [i for i in np.unique(g.name[comp]).tolist() if g.strings[i].startswith("attention ")]
        att = comp & np.isin(g.name, ids)
        ops = np.clip(g.num_ops.astype(np.float64), 0, None)
        return float(ops[comp & ~att].sum()), float(ops[att].sum())

    ctx = 4096
    dec = synthesize(model, dims, phase="decode", batch=1, context=ctx, dtype=dtype, ranks=[0])
    pre = synthesize(model, dims, phase="prefill", batch=1, seq=seq, context=seq, dtype=dtype, ranks=[0])
    rest, att = split(pre)
    return {"weights_bytes": float(dec.stages[0].resident_bytes),
            "flops_per_token": rest / seq,
            "kv_bytes_per_token": float(dec.stages[0].kv_cache_bytes) / ctx,
            "attention_flops_per_pair": att / (seq * seq / 2.0)}


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    return nnls(A, y)[0]


def fit_host(steps: list[dict[str, Any]], source: str = "") -> dict[str, Any]:
    """Per-iteration host overhead ``{"const_us", "per_seq_us", "source", "notes", "iterations"}``
    fitted on ``steps``' ``device_wait_us`` against their sequence counts (see the module docstring)."""
    if not steps:
        raise ValueError("no serving iterations to fit the host overhead on")
    seqs = np.array([s["prefill_seqs"] + s["decode_seqs"] for s in steps], np.float64)
    wait = np.array([s["device_wait_us"] for s in steps], np.float64)
    notes = []
    if len(np.unique(seqs)) >= 2:
        c, k = _nnls(np.stack([np.ones_like(seqs), seqs], 1), wait)
    else:
        c, k = float(wait.mean()), 0.0
        notes.append("one sequence count: constant only")
    rows = [{"kind": s["kind"], "seqs": int(n), "tokens": s["tokens"], "device_wait_us": s["device_wait_us"],
             "host_us": s["host_us"], "graph_launch_us": s["graph_launch_us"], "python_events": s["python_events"],
             "predicted_us": float(c + k * n)} for s, n in zip(steps, seqs)]
    return {"const_us": float(c), "per_seq_us": float(k), "source": source, "notes": notes, "iterations": rows}


def fit_serving(steps: list[dict[str, Any]], features: dict[str, float] | None = None,
                label: str | None = None, source: str = "") -> dict[str, Any]:
    """The fit (a JSON-able dict) of ``steps`` (:func:`.steps.serving_steps` rows)."""
    if not steps:
        raise ValueError("no serving iterations (vLLM/SGLang execute_… spans) in the trace")
    tok = np.array([s["tokens"] for s in steps], np.float64)
    att = np.array([s["attention_us"] for s in steps], np.float64)
    rest = np.array([s["device_us"] for s in steps], np.float64) - att
    ctx = np.array([s["decode_context"] for s in steps], np.float64)
    pairs = np.array([s["prefill_pairs"] for s in steps], np.float64)
    notes = []
    if len(np.unique(tok)) >= 2:
        a, b = _nnls(np.stack([np.ones_like(tok), tok], 1), rest)
    else:
        a, b = 0.0, float(rest.sum() / tok.sum())
        notes.append("one token count: a = 0, b = rest time / tokens")
    X = np.stack([ctx, pairs], 1)
    used = X.any(0)
    cd = np.zeros(2)
    if used.any():
        cd[used] = _nnls(X[:, used], att)
    if not used[0]:
        notes.append("no decode context: c = 0")
    if not used[1]:
        notes.append("no prefill: d = 0")
    fit = {"kind": "serving_fit", "source": source, "model": label, "features": features,
           "coef": {"a_us": float(a), "b_us_per_token": float(b), "c_us_per_context_token": float(cd[0]),
                    "d_us_per_pair": float(cd[1])}, "notes": notes}
    if all("device_wait_us" in s for s in steps):
        fit["host"] = fit_host(steps, source)
    fit["iterations"] = predict(fit, steps)
    return fit


def scaled_coef(fit: dict[str, Any], features: dict[str, float] | None) -> dict[str, float]:
    """The fit's coefficients for a model with ``features`` (each times its driver's ratio);
    unchanged when either side has no features."""
    coef = dict(fit["coef"])
    src = fit.get("features")
    if not features or not src:
        return coef
    return {k: v * (features[DRIVER[k]] / src[DRIVER[k]] if src[DRIVER[k]] > 0 else 0.0) for k, v in coef.items()}


def iteration_us(coef: dict[str, float], tokens: float, decode_context: float, prefill_pairs: float) -> float:
    """One iteration's time under ``coef``."""
    return (coef["a_us"] + coef["b_us_per_token"] * tokens + coef["c_us_per_context_token"] * decode_context
            + coef["d_us_per_pair"] * prefill_pairs)


def predict(fit: dict[str, Any], steps: list[dict[str, Any]], features: dict[str, float] | None = None
            ) -> list[dict[str, Any]]:
    """Each step with the fit's prediction (scaled to ``features``) beside its measured device time."""
    coef = scaled_coef(fit, features)
    out = []
    for s in steps:
        p = iteration_us(coef, s["tokens"], s["decode_context"], s["prefill_pairs"])
        out.append({"kind": s["kind"], "tokens": s["tokens"], "decode_context": s["decode_context"],
                    "prefill_pairs": s["prefill_pairs"], "measured_us": s["device_us"],
                    "attention_us": s["attention_us"], "predicted_us": p,
                    "error": (p - s["device_us"]) / s["device_us"] if s["device_us"] > 0 else None})
    return out


def load_fit(path: str | Path) -> dict[str, Any]:
    """Read a fit written by :func:`save_fit` (``ValueError`` naming the file when it is not one)."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a serving fit: {e}") from None
    if not isinstance(d, dict) or d.get("kind") != "serving_fit" or not isinstance(d.get("coef"), dict) \
            or any(not isinstance(d["coef"].get(k), (int, float)) for k in COEF):
        raise ValueError(f"{path}: not a serving fit (ettools calibrate --serving writes one)")
    h = d.get("host")
    if h is not None and (not isinstance(h, dict) or any(not isinstance(h.get(k), (int, float)) or h[k] < 0
                                                         for k in ("const_us", "per_seq_us"))):
        raise ValueError(f"{path}: 'host' must hold non-negative const_us and per_seq_us")
    return d


def save_fit(fit: dict[str, Any], path: str | Path) -> None:
    """Write ``fit`` as JSON."""
    Path(path).write_text(json.dumps(fit, indent=1))


class FitCost(StepCost):
    """A :class:`StepCost` whose iterations are timed by a serving fit instead of replays.

    The fit was measured on one GPU holding the whole model; an engine of ``tp × pp × ep`` GPUs
    gets the fit scaled to its per-GPU share: weight bytes of its fullest rank, KV bytes per token
    of a rank over its ``ep`` attention-DP ranks, and FLOPs divided over its GPUs. Communication
    between the engine's GPUs is not added (the traces hold none).
    """

    def __init__(self, fit: dict[str, Any], model: str | Path, **kw: Any) -> None:
        if fit.get("host") and kw.get("host") is None:  # the fit's measured host overhead, unless one is given
            kw["host"] = {k: fit["host"][k] for k in ("const_us", "per_seq_us")} | {"source": fit.get("source", "")}
        super().__init__(model, **kw)
        self.fit = fit
        feats = None
        if fit.get("features"):
            whole = model_features(model, self.dims, self.dtype)
            feats = {"weights_bytes": float(self.weights_bytes),
                     "flops_per_token": whole["flops_per_token"] / self.gpus,
                     "kv_bytes_per_token": self.kv_bytes_per_token_rank / self.ep,
                     "attention_flops_per_pair": whole["attention_flops_per_pair"] / self.gpus}
        self.coef = scaled_coef(fit, feats)
        self.timing = "fit"

    @property
    def alpha_us(self) -> float:
        """Fitted µs per cached token read."""
        return self.coef["c_us_per_context_token"]

    @property
    def beta_us(self) -> float:
        """Fitted µs per causal query-key pair."""
        return self.coef["d_us_per_pair"]

    def iteration_us(self, n_tokens: float, n_logits: float, decode_context: float, prefill_pairs: float,
                     n_seqs: float | None = None) -> float:
        """The fitted iteration time (the LM head is inside ``a`` and ``b``) plus the host overhead."""
        if n_tokens <= 0:
            return 0.0
        return (iteration_us(self.coef, n_tokens, decode_context, prefill_pairs)
                + self.host_us(n_logits if n_seqs is None else n_seqs))

    def describe(self) -> dict[str, Any]:
        """The engine, plus the fit it uses."""
        d = super().describe()
        d["cost_fit"] = {"source": self.fit.get("source"), "model": self.fit.get("model"), "coef": self.coef}
        return d
