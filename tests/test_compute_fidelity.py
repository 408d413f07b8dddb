"""Fidelity mechanisms of the op cost model (issue 12): fp32 GEMM/conv math mode (TF32 tensor cores
vs SIMT) from the kernel names, ``out=`` calls of elementwise ops, split-K of small grids, unaligned
GEMMs. Properties are read from the raw trace (gzip JSON parsed here) or from the hardware facts."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.replay.compute import load_hardware
from ettools.replay.opmodel import _gemm_work, misaligned
from ettools.replay.opsamples import CONV, GEMM, fp32_math, fp32_math_of_name, kineto_op_samples, op_features

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
HTA8 = SHARED / "traces" / "kineto" / "hta_8rank_rank3" / "rank3.json.gz"


class _Trace:
    """One raw Kineto trace, each reading of it done once for the tests of this module (the
    readings are only read): its events (parsed here with json), its op-sample columns (ettools),
    its kernels and its GEMM ops with their kernels (read here from the events)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @functools.cached_property
    def events(self) -> list[dict]:
        return read_json(self.path)["traceEvents"]

    @functools.cached_property
    def cols(self) -> dict[str, np.ndarray]:
        s, _ = kineto_op_samples(self.path)
        return s.arrays()

    @functools.cached_property
    def kernels(self) -> list[dict]:
        return _raw_kernels(self.events)

    @functools.cached_property
    def gemm_ops(self) -> list[tuple[str, list[list[int]], list[str], list[str], float]]:
        return _gemm_ops_with_kernels(self.events)


@pytest.fixture(scope="module")
def hta8() -> _Trace:
    """The A100 DLRM rank (read on first use; tests that need it skip without it)."""
    return _Trace(HTA8)


def test_fp32_math_from_kernel_names_and_defaults():
    """Tensor-core kernels of fp32 tensors are TF32, SIMT kernels fp32; without a kernel name PyTorch's
    defaults: matmul allow_tf32 False (GEMM fp32), cuDNN allow_tf32 True (conv tf32, where TF32 exists)."""
    assert fp32_math(GEMM, ["void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1>"]) == "tf32"
    assert fp32_math(CONV, ["sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc"]) == "tf32"
    assert fp32_math(GEMM, ["ampere_sgemm_128x64_nn", "splitKreduce_kernel"]) == "fp32"
    assert fp32_math(CONV, ["volta_scudnn_128x64_relu_interior_nn_v1"]) == "fp32"
    assert fp32_math(GEMM) == "fp32" and fp32_math(CONV) == "tf32" and fp32_math(CONV, has_tf32=False) == "fp32"
    assert fp32_math_of_name(GEMM, "aten::mm") == "fp32" and fp32_math_of_name(CONV, "aten::convolution") == "tf32"
    assert fp32_math_of_name(GEMM, "volta_sgemm_128x32_nt") == "fp32"


def test_hta_tf32_gemms_beat_the_simt_peak(hta8):
    """On the A100 DLRM trace, the GEMMs classified TF32 (their kernels are tensor-core kernels, read
    here from the raw JSON) run above the A100's fp32 SIMT peak, those classified fp32 never do."""
    if not HTA8.exists():
        pytest.skip("shared HTA trace absent")
    names = {e["name"] for e in hta8.events if e.get("cat") == "kernel"}
    assert any("tensorop_s1688gemm" in n for n in names) and any("sgemm" in n for n in names)
    c = hta8.cols
    g = (c["cls"] == GEMM) & (c["m"] > 0)
    rate = 2 * c["m"] * c["n"] * c["k"] * c["batch"] / (c["dur"] * 1e-6)
    fp32_peak = load_hardware("A100")["peak_tflops"]["fp32"] * 1e12
    tf, sp = g & (c["dtype"] == "tf32"), g & (c["dtype"] == "fp32")
    assert tf.sum() > 100 and sp.sum() > 10
    assert rate[sp].max() <= fp32_peak
    assert rate[tf].max() > 2 * fp32_peak


def test_out_variant_writes_its_output_once():
    """``aten::mul(x, scalar, out)`` (3 recorded arguments; the functional mul has 2) reads x and
    writes out: 2 tensors' bytes (and the 0-dim scalar), not 3."""
    x = [512, 2862]
    by = op_features("aten::mul", [x, [], x], ["float", "double", "float"]).nbytes
    assert by == 2 * 512 * 2862 * 4 + 8
    assert op_features("aten::mul", [x, x], ["float", "float"]).nbytes == 3 * 512 * 2862 * 4
    assert op_features("aten::add", [x, x, []], ["float", "float", "Scalar"]).nbytes == 3 * 512 * 2862 * 4


