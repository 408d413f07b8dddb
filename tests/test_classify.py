"""The op classifier on real names: CUDA/ROCm kernels of ``../shared/traces`` and the aten ops of
the sample captures, both read here with plain gzip/json, plus Chakra and synthesized names."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.classify import CLASSES, classify, classify_names, is_wrapper, normalize

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


@cache
def _device_names(root: Path) -> dict[str, str]:
    """{device event name: Kineto category} over every Kineto JSON under ``root``."""
    out: dict[str, str] = {}
    for f in sorted(root.rglob("*.json.gz")):
        doc = read_json(f)
        if not isinstance(doc, dict) or "traceEvents" not in doc:
            continue
        for e in doc["traceEvents"]:
            cat = str(e.get("cat", "")).lower()
            if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
                out[e["name"]] = cat
    return out


@pytest.fixture(scope="module")
def kernels(shared_traces) -> dict[str, str]:
    names = _device_names(shared_traces)
    assert len(names) > 300
    return names


def _pick(names, pattern: str, exclude: str | None = None) -> list[str]:
    rx = re.compile(pattern, re.IGNORECASE)
    ex = re.compile(exclude, re.IGNORECASE) if exclude else None
    return [n for n in names if rx.search(n) and not (ex and ex.search(n))]


def test_gemm_kernels(kernels):
    gemm = _pick(kernels, r"gemm|gemv|Cijk_|splitKreduce|nvjet", exclude=r"fbgemm")  # nvjet: cuBLAS on B200
    assert any(n.startswith("nvjet") for n in gemm)
    assert len(gemm) > 100
    assert {n: classify(n) for n in gemm if classify(n) != "GeMM"} == {}


def test_convolution_kernels_are_gemm(kernels):
    conv = _pick(kernels, r"scudnn|winograd|dgrad|wgrad|fft2d|implicit_gemm|convolution")
    assert len(conv) > 30
    assert {n: classify(n) for n in conv if classify(n) != "GeMM"} == {}


def test_nccl_kernels_are_communication(kernels):
    nccl = _pick(kernels, r"^nccl")
    assert {n.split("(")[0] for n in nccl} >= {"ncclKernel_AllReduce_RING_LL_Sum_float"}
    assert {classify(n) for n in nccl} == {"Communication"}


def test_non_nccl_collective_kernels_are_communication(kernels):
    """Collectives that engines run as their own kernels (vLLM's custom all-reduce, PyTorch's
    symmetric-memory multimem all-reduce on the B200 TP 8 trace) are Communication, not the
    reductions their names also describe."""
    custom = _pick(kernels, r"multimem_all_reduce|cross_device_reduce|all_reduce_kernel")
    assert any("multimem_all_reduce" in n for n in custom)
    assert {n: classify(n) for n in custom if classify(n) != "Communication"} == {}


def test_memcpy_and_memset_are_memory(kernels):
    mem = [n for n, cat in kernels.items() if cat in ("gpu_memcpy", "gpu_memset")]
    assert any(n.startswith("Memcpy") for n in mem) and any(n.startswith("Memset") for n in mem)
    assert {classify(n) for n in mem} == {"Memory"}


def test_elementwise_kernels(kernels):
    """``*elementwise_kernel*`` kernels are ElementWise unless they copy or fill (Memory) or index
    (Others); reductions (but a GEMM's split-K reduction), norms, softmax, losses and foreach
    optimizer kernels are ElementWise."""
    ew = _pick(kernels, r"elementwise_kernel|reduce_kernel|softmax|layer_?norm|bn_fw|bn_bw|"
                        r"multi_tensor_apply|nll_loss",
               exclude=r"direct_copy_kernel|FillFunctor|index_elementwise|scatter_gather|index_put|splitKreduce|"
                       r"attention|"  # the reduce step of a split attention kernel is attention
                       r"all_?reduce|reduce_?scatter|multimem")  # collectives written as plain kernels
    assert len(ew) > 50
    assert {n: classify(n) for n in ew if classify(n) != "ElementWise"} == {}
    copies = _pick(kernels, r"direct_copy_kernel|FillFunctor|CatArrayBatchedCopy")
    assert copies and {classify(n) for n in copies} == {"Memory"}
    indexing = _pick(kernels, r"index_elementwise|scatter_gather|indexSelect|embedding")
    assert indexing and {classify(n) for n in indexing} == {"Others"}


def test_every_kernel_gets_a_class(kernels):
    got = {classify(n) for n in kernels}
    assert got <= set(CLASSES)
    assert got == set(CLASSES)


def test_fused_attention_kernels(kernels):
    """Flash, FMHA and paged-attention kernels of the serving traces (and their split-K reduce
    kernels) are Attention, not ElementWise or GeMM."""
    att = _pick(kernels, r"flash|fmha|paged_attention|attn_fwd|attn_bwd|unified_attention",
                exclude=r"reshape_and_cache|kv_indices|quantiz")
    assert len(att) >= 5
    assert {n: classify(n) for n in att if classify(n) != "Attention"} == {}
    # a quantization kernel whose parameter list names a FlashInfer layout type (B200 vLLM trace)
    quant = _pick(kernels, r"quantize_with_block_size.*flashinfer")
    assert quant and "Attention" not in {classify(n) for n in quant}
    # named after attention, but a KV-cache write (a copy) and a page-index build
    cache_writes = _pick(kernels, r"reshape_and_cache")
    assert cache_writes and {classify(n) for n in cache_writes} == {"Memory"}
    index_builds = _pick(kernels, r"kv_indices")
    assert index_builds and {classify(n) for n in index_builds} == {"Others"}


def _et_names(scenario: str) -> set[str]:
    names: set[str] = set()
    for f in sorted((SAMPLES / scenario).glob("rank*.et.json.gz")):
        names |= {n["name"] for n in read_json(f)["nodes"]}
    return names


@pytest.fixture(scope="module")
def aten_names() -> set[str]:
    names: set[str] = set()
    for scenario in ("single", "tp_sp", "moe_ep", "fsdp", "pp_1f1b", "ddp"):
        names |= _et_names(scenario)
    return names


ATEN = {
    "GeMM": ["aten::mm", "aten::linear", "aten::matmul"],
    "Attention": ["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward"],
    "Communication": ["c10d::allreduce_", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_",
                      "c10d::alltoall_base_", "c10d::send", "c10d::recv_"],
    "Memory": ["aten::copy_", "aten::to", "aten::_to_copy", "aten::empty", "aten::empty_strided",
               "aten::zero_", "aten::fill_", "aten::zeros", "aten::clone", "aten::cat", "aten::contiguous"],
    "ElementWise": ["aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::div", "aten::silu",
                    "aten::silu_backward", "aten::layer_norm", "aten::native_layer_norm",
                    "aten::native_layer_norm_backward", "aten::_log_softmax", "aten::sqrt", "aten::lerp_",
                    "aten::addcmul_", "aten::addcdiv_", "aten::nll_loss", "aten::sum"],
    "Others": ["aten::view", "aten::transpose", "aten::t", "aten::as_strided", "aten::reshape",
               "aten::permute", "aten::slice", "aten::select", "aten::detach", "aten::expand",
               "aten::embedding", "aten::index_select", "aten::_unsafe_view", "ProfilerStep#6",
               "Optimizer.step#AdamW.step", "Optimizer.zero_grad#AdamW.zero_grad"],
}


@pytest.mark.parametrize("cls", sorted(ATEN))
def test_aten_names_of_the_captures(aten_names, cls):
    names = ATEN[cls]
    missing = [n for n in names if n not in aten_names]
    assert not missing, f"not in the captures: {missing}"
    assert {n: classify(n) for n in names if classify(n) != cls} == {}


def test_every_aten_gemm_and_attention_name(aten_names):
    """Names with mm/linear/matmul → GeMM; every *scaled_dot_product* name → Attention."""
    gemm = [n for n in aten_names if re.fullmatch(r"aten::(mm|addmm|bmm|linear|matmul)", n)]
    assert gemm and {classify(n) for n in gemm} == {"GeMM"}
    sdpa = [n for n in aten_names if "scaled_dot_product" in n.lower()]
    assert len(sdpa) >= 3 and {classify(n) for n in sdpa} == {"Attention"}
    assert {classify(n) for n in aten_names if n.startswith("c10d::")} == {"Communication"}


def test_autograd_nodes_take_their_forward_ops_class(aten_names):
    nodes = sorted(n for n in aten_names if re.fullmatch(r"[A-Za-z_]\w*Backward\d*", n))
    assert len(nodes) > 10
    assert normalize("MmBackward0") == "aten::mm"
    assert normalize("NativeLayerNormBackward0") == "aten::native_layer_norm"
    assert classify("MmBackward0") == "GeMM"
    assert classify("ScaledDotProductFlashAttentionForCpuBackward0") == "Attention"
    assert classify("SiluBackward0") == "ElementWise" and classify("TBackward0") == "Others"
    for n in nodes:
        wrapped = f"autograd::engine::evaluate_function: {n}"
        assert wrapped in aten_names
        assert classify(wrapped) == classify(n)
        assert is_wrapper(n) and is_wrapper(wrapped)
    assert not is_wrapper("aten::mm") and not is_wrapper("c10d::allreduce_")
    assert is_wrapper("Optimizer.step#AdamW.step") and is_wrapper("ProfilerStep#3")


def test_chakra_suffixes_do_not_change_the_class(shared_traces):
    from ettools.converters.chakra import read_chakra

    t = read_chakra([shared_traces / "chakra/resnet_converted.0.et"])
    names = set(t[0].names())
    suffixed = [n for n in names if re.search(r"\(\d+\)$", n)]
    assert len(suffixed) > 50
    for n in suffixed:
        assert classify(n) == classify(re.sub(r"\(\d+\)$", "", n)), n
    assert classify("aten::mm(0)") == "GeMM" and classify("aten::conv2d(3)") == "GeMM"


def test_synthesized_names_are_classified_by_their_kind():
    from ettools.converters.symbolic import synthesize

    g = synthesize(model="sample_moe", dp=2, ep=2, batch=16, micro_batch=16, bucket_mb=100).trace[0]
    names = set(g.names())
    kinds = {n.split(" ")[0] for n in names}
    assert {"matmul", "matmul.dgrad", "attention", "adam", "embedding", "all_to_all"} <= kinds
    for n in names:
        assert classify(n) == classify(n.split(" ")[0]), n
    want = {"matmul": "GeMM", "matmul.wgrad": "GeMM", "attention.bwd": "Attention", "adam": "ElementWise",
            "layernorm.bwd": "ElementWise", "swiglu": "ElementWise", "embedding": "Others",
            "dispatch": "Others", "all_to_all": "Communication", "all_reduce": "Communication"}
    assert {k: classify(k) for k in want} == want
    # a module name never decides: "adam <…>_embedding.params" is an optimizer update
    assert classify("adam sample_embedding.params") == "ElementWise"


def test_classify_names_matches_classify():
    from ettools.formats import load_trace

    g = load_trace([SAMPLES / "moe_ep/rank0.kineto.json.gz"]).trace[0]
    codes = classify_names(g.name, g.strings)
    names = g.names()
    assert [CLASSES[c] for c in codes] == [classify(n) for n in names]
    assert classify_names(np.zeros(0, np.int32), g.strings).shape == (0,)
