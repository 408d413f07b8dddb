"""Calibrated compute model: time of a device op as a function of its FLOPs and bytes, fitted on a
real trace (``ettools calibrate TRACE -o FIT``) and reused on other traces, batch sizes and models.

Model, per key: ``t = a + b·FLOPs + c·bytes + d·threads`` (µs) with ``a, b, c, d ≥ 0``, fitted by
non-negative least squares on the *relative* error (each sample's row divided by its measured time,
so small and large kernels weigh alike — the fit minimizes the squared percentage error), with
scipy's ``nnls``. Keys, most specific first:

1. the exact launch — op name plus launch geometry (``grid`` × ``block`` attributes of a Kineto
   kernel, when the graph carries them): the median time of that launch (a calibration table: the
   same kernel launched the same way on the same device takes the same time);
2. the op's own name (a kernel signature, an ``aten::`` op, a synthesized op name) when the trace
   had at least ``MIN_SAMPLES`` of it: the linear model;
3. its op class (:mod:`ettools.classify`: GeMM, Attention, ElementWise, Memory, Others);
4. everything.

A key whose samples all have the same features, or no features, predicts their median time
(``median_us``). Features: FLOPs and bytes from :func:`.features.node_features` (``num_ops``/
``tensor_size``, or the shapes of the PyTorch ET op that launched the kernel); ``threads`` =
∏grid · ∏block from the launch geometry. Kineto kernels carry no FLOPs; their launch geometry is
the only size signal, so a Kineto-only fit predicts other batch sizes through ``threads``.

The fit is a small JSON file (:meth:`Fit.save` / :meth:`Fit.load`)::

    {"format": "ettools-compute-fit", "version": 1, "model": "...", "source": "...",
     "samples": 1875, "global": {"a": .., "b": .., "c": .., "n": .., "median_us": ..},
     "by_class": {"GeMM": {...}, ...}, "by_name": {"<name>": {...}, ...}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ettools.classify import CLASSES, classify_names
from ettools.errors import TraceError
from ettools.graph import RankGraph, Trace
from ettools.io import atomic_write, load_json

from .features import is_model_target, node_features

MIN_SAMPLES = 3
_FORMAT = "ettools-compute-fit"


@dataclass
class Samples:
    """Device-op samples for fitting: names, classes, features and measured times (µs)."""

    names: list[str]
    classes: np.ndarray  # index into CLASSES
    flops: np.ndarray
    nbytes: np.ndarray
    dur: np.ndarray
    threads: np.ndarray | None = None  # ∏grid·∏block, -1 unknown
    launch: list[str] | None = None  # "grid|block" of each sample, "" unknown

    def __post_init__(self) -> None:
        if self.threads is None:
            self.threads = np.full(len(self.dur), -1.0)
        if self.launch is None:
            self.launch = [""] * len(self.dur)

    def __len__(self) -> int:
        return len(self.dur)

    def subset(self, mask: np.ndarray) -> Samples:
        """The samples where ``mask`` holds."""
        idx = np.flatnonzero(mask)
        il = idx.tolist()
        return Samples([self.names[i] for i in il], self.classes[idx], self.flops[idx],
                       self.nbytes[idx], self.dur[idx], self.threads[idx], [self.launch[i] for i in il])


def launch_geometry(g: RankGraph) -> tuple[np.ndarray, list[str]]:
    """``(threads, launch key)`` per node from the ``grid``/``block`` attributes (-1 / "" where absent)."""
    n = len(g)
    threads = np.full(n, -1.0)
    key = [""] * n
    grid, block = g.attrs.get("grid"), g.attrs.get("block")
    if grid is None or block is None:
        return threads, key
    bd = block.as_dict()
    for r, gv in zip(grid.rows.tolist(), grid.values):
        bv = bd.get(r)
        if bv is None:
            continue
        gv, bv = list(gv), list(bv)
        threads[r] = float(np.prod(gv, dtype=np.float64) * np.prod(bv, dtype=np.float64))
        key[r] = f"{gv}|{bv}"
    return threads, key


def graph_samples(g: RankGraph, features: tuple[np.ndarray, np.ndarray] | None = None) -> Samples:
    """Samples of one rank graph: every device compute op with a measured duration > 0."""
    f, b = features if features is not None else node_features(g)
    rows = np.flatnonzero(is_model_target(g) & np.isfinite(g.dur) & (g.dur > 0))
    names = g.strings.decode(g.name[rows])
    cls = classify_names(g.name[rows], g.strings) if len(rows) else np.zeros(0, np.int8)
    th, lk = launch_geometry(g)
    return Samples(names, cls, f[rows], b[rows], g.dur[rows].astype(np.float64), th[rows],
                   [lk[r] for r in rows.tolist()])


def kernel_samples(trace: Trace) -> Samples:
    """Samples of every rank of ``trace`` (see :func:`graph_samples`)."""
    parts = [graph_samples(trace.graphs[r]) for r in trace.ranks]
    return Samples(sum((p.names for p in parts), []), np.concatenate([p.classes for p in parts]),
                   np.concatenate([p.flops for p in parts]), np.concatenate([p.nbytes for p in parts]),
                   np.concatenate([p.dur for p in parts]), np.concatenate([p.threads for p in parts]),
                   sum((p.launch for p in parts), []))


def _fit_one(f: np.ndarray, b: np.ndarray, t: np.ndarray, th: np.ndarray | None = None) -> dict[str, float]:
    """NNLS on relative error; constant features (or none) give the median."""
    from scipy.optimize import nnls

    med = float(np.median(t))
    out = {"a": med, "b": 0.0, "c": 0.0, "d": 0.0, "n": int(len(t)), "median_us": med}
    f = np.where(f >= 0, f, np.nan)
    b = np.where(b >= 0, b, np.nan)
    th = np.full(len(t), np.nan) if th is None else np.where(th >= 0, th, np.nan)
    cols = []
    names = []
    for arr, nm in ((f, "b"), (b, "c"), (th, "d")):
        if np.isfinite(arr).all() and np.ptp(arr) > 0:
            cols.append(arr)
            names.append(nm)
    if not cols or len(t) < 2:
        return out
    X = np.column_stack([np.ones(len(t))] + cols)
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    A = (X / scale) / t[:, None]
    coef, _ = nnls(A, np.ones(len(t)))
    coef = coef / scale
    out["a"] = float(coef[0])
    for nm, c in zip(names, coef[1:]):
        out[nm] = float(c)
    out["features"] = names
    return out


@dataclass
class Fit:
    """A fitted compute model (see the module docstring)."""

    by_name: dict[str, dict[str, float]] = field(default_factory=dict)
    by_launch: dict[str, float] = field(default_factory=dict)  # "name|grid|block" -> median µs
    by_class: dict[str, dict[str, float]] = field(default_factory=dict)
    global_: dict[str, float] = field(default_factory=dict)
    source: str = ""
    samples: int = 0

    @classmethod
    def from_samples(cls, s: Samples, source: str = "") -> Fit:
        """Fit every key of ``s``."""
        if not len(s):
            raise ValueError("no device ops with measured durations to fit")
        fit = cls(source=source, samples=len(s))
        fit.global_ = _fit_one(s.flops, s.nbytes, s.dur, s.threads)
        for c in np.unique(s.classes).tolist():
            m = s.classes == c
            fit.by_class[CLASSES[c]] = _fit_one(s.flops[m], s.nbytes[m], s.dur[m], s.threads[m])
        table: dict[str, list[float]] = {}
        for nm, lk, d in zip(s.names, s.launch, s.dur.tolist()):
            if lk:
                table.setdefault(f"{nm}|{lk}", []).append(d)
        fit.by_launch = {k: float(np.median(v)) for k, v in sorted(table.items())}
        names = np.asarray(s.names, object)
        uniq, inv = np.unique(names, return_inverse=True)
        counts = np.bincount(inv)
        order = np.argsort(inv, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(counts)))
        for k, nm in enumerate(uniq.tolist()):
            if counts[k] < MIN_SAMPLES:
                continue
            idx = order[bounds[k]:bounds[k + 1]]
            fit.by_name[nm] = _fit_one(s.flops[idx], s.nbytes[idx], s.dur[idx], s.threads[idx])
        return fit

    # ---- prediction ---------------------------------------------------------------------------
    @staticmethod
    def _apply(p: dict[str, float], f: np.ndarray, b: np.ndarray, th: np.ndarray) -> np.ndarray:
        feats = p.get("features", [])
        t = np.full(len(f), p["a"], np.float64)
        have = np.ones(len(f), bool)
        for key, x in (("b", f), ("c", b), ("d", th)):
            if key in feats:
                have &= x >= 0
                t = t + p[key] * np.maximum(x, 0)
        return np.where(have, t, p.get("median_us", p["a"]))

    def predict(self, names: list[str], classes: np.ndarray, flops: np.ndarray, nbytes: np.ndarray,
                threads: np.ndarray | None = None, launch: list[str] | None = None) -> np.ndarray:
        """Predicted µs for each op (name, class index, FLOPs, bytes, threads, launch key)."""
        n = len(names)
        out = np.full(n, np.nan)
        th = np.full(n, -1.0) if threads is None else threads
        names_a = np.asarray(names, object)
        done = np.zeros(n, bool)
        if self.by_launch and launch is not None:
            for i, (nm, lk) in enumerate(zip(names, launch)):
                if lk:
                    v = self.by_launch.get(f"{nm}|{lk}")
                    if v is not None:
                        out[i] = v
                        done[i] = True
        if self.by_name and n:
            uniq, inv = np.unique(names_a, return_inverse=True)
            for k, nm in enumerate(uniq.tolist()):
                p = self.by_name.get(nm)
                if p is None:
                    continue
                m = (inv == k) & ~done
                if m.any():
                    out[m] = self._apply(p, flops[m], nbytes[m], th[m])
                    done |= m
        for c in np.unique(classes[~done]).tolist() if (~done).any() else []:
            p = self.by_class.get(CLASSES[c]) or self.global_
            m = ~done & (classes == c)
            out[m] = self._apply(p, flops[m], nbytes[m], th[m])
        return out

    def predict_samples(self, s: Samples) -> np.ndarray:
        """Predicted µs of every sample."""
        return self.predict(s.names, s.classes, s.flops, s.nbytes, s.threads, s.launch)

    def predict_graph(self, g: RankGraph, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Predicted µs of every model target of ``g`` (NaN elsewhere)."""
        out = np.full(len(g), np.nan)
        rows = np.flatnonzero(is_model_target(g))
        if not len(rows):
            return out
        names = g.strings.decode(g.name[rows])
        cls = classify_names(g.name[rows], g.strings)
        th, lk = launch_geometry(g)
        out[rows] = self.predict(names, cls, flops[rows], nbytes[rows], th[rows], [lk[r] for r in rows.tolist()])
        return out

    # ---- files --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"format": _FORMAT, "version": 1,
                "model": "t_us = a + b*flops + c*bytes + d*threads, a..d >= 0, NNLS on relative error; "
                         "keys: launch (name|grid|block median), name, class, global",
                "source": self.source, "samples": self.samples, "global": self.global_,
                "by_class": dict(sorted(self.by_class.items())), "by_name": dict(sorted(self.by_name.items())),
                "by_launch": self.by_launch}

    def save(self, path: str | Path) -> Path:
        """Write the fit as JSON (atomically)."""
        path = Path(path)
        with atomic_write(path) as f:
            f.write(json.dumps(self.to_dict(), indent=1, sort_keys=False).encode())
        return path

    @classmethod
    def load(cls, path: str | Path) -> Fit:
        """Read a fit written by :meth:`save`."""
        p = Path(path)
        d = load_json(p)
        if not isinstance(d, dict) or d.get("format") != _FORMAT:
            raise TraceError(p, f"not an ettools compute fit (expected format {_FORMAT!r})")
        return cls(d.get("by_name", {}), d.get("by_launch", {}), d.get("by_class", {}), d.get("global", {}),
                   d.get("source", ""), int(d.get("samples", 0)))