def test_split_k_spreads_a_small_grid_over_the_sms():
    """A one-tile GEMM with a long k runs as S split-K parts: the same wave work as S tiles of k/S."""
    sms, tile = 108, 64
    cols = {"m": np.array([64.0, 64.0 * sms]), "n": np.array([64.0, 64.0]), "k": np.array([sms * 640.0, 640.0]),
            "batch": np.array([1.0, 1.0]), "flops": np.zeros(2)}
    fk, f0 = _gemm_work(cols, sms, tile, 10.0)
    assert fk[0] == pytest.approx(fk[1]) and f0[0] == pytest.approx(f0[1])


def test_misaligned_leading_dims():
    """n or k not a multiple of 16 bytes of the element on a tensor-core dtype: 30522 half (vocab) and
    1705 tf32 are; 4096 is not; SIMT fp32 (no vector-width kernel variants) never is."""
    cols = {"n": np.array([30522.0, 4096, 1705, 4096, 1705]), "k": np.array([512.0, 4096, 1024, 1026, 1024]),
            "dtype": np.array(["half", "half", "tf32", "half", "fp32"], object)}
    assert misaligned(cols).tolist() == [True, False, True, True, False]


def _gemm_ops_with_kernels(ev: list[dict]) -> list[tuple[str, list[list[int]], list[str], list[str], float]]:
    """(op, Input Dims, Input type, its kernels' names, their summed µs) of every aten::mm/addmm/bmm
    of a raw Kineto trace's events: kernels linked by the correlation id of the launches inside the op."""
    import bisect

    kern = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "kernel" and "correlation" in e.get("args", {})}
    launches: dict = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches.setdefault(e["tid"], []).append(e)
    for v in launches.values():
        v.sort(key=lambda e: e["ts"])
    starts = {tid: [e["ts"] for e in v] for tid, v in launches.items()}
    out = []
    for o in ev:
        if o.get("cat") != "cpu_op" or o.get("name") not in ("aten::mm", "aten::addmm", "aten::bmm"):
            continue
        ls = launches.get(o["tid"], [])
        i = bisect.bisect_left(starts.get(o["tid"], []), o["ts"])
        ks = []
        while i < len(ls) and ls[i]["ts"] <= o["ts"] + o["dur"]:
            if ls[i]["args"]["correlation"] in kern:
                ks.append(kern[ls[i]["args"]["correlation"]])
            i += 1
        if ks:
            out.append((o["name"], o["args"]["Input Dims"], o["args"]["Input type"], [k["name"] for k in ks],
                        float(sum(k["dur"] for k in ks))))
    return out


def _mnk(op: str, dims: list[list[int]]) -> tuple[int, int, int, int]:
    a, b = [d for d in dims if d][1:3] if op == "aten::addmm" else dims[:2]
    return a[-2], b[-1], a[-1], a[0] if len(a) == 3 else 1


@pytest.mark.skipif(not HTA8.exists(), reason="shared traces not present")
def test_unaligned_rule_follows_the_kernels_cublas_picked(hta8):
    """On the A100 DLRM rank, cuBLAS picks ``align1`` tensor-core kernels (4-byte loads) mostly for
    the GEMMs :func:`misaligned` flags and almost never for the others (the dims carry no strides:
    a transposed operand's leading dimension is m); SIMT ``sgemm`` kernels have no vector-width
    variant, and :func:`misaligned` flags none of the fp32 (SIMT) rows."""
    flagged, clean = [], []
    simt = 0
    for op, dims, _, names, _ in hta8.gemm_ops:
        g = [n for n in names if "gemm" in n.lower() and "splitK" not in n]
        if not g:
            continue
        m, n, k, b = _mnk(op, dims)
        tc = "tensorop" in g[0]
        row = {"n": np.array([float(n)]), "k": np.array([float(k)]),
               "dtype": np.array(["tf32" if tc else "fp32"], object)}
        if not tc:
            assert "align" not in g[0]  # sgemm, gemv-like k=1 kernels
            assert not misaligned(row)[0]
            simt += 1
            continue
        (flagged if misaligned(row)[0] else clean).append("_align1" in g[0])
    assert simt >= 50 and len(flagged) >= 100 and len(clean) >= 500
    assert np.mean(flagged) > 0.5 and np.mean(clean) < 0.05


