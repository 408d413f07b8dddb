"""Fitting an op model's class constants on measured kernels (least squares on log time).

:func:`fit_classes` fits every class with enough samples (:func:`_fit_class`; the shaped attention
form on a few shapes by :func:`_fit_attention_few`), :func:`fit_contention` the slowdown of kernels
that ran beside a collective. :meth:`.opmodel.OpModel.fit` puts them together; the forms are
:mod:`.opclass`'s.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .devices import Hardware
from .opclass import (
    _FORM,
    _MIN_FLOOR_US,
    _SHAPED,
    DECODE_KEY,
    MIN_CLASS_SAMPLES,
    ClassFit,
    RowFacts,
    class_key,
    decode_rows,
    misaligned,
    peak_flops_dtype,
)
from .opfeatures import (
    ATTENTION,
    CONV,
    DTYPES,
    EMBEDDING,
    FLASH_TILE,
    GEMM,
    MEM_KINDS,
    MEMORY,
    OP_CLASSES,
    OTHER,
)

_ALONE = 0.1  # an op with less of its kernel time beside a collective kernel than this ran alone
_TILES = (64, 128, 256)
_ATTN_TILES = (64, 128)  # query rows per FlashAttention thread block (FA2/FA3, CK tiles)


def _fit_class(cols: dict[str, np.ndarray], form: str, sms: int, shaped: bool, hw: Hardware,
               work: str = "gemm", a_min: float = 0.0) -> ClassFit:
    """Least squares on log time for one class (see module doc); ``a_min``: a lower bound of the
    per-kernel floor."""
    from scipy.optimize import least_squares

    # a dtype group gets its own FLOP rate only with enough distinct sizes (repeated kernels of one
    # shape are one point: a few skinny shapes of one trace would set a rate for every shape); its
    # rows are fitted then. Other groups take a fitted group's rate at the data-sheet ratio (rate()).
    sizes = np.stack([cols["flops"], cols["nbytes"]], axis=1)
    dts = [d for d in DTYPES if len(np.unique(sizes[cols["dtype"] == d], axis=0)) >= MIN_CLASS_SAMPLES] \
        if form == "compute" else []
    if form == "compute" and not dts:  # few sizes of any: the class's rate is its commonest group's
        cnt = [(cols["dtype"] == d).sum() for d in DTYPES]
        dts = [DTYPES[int(np.argmax(cnt))]] if max(cnt) >= MIN_CLASS_SAMPLES else []
    if form == "compute":
        keep = np.isin(cols["dtype"], dts)
        if not keep.any():
            raise ValueError("no dtype group with enough samples")
        cols = {k: v[keep] for k, v in cols.items()}
    if shaped and work == "attention" and _distinct_shapes(cols) < MIN_CLASS_SAMPLES:
        return _fit_attention_few(cols, sms, hw, dts, a_min)
    t = cols["dur"]
    logt = np.log(t)
    bw0 = float(hw.hbm_gbps) * 1e9
    a0 = float(np.percentile(t, 5))

    # memory kinds with enough samples get their own bandwidth (parameters after a and W)
    # — only kinds with enough kernels big enough to show it (≥ 5 µs of bytes at the data-sheet
    # bandwidth); small kernels only measure the floor
    kcol = cols.get("kind")
    big = cols["nbytes"] / (float(hw.hbm_gbps) * 1e9) >= 5e-6
    kinds = [i for i in range(len(MEM_KINDS)) if kcol is not None and (big & (kcol == i)).sum() >= MIN_CLASS_SAMPLES] \
        if form == "memory" else []
    # ... and their own per-kernel floor: a norm or reduction kernel does a block reduction and
    # two passes over its rows, so its launch-to-finish time is about twice an elementwise one's
    # (the fitted floors: data/op_models). Only kinds with enough distinct
    # sizes of small kernels (below 5 µs of bytes at the data-sheet bandwidth: their time is mostly
    # floor; repeated kernels of one size are one point) from at least two sources: one workload's
    # kernels of a kind share its geometry (one trace's column sums and another's row sums of the
    # same sizes take very different times), a floor of that workload, not of the kind
    grp = cols.get("group")

    def _sources(sel: np.ndarray) -> int:
        return len(np.unique(grp[sel])) if grp is not None else 2

    fkinds = [i for i in range(len(MEM_KINDS)) if kcol is not None
              and len(np.unique(cols["nbytes"][~big & (kcol == i)])) >= MIN_CLASS_SAMPLES
              and _sources(~big & (kcol == i)) >= 2] if form == "memory" else []

    def build(x: np.ndarray, tile: int) -> ClassFit:
        a, W = np.exp(x[0]), np.exp(x[1])
        if form == "memory":
            return ClassFit("memory", a, W, Wk={MEM_KINDS[k]: float(np.exp(x[2 + i])) for i, k in enumerate(kinds)},
                            ak={MEM_KINDS[k]: float(np.exp(x[2 + len(kinds) + i])) for i, k in enumerate(fkinds)})
        P = {d: float(np.exp(x[2 + i])) for i, d in enumerate(dts)}
        p = 1.0 + np.exp(x[2 + len(dts)])
        k0 = float(np.exp(x[3 + len(dts)])) if tile else 0.0
        sk = float(1.0 / (1.0 + np.exp(-x[4 + len(dts)]))) if tile and fit_skip and not fit_app else 1.0
        app = float(np.exp(x[4 + len(dts)])) if tile and fit_skip and fit_app else 0.0
        ma = float(1.0 / (1.0 + np.exp(-x[4 + len(dts)]))) if tile and fit_align else 1.0
        return ClassFit("compute", float(a), float(W), P, float(p), tile, k0, work=work, d_ref=d_ref, skip=sk, append=app,
                        peaks=dict(hw.peak_tflops), misalign=ma)

    facts = RowFacts.of(cols) if form == "compute" else None  # the same for every trial of the constants

    def resid(x: np.ndarray, tile: int) -> np.ndarray:
        return np.log(np.maximum(build(x, tile).predict(cols, sms, facts), 1e-6)) - logt

    x0 = [np.log(max(a0 * 0.5, 1e-3)), np.log(bw0 * 0.5)]
    lo_w = lo_a = -np.inf
    if kinds or fkinds:
        # the shared bandwidth and floor (kinds without their own) are the one-bandwidth,
        # one-floor fit of every row: the class's floor, a lower bound of the compute classes'
        # and the ratio transfer_to moves the floors of kinds without a pair by
        base = _fit_class({k: v for k, v in cols.items() if k != "kind"}, form, sms, shaped, hw)
        x0 = [np.log(base.a), np.log(base.W)]
        lo_w = np.log(base.W) - 1e-3  # held (a bound of ±0.1 %: least_squares needs lb < ub)
        lo_a = np.log(base.a) - 1e-3 if fkinds else -np.inf
        x0 += [np.log(base.W)] * len(kinds) + [np.log(base.a)] * len(fkinds)
    # no kernel that moves enough bytes to show a bandwidth (every one under 5 µs of bytes at the
    # data-sheet bandwidth): their times are the floor, and a bandwidth fitted on them is whatever
    # makes the largest of them slow (one small optimizer kernel of a tiny trace can put a GPU's
    # memory class at a few % of its HBM); it is the data sheet's, only the floor is fitted
    pinned = form == "memory" and not big.any() and not (kinds or fkinds)
    if pinned:
        lo_w = np.log(bw0) - 1e-3
        x0[1] = np.log(bw0)
    if form == "compute":
        x0 += [np.log(peak_flops_dtype(hw.peak_tflops, d) * 0.5) for d in dts] + [np.log(2.0)]
    best: tuple[float, ClassFit] | None = None
    d_ref = 0.0
    fit_skip = fit_app = False
    # the rate of unaligned GEMMs is seen only with enough distinct unaligned shapes
    mis = misaligned(cols) if shaped and work == "gemm" else np.zeros(0, bool)
    if mis.any():
        # ... among kernels that do measurable math: an unaligned GEMM whose FLOPs take less than
        # the class's fastest kernels (5th percentile of time) at the data-sheet peak is launch
        # bound, its time says nothing of its rate
        dt_u, inv = np.unique(np.asarray(cols["dtype"]).astype(str), return_inverse=True)
        peak = np.array([peak_flops_dtype(hw.peak_tflops, d) for d in dt_u])[np.ravel(inv)]
        mis &= cols["flops"] / peak * 1e6 >= a0
    fit_align = bool(mis.any()) and len(np.unique(np.stack([cols[k][mis] for k in ("m", "n", "k", "batch")], axis=1),
                                                  axis=0)) >= MIN_CLASS_SAMPLES
    if shaped and work == "attention":
        hd = cols.get("hdim", np.zeros(0))
        d_ref = float(np.median(hd[hd > 0])) if (hd > 0).any() else 128.0
        # how much of the masked half the kernels skip is seen only where causal ops differ in
        # seq_q/seq_kv (a chunk after a cache); elsewhere the kernels' own convention (all of it)
        cz = (cols.get("causal", np.zeros(0)) > 0) & (cols["m"] > 0) & (cols["n"] > 0)
        fit_skip = len(np.unique(np.round(cols["m"][cz] / cols["n"][cz], 2))) >= 3
        # ... and where those are kernels that append the chunk's K/V to the cache (causal == 2),
        # the extra cost of a chunk key over a cache key instead: FlashAttention's kvcache kernel
        # skips the masked blocks, but every query tile first copies the new keys it sees (A100
        # Vidur table: a chunk key costs about 3x a cache key per tile, fitted over c >= 512)
        fit_app = fit_skip and bool((cols["causal"][cz] >= 2).any())
    for tile in ((_ATTN_TILES if work == "attention" else _TILES) if shaped else (0,)):
        xs = np.array(x0 + ([np.log(32.0)] if tile else []) + ([2.0] if tile and (fit_skip or fit_align) else []), float)
        if tile and fit_app:
            xs[-1] = 0.0  # κ = 1 to start
        # physical ceilings (data sheet): a FLOP rate at most the dtype's tensor-core peak, a
        # bandwidth at most twice HBM (small working sets run from cache); floors unbounded
        hi = np.full(len(xs), np.inf)
        hi[1] = np.log(2.0 * bw0) if not (kinds or fkinds or pinned) else lo_w + 2e-3
        if fkinds:
            hi[0] = lo_a + 2e-3
        hi[2:2 + len(kinds)] = np.log(2.0 * bw0)
        for i, d in enumerate(dts):
            hi[2 + i] = np.log(peak_flops_dtype(hw.peak_tflops, d))
        xs = np.minimum(xs, hi - 1e-6)
        lo = np.full(len(xs), -np.inf)
        lo[0], lo[1] = lo_a, lo_w
        lo[2 + len(kinds):2 + len(kinds) + len(fkinds)] = np.log(_MIN_FLOOR_US)  # no kernel launches faster
        xs = np.maximum(xs, lo + 1e-6)
        if a_min > 0:
            lo[0] = np.log(a_min)
            xs[0] = max(xs[0], lo[0] + 1e-3)
        r = least_squares(resid, xs, args=(tile,), loss="soft_l1", f_scale=0.1, max_nfev=400, bounds=(lo, hi))
        cost = float(np.mean(np.abs(np.expm1(resid(r.x, tile)))))
        if best is None or cost < best[0]:
            best = (cost, build(r.x, tile))
    assert best is not None
    cf = best[1]
    cf.n = int(len(t))
    cf.sizes = len(np.unique(np.stack([cols["flops"], cols["nbytes"]], axis=1), axis=0))
    return cf


def _fit_attention_few(cols: dict[str, np.ndarray], sms: int, hw: Hardware, dts: list[str],
                       a_min: float) -> ClassFit:
    """The shaped attention form fitted on a few distinct shapes (fewer than
    :data:`MIN_CLASS_SAMPLES`, at least two; one trace's attention has one shape): only the FLOP rate
    and the per-tile cost s0 are fitted — the two numbers a few shapes tell apart (one-wave kernels
    of short sequences are mostly per-tile cost, many-wave ones mostly rate). The rest is not
    identifiable there and is taken where it is measured: the floor is the per-kernel floor of the
    GPU's memory-bound kernels (``a_min``; without it the floor is fitted too, from three shapes),
    the query tile is FlashAttention's (:data:`.opfeatures.FLASH_TILE`; CK's too), bytes are at the
    data-sheet bandwidth and meet the FLOPs as the roofline's max (a fused kernel streams K/V
    behind its math), and the kernels skip the whole masked half."""
    from scipy.optimize import least_squares

    n_shapes = _distinct_shapes(cols)
    free_a = a_min <= 0
    if n_shapes < 2 + int(free_a):
        raise ValueError("too few attention shapes")
    hd = cols.get("hdim", np.zeros(0))
    d_ref = float(np.median(hd[hd > 0])) if (hd > 0).any() else 128.0
    bw0 = float(hw.hbm_gbps) * 1e9
    logt = np.log(cols["dur"])
    peaks = dict(hw.peak_tflops)

    def build(x: np.ndarray) -> ClassFit:
        a = float(np.exp(x[2])) if free_a else float(a_min)
        return ClassFit("compute", a, bw0, {d: float(np.exp(x[0])) for d in dts}, 1e3, FLASH_TILE,
                        float(np.exp(x[1])), work="attention", d_ref=d_ref, skip=1.0, peaks=peaks)

    hi = np.array([np.log(min(peak_flops_dtype(hw.peak_tflops, d) for d in dts)), np.inf] + ([np.inf] if free_a else []))
    x0 = np.array([hi[0] - np.log(4.0), np.log(64.0)] + ([np.log(max(float(np.min(cols["dur"])) * 0.5, 1e-3))]
                                                          if free_a else []))
    facts = RowFacts.of(cols)
    r = least_squares(lambda x: np.log(np.maximum(build(x).predict(cols, sms, facts), 1e-6)) - logt, x0,
                      loss="soft_l1", f_scale=0.1, max_nfev=400, bounds=(np.full(len(x0), -np.inf), hi))
    cf = build(r.x)
    cf.n = int(len(cols["dur"]))
    cf.sizes = len(np.unique(np.stack([cols["flops"], cols["nbytes"]], axis=1), axis=0))
    return cf


def _distinct_shapes(cols: dict[str, np.ndarray]) -> int:
    """Distinct known shapes among the rows: a shaped form has more constants (tile, per-tile cost)
    than a few shapes can tell apart — repeated kernels of one shape are one point."""
    sh = cols["m"] > 0
    if not sh.any():
        return 0
    key = np.stack([cols[k][sh] for k in ("m", "n", "k", "batch")] + [cols.get("hdim", cols["m"])[sh]], axis=1)
    return len(np.unique(key, axis=0))


def fit_classes(cols: dict[str, np.ndarray], ok: np.ndarray, ovl: np.ndarray, hw: Hardware,
                sms: int) -> dict[str, ClassFit]:
    """Fit every class with at least :data:`MIN_CLASS_SAMPLES` usable rows (``ok``; ``ovl``: each
    row's share overlapped with a collective kernel), in the order :meth:`.opmodel.OpModel.fit`
    stores them."""
    classes: dict[str, ClassFit] = {}
    # memory-bound classes first: their many tiny kernels measure the per-kernel floor, a lower
    # bound of every compute kernel's (a kernel that does nearly nothing takes at least the
    # launch-to-finish time of an elementwise one). A compute class's own data often cannot
    # tell its floor apart (GEMMs of one token are weight-read bound; the per-tile cost of the
    # shaped form absorbs it)
    a_min = 0.0
    decode = decode_rows(cols)
    _fit_decode(classes, cols, ok & decode, ovl, hw, sms)
    for c in (MEMORY, EMBEDDING, GEMM, ATTENTION, CONV):
        if c == GEMM and class_key(MEMORY, False) in classes:
            a_min = classes[class_key(MEMORY, False)].a
        if c == OTHER:
            continue  # custom ops: their arguments do not describe their work; not fitted
        sel = ok & (cols["cls"] == c) & ~decode
        if sel.sum() < MIN_CLASS_SAMPLES:
            continue
        # the class's terms are those of a kernel alone on the GPU: ops that ran beside a
        # collective kernel are fitted after (contention), where enough ran alone
        alone = sel & (ovl < _ALONE)
        if alone.sum() >= MIN_CLASS_SAMPLES:
            sel = alone
        sub = {k: v[sel] for k, v in cols.items()}
        if _FORM[c] == "compute":
            sub_ok = sub["flops"] > 0
            sub = {k: v[sub_ok] for k, v in sub.items()}
            if len(sub["dur"]) < MIN_CLASS_SAMPLES:
                continue
        try:
            classes[class_key(c, False)] = _fit_class(sub, _FORM[c], sms, False, hw, a_min=a_min)
            if c in _SHAPED and _distinct_shapes(sub) >= (2 if c == ATTENTION else MIN_CLASS_SAMPLES):
                classes[class_key(c, True)] = _fit_class(sub, "compute", sms, True, hw, _SHAPED[c],
                                                         a_min=a_min)
        except ValueError:
            continue
    return classes


def _fit_decode(classes: dict[str, ClassFit], cols: dict[str, np.ndarray], sel: np.ndarray,
                ovl: np.ndarray, hw: Hardware, sms: int) -> None:
    """The decode-attention fit (:data:`.opclass.DECODE_KEY`, memory form: a per-kernel floor and
    the bandwidth at which the kernels stream the cache) where at least :data:`MIN_CLASS_SAMPLES`
    distinct sizes of decode-like attention rows (``sel``) were measured."""
    alone = sel & (ovl < _ALONE)
    if alone.sum() >= MIN_CLASS_SAMPLES:
        sel = alone
    if len(np.unique(cols["nbytes"][sel])) < MIN_CLASS_SAMPLES:
        return
    sub = {k: v[sel] for k, v in cols.items()}
    sub["kind"] = np.full(len(sub["dur"]), -1)  # one bandwidth: the cache read, whatever the kernel
    try:
        classes[DECODE_KEY] = _fit_class(sub, "memory", sms, False, hw)
    except ValueError:
        pass


def fit_contention(classes: dict[str, ClassFit], predict: Callable[[dict[str, np.ndarray]], np.ndarray],
                   cols: dict[str, np.ndarray], rows: np.ndarray) -> None:
    """Contention: a kernel that runs beside a collective kernel shares the SMs (NCCL holds
    some for its channels) and memory bandwidth with it, so its time grows with the share of it
    overlapped: ``t·(1 + c·overlap)``. ``c`` is fitted (log time, soft-L1) on the rows of each
    class that overlapped, given the class's alone prediction — per class with at least
    :data:`MIN_CLASS_SAMPLES` distinct overlapped sizes, else one ``c`` over every class's
    overlapped rows (where those reach the count); no term without such data."""
    from scipy.optimize import least_squares

    if not rows.any():
        return
    sub = {k: v[rows] for k, v in cols.items()}
    pred = predict({**sub, "overlap": np.zeros(len(sub["dur"]))})
    good = np.isfinite(pred) & (pred > 0)
    if not good.any():
        return
    sub = {k: v[good] for k, v in sub.items()}
    r = np.log(sub["dur"]) - np.log(pred[good])
    ov = np.clip(sub["overlap"], 0.0, 1.0)

    def fit(sel: np.ndarray) -> float | None:
        if len(np.unique(np.stack([sub["flops"][sel], sub["nbytes"][sel]], 1), axis=0)) < MIN_CLASS_SAMPLES:
            return None
        res = least_squares(lambda x: np.log1p(np.exp(x[0]) * ov[sel]) - r[sel], [0.0], loss="soft_l1",
                            f_scale=0.1, bounds=([-20.0], [5.0]))
        return float(np.exp(res.x[0]))

    pooled = fit(np.ones(len(r), bool))
    for c in range(len(OP_CLASSES)):
        own = fit(sub["cls"] == c) if (sub["cls"] == c).any() else None
        v = own if own is not None else pooled
        if v is None:
            continue
        for k in (class_key(c, False), class_key(c, True)) + ((DECODE_KEY,) if c == ATTENTION else ()):
            if k in classes:
                classes[k].contention = v