def load_fit(path: str | Path) -> Any:
    """A fit file: an op cost model (:class:`.opmodel.OpModel`, ``format: ettools-op-model``,
    written by ``ettools calibrate`` from traces with shapes or op-time tables) or a per-trace
    :class:`Fit` (``format: ettools-compute-fit``)."""
    from .opmodel import FORMAT, OpModel

    p = Path(path)
    d = load_json(p)
    if isinstance(d, dict) and d.get("format") == FORMAT:
        return OpModel.from_dict(d, str(p))
    return Fit.load(p)


def calibrate(trace: Trace) -> Fit:
    """Fit the compute model on every device op of ``trace`` with a measured duration."""
    s = kernel_samples(trace)
    if not len(s):
        raise TraceError(trace.meta.source or "<trace>", "no device ops with measured durations to calibrate on")
    return Fit.from_samples(s, source=trace.meta.source)


def mape(pred: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute percentage error, in %."""
    ok = np.isfinite(pred) & (actual > 0)
    return float(100.0 * np.mean(np.abs(pred[ok] - actual[ok]) / actual[ok])) if ok.any() else float("nan")


# ---- op cost models (issue 12) ---------------------------------------------------------------------

def _group_of(p: Path) -> str:
    """The model/run a data file belongs to (its folder, skipping generic folder names)."""
    for part in reversed(p.parts[:-1]):
        if part not in ("kineto", "et", "compute", "a100", "h100", "h100_dgx", "a100_dgx") and not part.startswith("rank"):
            return part
    return p.stem


def op_samples_from(paths: list[str | Path]) -> tuple[Any, list[dict[str, Any]]]:
    """Op samples (:class:`.opsamples.OpSamples`) of Kineto traces with ``Input Dims`` and Vidur
    op-time tables (``mlp.csv``, ``attention.csv``), and a source record per file (path, kind,
    samples, device). One-line :class:`TraceError` naming a file that is neither."""
    from .opsamples import (
        OpSamples,
        kineto_op_samples,
        vidur_attention_samples,
        vidur_decode_samples,
        vidur_mlp_samples,
    )

    out = OpSamples()
    sources: list[dict[str, Any]] = []
    for p in map(Path, paths):
        if p.suffix == ".csv":
            head = p.open().readline() if p.exists() else ""
            if not head:
                raise TraceError(p, "no such file or empty")
            if "attn_prefill" in head:
                s, kind = vidur_attention_samples(p, group=_group_of(p) + "/attention"), "vidur attention.csv"
                s.extend(vidur_decode_samples(p, group=_group_of(p) + "/attention"))
            elif "num_tokens" in head:
                s, kind = vidur_mlp_samples(p, group=_group_of(p)), "vidur mlp.csv"
            else:
                raise TraceError(p, "not a Vidur op-time table (mlp.csv or attention.csv)")
            sources.append({"path": str(p), "kind": kind, "samples": len(s)})
        else:
            s, summ = kineto_op_samples(p, group=_group_of(p))
            sources.append({"path": str(p), "kind": "kineto", "samples": len(s),
                            "device": summ["device"].get("name"), "compute_kernel_us": round(summ["compute_us"], 3),
                            "linked_kernel_us": round(summ["linked_us"], 3)})
        out.extend(s)
    return out, sources


def fit_op_model(paths: list[str | Path], gpu: str | None = None, cv: bool = True,
                 donors: list[Any] | None = None) -> tuple[Any, dict[str, Any] | None]:
    """Fit an :class:`.opmodel.OpModel` on ``paths`` (see :func:`op_samples_from`) for ``gpu`` (a
    hardware preset; default: the device the first Kineto trace names). With ``cv``, each class's
    leave-one-model-out MAPE is stored in the fit and the cross-validation result returned.
    ``donors``: other GPUs' fits lending what these kernels do not measure
    (:meth:`.opmodel.OpModel.borrow_misaligned`); default the shipped fits."""
    from .devices import identify_device, load_hardware
    from .opmodel import OP_CLASSES, OpModel, cross_validate
    from .opsamples import kineto_device

    if gpu is None:
        kin = [Path(p) for p in paths if Path(p).suffix != ".csv"]
        if not kin:
            raise TraceError(str(paths[0]), "op-time tables name no GPU: give --gpu")
        gpu = identify_device(kineto_device(kin[0])).preset
    hw = load_hardware(gpu)
    sms = hw.sms
    s, sources = op_samples_from(paths)
    if not len(s):
        raise TraceError(str(paths[0]), "no ops with shapes and measured kernels to fit")
    cols = s.arrays()
    model = OpModel.fit(cols, hw.preset, hw, sms, sources)
    if donors is None:
        from .opregistry import shipped_op_models

        donors = list(shipped_op_models().values())
    model.borrow_misaligned(donors)
    model.borrow_decode(donors, hw)
    res = None
    if cv and len(set(cols["group"].tolist())) > 1:
        res = cross_validate(cols, hw.preset, hw, sms, donors)  # each fold borrows as the fit did
        for name, v in res["per_class"].items():
            if name in model.classes and np.isfinite(v["mape_pct"]):
                model.classes[name].cv_mape = round(v["mape_pct"], 2)
        for c in ("gemm", "attention"):
            if f"{c}_shaped" in model.classes and c in res["per_class"]:
                model.classes[f"{c}_shaped"].cv_mape = round(res["per_class"][c]["mape_pct"], 2)
        # the shape-free GEMM form on its own (synthesized ops use it)
        free = {k: v.copy() for k, v in cols.items()}
        for k in ("m", "n", "k"):
            free[k] = np.full(len(free["dur"]), -1.0)
        r2 = cross_validate(free, hw.preset, hw, sms)
        for c in ("gemm", "attention"):
            if c in model.classes and c in r2["per_class"]:
                model.classes[c].cv_mape = round(r2["per_class"][c]["mape_pct"], 2)
            res[f"shape_free_{c}_mape_pct"] = r2["per_class"].get(c, {}).get("mape_pct")
        res["classes"] = list(OP_CLASSES)
    return model, res


def report_lines(model: Any, res: dict[str, Any] | None) -> list[str]:
    """The ``calibrate --report`` table: per class n, fitted constants, cross-validated MAPE; per
    held-out model, predicted vs measured total time."""
    lines = [f"op model for {model.gpu} ({model.sms} SMs) from {len(model.sources)} files"]
    lines.append(f"{'class':<14}{'n':>7}{'floor us':>10}{'W GB/s':>9}{'P TFLOP/s':>22}{'CV MAPE %':>11}")
    for k, c in sorted(model.classes.items()):
        P = ", ".join(f"{d} {v / 1e12:.0f}" for d, v in c.P.items()) if c.P else "-"
        cvm = f"{c.cv_mape:.1f}" if c.cv_mape is not None else "-"
        lines.append(f"{k:<14}{c.n:>7}{c.a:>10.2f}{c.W / 1e9:>9.0f}{P:>22}{cvm:>11}")
    if res:
        lines.append("leave-one-model-out total time (fit on the others):")
        for g, v in res["per_group"].items():
            lines.append(f"  {g:<34} measured {v['measured_us'] / 1e3:10.3f} ms  predicted "
                         f"{v['predicted_us'] / 1e3:10.3f} ms  {v['error_pct']:+6.1f} %  (coverage {100 * v['coverage']:.0f} %)")
    return lines