@pytest.mark.skipif(not HTA8.exists(), reason="shared traces not present")
def test_memory_bound_unaligned_gemms_are_slowed_as_a_whole(hta8):
    """A GEMM on an ``align1`` kernel (4-byte loads) moves its bytes slower too, not only its math:
    on the A100 DLRM rank (raw JSON) the align1 TF32 GEMMs whose operand bytes at the data-sheet
    bandwidth take longer than their FLOPs at the TF32 peak run at under half that bandwidth. The
    shipped A100 fit, whose unaligned share slows the whole kernel, predicts those rows within 15 %;
    a share that slowed only the FLOP term would leave them at their bytes' time (far under)."""
    from ettools.replay.compute import shipped_op_models

    hw = load_hardware("A100")
    bw, pk = hw["hbm_gbps"] * 1e9, hw["peak_tflops"]["tf32"] * 1e12
    eff = []
    for op, dims, _, names, us in hta8.gemm_ops:
        m, n, k, b = _mnk(op, dims)
        nbytes = 4.0 * b * (m * k + k * n + m * n)
        if any("tensorop" in x and "_align1" in x for x in names) and nbytes / bw > 2.0 * b * m * n * k / pk:
            eff.append(nbytes / (us * 1e-6) / bw)
    assert len(eff) >= 30 and np.median(eff) < 0.5
    c = hta8.cols
    sel = (c["cls"] == GEMM) & (c["dtype"] == "tf32") & misaligned(c) & (c["overlap"] < 0.1) & \
        (c["nbytes"] / bw > c["flops"] / pk)
    assert sel.sum() >= 30
    rows = {k: v[sel] for k, v in c.items()}
    fit = shipped_op_models()["A100"]
    assert fit.classes["gemm_shaped"].misalign < 0.9
    got = fit.predict(rows).sum() / rows["dur"].sum()
    assert 0.85 < got < 1.15
    # the same rows without the share (a share on the FLOP term alone barely moves a memory-bound row)
    from dataclasses import replace

    aligned = replace(fit.classes["gemm_shaped"], misalign=1.0).predict(rows, fit.sms)
    assert aligned.sum() / rows["dur"].sum() < 0.75


def test_unaligned_rate_is_lent_within_a_vendor():
    """The unaligned-GEMM rate is a property of the vendor's kernel library: an AMD fit does not
    borrow an NVIDIA fit's rate (MI300X's hipBLASLt runs bert's n = 30522 GEMM at its aligned
    prediction); an NVIDIA fit does."""
    from ettools.replay.compute import presets
    from ettools.replay.opmodel import ClassFit, OpModel

    assert presets()["MI300X"]["match"]["vendor"] == "amd" and presets()["A100"]["match"]["vendor"] == "nvidia"

    def fit(gpu: str, mis: float) -> OpModel:
        return OpModel(gpu, {}, 108, {"gemm_shaped": ClassFit("compute", 5.0, 1e12, {"half": 1e14}, 2.0, 64, 0.0,
                                                              misalign=mis)})

    amd, nv = fit("MI300X", 1.0), fit("H100", 1.0)
    amd.borrow_misaligned([fit("A100", 0.6)])
    nv.borrow_misaligned([fit("A100", 0.6)])
    assert amd.classes["gemm_shaped"].misalign == 1.0 and amd.classes["gemm_shaped"].misalign_from is None
    assert nv.classes["gemm_shaped"].misalign == 0.6 and nv.classes["gemm_shaped"].misalign_from == "A100"


HTA16 = SHARED / "traces" / "kineto" / "hta_16rank_blocking_memcpy" / "rank0.json.gz"


def _raw_kernels(ev: list[dict]) -> list[dict]:
    return [e for e in ev if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "kernel"]


def test_interval_cover_matches_brute_force():
    """The covered length of each interval by a union of intervals equals a per-microsecond count."""
    from ettools.intervals import covered_length as _covered
    from ettools.intervals import merge_intervals as _merge_intervals

    rng = np.random.default_rng(3)
    a = rng.integers(0, 200, 40).astype(float)
    b = a + rng.integers(1, 30, 40)
    s = rng.integers(0, 220, 50).astype(float)
    e = s + rng.integers(1, 40, 50)
    cs, ce = _merge_intervals(a, b)
    grid = np.zeros(300, bool)
    for x, y in zip(a.astype(int), b.astype(int)):
        grid[x:y] = True
    want = [grid[int(x):int(y)].sum() for x, y in zip(s, e)]
    assert _covered(cs, ce, s, e).tolist() == pytest.approx(want)


@pytest.mark.skipif(not HTA8.exists(), reason="shared traces not present")
def test_kernels_beside_a_collective_run_slower_and_the_fit_says_so(hta8):
    """On the A100 DLRM rank, the same compute kernel (name and grid) takes longer while a NCCL kernel
    runs (read from the raw JSON); the samples carry that overlap share and the fit's contention
    term predicts an overlapped op slower than the same op alone."""
    ks = hta8.kernels
    nccl = [(k["ts"], k["ts"] + k["dur"]) for k in ks if "nccl" in k["name"].lower()]
    by: dict = {}
    for k in ks:
        if "nccl" in k["name"].lower() or k["dur"] <= 0:
            continue
        ov = sum(max(0.0, min(b, k["ts"] + k["dur"]) - max(a, k["ts"])) for a, b in nccl) / k["dur"]
        key = (k["name"], str(k["args"].get("grid")))
        by.setdefault(key, ([], []))[ov > 0.5].append(k["dur"])
    ratios = [np.median(o) / np.median(f) for f, o in by.values() if len(f) >= 5 and len(o) >= 5]
    assert len(ratios) >= 5 and np.median(ratios) > 1.3
    c = hta8.cols
    assert ((c["overlap"] >= 0) & (c["overlap"] <= 1)).all() and (c["overlap"] > 0.5).sum() > 100
    from ettools.replay.compute import shipped_op_models

    m = shipped_op_models()["A100"]
    assert m.classes["memory"].contention > 0 and m.classes["gemm"].contention > 0
    rows = {k: v[:50] for k, v in c.items()}
    alone = m.predict({**rows, "overlap": np.zeros(50)})
    beside = m.predict({**rows, "overlap": np.ones(50)})
    ok = np.isfinite(alone)
    assert (beside[ok] > alone[ok]).all()


@pytest.mark.skipif(not HTA16.exists(), reason="shared traces not present")
def test_compiled_regions_are_not_timed_from_their_operands():
    """torch.compile regions (CompiledFunction/-Backward in the raw JSON, whose kernels are Triton
    kernels and library GEMMs) are class ``other``: not fitted, and the model predicts none of them."""
    from ettools.replay.compute import shipped_op_models
    from ettools.replay.opsamples import OTHER, op_class

    d = read_json(HTA16)
    names = {e["name"] for e in d["traceEvents"] if isinstance(e, dict) and e.get("cat") == "cpu_op"
             and e.get("name", "").startswith("CompiledFunction")}
    assert names == {"CompiledFunction", "CompiledFunctionBackward"}
    assert all(op_class(n) == OTHER for n in names)
    s, _ = kineto_op_samples(HTA16)
    c = s.arrays()
    comp = np.isin(c["name"], list(names))
    assert comp.sum() >= 30 and (c["cls"][comp] == OTHER).all()
    assert np.isnan(shipped_op_models()["A100"].predict({k: v[comp] for k, v in c.items()})).all()


def test_compute_floor_at_least_the_memory_floor(hta8):
    """A GEMM kernel that does nearly nothing takes at least what an elementwise one does: the shipped
    A100 fit's GEMM floors are not below its memory-class floor; on the raw DLRM trace the shortest
    GEMM kernel is not shorter than the shortest elementwise kernel."""
    from ettools.replay.compute import shipped_op_models

    m = shipped_op_models()["A100"]
    for k in ("gemm", "gemm_shaped"):
        assert m.classes[k].a >= m.classes["memory"].a * 0.999
    if HTA8.exists():
        ks = hta8.kernels
        g = min(k["dur"] for k in ks if "gemm" in k["name"].lower() and k["dur"] > 0)
        e = min(k["dur"] for k in ks if "elementwise" in k["name"] and k["dur"] > 0)
        assert g >= e


def _gemm_cols(shapes: list[tuple[int, int, int]], dur: list[float], dtype: str = "half") -> dict[str, np.ndarray]:
    n = len(shapes)
    m, nn, k = (np.array([s[i] for s in shapes], float) for i in range(3))
    el = 2 if dtype == "half" else 4
    return {"cls": np.full(n, GEMM, np.int8), "dtype": np.full(n, dtype, object), "flops": 2 * m * nn * k,
            "nbytes": el * (m * k + k * nn + m * nn), "m": m, "n": nn, "k": k, "batch": np.ones(n),
            "kind": np.full(n, -1, np.int8), "hdim": np.full(n, -1.0), "causal": np.zeros(n, np.int8),
            "kernels": np.ones(n), "dur": np.array(dur, float), "overlap": np.zeros(n)}


def test_launch_bound_unaligned_gemms_do_not_measure_a_rate():
    """Unaligned GEMMs whose FLOPs take far less than a kernel launch at the data-sheet peak (a few
    MFLOP: V100 DLRM-like MLPs) say nothing of the unaligned rate even when they run a bit slower:
    the fit keeps the rate 1; the same shapes scaled up to take milliseconds do measure it."""
    from ettools.replay.opmodel import OpModel

    hw = load_hardware("A100")
    sms = int(hw["match"]["sms"])
    peak = hw["peak_tflops"]["bf16"] * 1e12
    rng = np.random.default_rng(0)

    def data(scale: int) -> dict[str, np.ndarray]:
        shapes, dur = [], []
        for i in range(40):
            m, n, k = (int(scale * v) for v in rng.integers(8, 64, 3) * 8)
            if i % 2:
                n += 3  # unaligned leading dimension
            f = 2.0 * m * n * k
            slow = 2.0 if i % 2 else 1.0
            shapes.append((m, n, k))
            dur.append(5.0 + slow * f / (0.6 * peak) * 1e6)
        return _gemm_cols(shapes, dur)

    tiny = OpModel.fit(data(1), "A100", hw, sms).classes["gemm_shaped"]
    assert tiny.misalign == 1.0
    big = OpModel.fit(data(16), "A100", hw, sms).classes["gemm_shaped"]
    assert 0.3 < big.misalign < 0.8


def test_unaligned_rate_is_borrowed_only_where_measured():
    """A GPU whose own kernels do not measure the unaligned rate takes the rate another GPU's fit
    measured (recorded as ``misaligned_from``); a donor's own borrowed rate is not passed on; a GPU
    that measured it keeps its own; the provenance survives the JSON round trip."""
    from ettools.replay.opmodel import ClassFit, OpModel

    def fit(gpu: str, mis: float, frm: str | None = None) -> OpModel:
        c = ClassFit("compute", 5.0, 1e12, {"half": 1e14}, 2.0, 64, 0.0, misalign=mis, misalign_from=frm)
        return OpModel(gpu, {}, 108, {"gemm_shaped": c})

    a = fit("X", 1.0)
    a.borrow_misaligned([fit("Y", 1.0, None), fit("Z", 0.4, "W"), fit("X", 0.2)])
    assert a.classes["gemm_shaped"].misalign == 1.0  # nothing measured elsewhere (own GPU excluded)
    a.borrow_misaligned([fit("Y", 0.6), fit("Z", 0.4, "W")])
    assert a.classes["gemm_shaped"].misalign == 0.6 and a.classes["gemm_shaped"].misalign_from == "Y"
    b = fit("Y", 0.7)
    b.borrow_misaligned([fit("Z", 0.5)])
    assert b.classes["gemm_shaped"].misalign == 0.7 and b.classes["gemm_shaped"].misalign_from is None
    back = OpModel.from_dict(a.to_dict())
    assert back.classes["gemm_shaped"].misalign_from == "Y"


def test_calibrate_borrows_the_unaligned_rate_from_the_shipped_fits():
    """``ettools calibrate`` on traces whose GEMMs are aligned (the two H100 Hugging Face runs: every
    GEMM's n and k, read here from the raw Input Dims, are multiples of 8) takes the unaligned rate a
    shipped fit measured, and says which; with no donors it keeps the full rate."""
    from ettools.replay.calibrate import fit_op_model
    from ettools.replay.compute import shipped_op_models

    files = [SHARED / "traces" / "hardware_pairs" / m / "h100.json.gz" for m in ("falconsai_vit", "qwen1.5_0.5b")]
    if not all(f.exists() for f in files):
        pytest.skip("shared hardware pairs absent")
    for f in files:
        for e in read_json(f)["traceEvents"]:
            if e.get("name") in ("aten::mm", "aten::addmm") and e.get("cat") == "cpu_op":
                dims = [d for d in e["args"]["Input Dims"] if d]
                assert all(x % 8 == 0 for x in dims[-1]), (f, dims)
    measured = {g: m.classes["gemm_shaped"].misalign for g, m in shipped_op_models().items()
                if "gemm_shaped" in m.classes and m.classes["gemm_shaped"].misalign != 1.0
                and not m.classes["gemm_shaped"].misalign_from}
    assert measured, "no shipped fit measures the unaligned rate"
    got = fit_op_model(files, "H100", cv=False)[0].classes["gemm_shaped"]
    assert got.misalign_from and set(got.misalign_from.split(",")) == set(measured)
    assert got.misalign == pytest.approx(float(np.median(list(measured.values()))))
    alone = fit_op_model(files, "H100", cv=False, donors=[])[0].classes["gemm_shaped"]
    assert alone.misalign == 1.0 and alone.misalign_from is None


def _tiled_gemm_kernels(ev: list[dict]) -> list[tuple[int, int, int, int, int, list[int]]]:
    """(m, n, k, tile edge a, tile edge b, grid) of every aten::mm/addmm kernel of a raw Kineto
    trace's events whose name carries its output tile (CUTLASS ``_AxB_KxS_``, cuBLAS sm90
    ``tilesizeAxBxK``); the op is the innermost one with Input Dims around the kernel's launch."""
    import re

    launch = {e["args"]["correlation"]: e for e in ev
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops: dict = {}
    for e in ev:
        if e.get("cat") == "cpu_op" and e.get("name") in ("aten::mm", "aten::addmm") and e["args"].get("Input Dims"):
            ops.setdefault(e["tid"], []).append(e)
    out = []
    for e in ev:
        t = re.search(r"_(\d+)x(\d+)_\d+x\d+_|tilesize(\d+)x(\d+)x\d+", e.get("name", "")) \
            if e.get("cat") == "kernel" else None
        r = launch.get(e["args"].get("correlation")) if t else None
        if r is None:
            continue
        around = [o for o in ops.get(r["tid"], []) if o["ts"] <= r["ts"] <= o["ts"] + o["dur"]]
        if not around:
            continue
        o = max(around, key=lambda o: o["ts"])
        a, b = [d for d in o["args"]["Input Dims"] if d][1:3] if o["name"] == "aten::addmm" else o["args"]["Input Dims"][:2]
        ta, tb = (int(x) for x in (t.group(1, 2) if t.group(1) else t.group(3, 4)))
        out.append((a[0], b[1], a[1], ta, tb, e["args"]["grid"]))
    return out


@pytest.mark.skipif(not HTA8.exists(), reason="shared traces not present")
def test_split_k_only_for_grids_that_do_not_fill_the_sms(hta8):
    """The shaped GEMM form splits k only where the output grid has fewer tiles than SMs: every
    split-K CUTLASS kernel of the A100 trace (grid z > 1, a splitKreduce after) has at most 108
    tiles of the tile in its name (either orientation), and short-k grids exist unsplit."""
    sms = int(load_hardware("A100")["match"]["sms"])
    rows = _tiled_gemm_kernels(hta8.events)
    split = [(m, n, k, a, b) for m, n, k, a, b, g in rows if g[2] > 1]
    assert len(split) >= 100
    for m, n, _, a, b in split:
        assert min(-(-m // a) * -(-n // b), -(-n // a) * -(-m // b)) <= sms


HP = SHARED / "traces" / "hardware_pairs"


@pytest.mark.skipif(not HP.exists(), reason="shared traces not present")
def test_cublas_tile_is_not_the_largest_that_fills_the_sms():
    """Why the shaped form fits one tile edge instead of a per-shape rule: on H100 the library's
    tile per shape (from the kernel names) is not "the largest tile whose grid fills the SMs, else
    the smallest" — bert_small's 141x2048 GEMM runs 64x64 tiles (96 tiles) where 32x32 would fill
    the 132 SMs, qwen's 8944x1024 ones 128x128 where 256x128 would, and the same 141x512 output
    runs 32x32 tiles at k=512 but 64x64 at k=2048; the rule picks 3 of the 9 (shape, tile) pairs."""
    sms = int(load_hardware("H100")["match"]["sms"])
    seen = {(m, n, tuple(sorted((a, b)))) for p in sorted(HP.glob("*/h100.json.gz"))
            for m, n, _, a, b, _ in _tiled_gemm_kernels(read_json(p)["traceEvents"])}
    tiles = [(32, 32), (64, 64), (64, 128), (128, 128), (128, 256)]

    def rule(m: int, n: int) -> tuple[int, int]:
        fill = [t for t in tiles if min(-(-m // t[0]) * -(-n // t[1]), -(-n // t[0]) * -(-m // t[1])) >= sms]
        return fill[-1] if fill else tiles[0]

    assert len({t for _, _, t in seen}) >= 4  # the library uses several tiles, per shape
    assert len(seen) >= 8
    assert sum(rule(m, n) == t for m, n, t in seen) < len(seen) / 2
