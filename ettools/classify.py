"""Operator classes: maps host ops, device kernels and synthesized op names to one of
GeMM, Attention, ElementWise, Communication, Memory, Others.

How a name is classified
------------------------
1. The name is normalized: a Chakra converter's ``(N)`` suffix is cut (``aten::mm(0)`` →
   ``aten::mm``), and so is a demangled kernel signature's parameter list (its types name the
   libraries it takes arguments from, not what it does); a synthesized name ``KIND[.PHASE] MODULE.TENSOR`` (``matmul.dgrad gpt_block.qkv``)
   is classified by its ``KIND[.PHASE]`` alone, so module names never decide; ``autograd::engine::evaluate_function: X`` is classified as ``X``; an autograd
   node ``XxxBackward0`` (no ``::``) is classified as its forward op ``aten::xxx`` (CamelCase to
   snake case: ``MmBackward0`` → ``aten::mm`` → GeMM, ``NativeLayerNormBackward0`` →
   ``aten::native_layer_norm`` → ElementWise), so a trace that records only autograd nodes (TrioSim)
   gets the class of the work they stand for.
2. The rules below are tried in order; the first whose pattern matches (case-insensitive,
   searched anywhere in the normalized name unless anchored) decides. A class may appear more
   than once: early rules settle names that a later, broader pattern would take.

===================  ================================================================================
class (rule)         what matches (examples)
===================  ================================================================================
Others (annotation)  profiler and framework annotations, not operators: ``ProfilerStep#N``,
                     ``Optimizer.step#…``, ``Optimizer.zero_grad#…``, ``nn.Module: …``, ``## … ##``,
                     ``DistributedDataParallel.forward``
Communication        NCCL/RCCL kernels (``ncclDevKernel_AllReduce…``), ``c10d::*``, ``gloo:*``,
                     ``record_param_comms``, ``nccl:*``, synthesized ``all_reduce``/``send_act``/…
Attention            fused attention: ``flash``, ``fmha``, ``scaled_dot_product``, ``attention``,
                     ``sdpa``, ``cutlass…Attention`` kernels
Memory (early)       copy/fill kernels whose names would otherwise read as element-wise or GEMM:
                     ``direct_copy_kernel``, ``FillFunctor``, ``CatArrayBatchedCopy``, layout
                     conversions that copy (``nchwToNhwc``/``nhwcToNchw``)
ElementWise (early)  element-wise kernels whose signature mentions a GEMM library:
                     ``fbgemm``-namespaced element-wise kernels, ``scal_kernel`` (BLAS scaling),
                     ``scalePackedTensor``
GeMM                 matrix multiplies and convolutions: ``aten::mm/addmm/bmm/baddbmm/matmul/
                     linear/einsum/conv*/convolution*/addmv/mv/dot``, BLAS kernels (``sgemm``,
                     ``hgemm``, ``gemv``, ``gemmk1``, cuBLASLt, CUTLASS GEMM, ``xmma_gemm``,
                     ``implicit_gemm``, Tensile ``Cijk_``, cuBLAS's JIT ``nvjet``, TensorRT-LLM
                     ``bmm_``, but not ``fbgemm`` nor a CUTLASS dtype in a template), cuDNN convolutions and
                     their helper kernels (``scudnn``, ``winograd``, ``fft2d``, ``dgrad``/``wgrad``
                     engines, ``cask_cudnn`` offset kernels, ``im2col``, MIOpen's ``igemm_fwd/bwd/wrw``), ``splitKreduce`` (split-K epilogue),
                     synthesized ``matmul``/``matmul.dgrad``/``matmul.wgrad``
Others (indexing)    gathers, scatters and lookups whose kernels are named ``…elementwise…``:
                     ``embedding``, ``index_select``/``indexSelect``, ``index_put``, ``index_add``,
                     ``scatter_gather``, ``gather``, ``scatter``, scans; synthesized
                     ``dispatch``/``combine`` (MoE token routing), ``topk``, ``split``, ``view``,
                     ``selective_scan``
Memory               copies, fills and allocations: ``Memcpy``, ``Memset``, ``aten::copy_/clone/
                     contiguous/to/_to_copy/empty*/new_empty*/zero_/fill_/zeros*/ones*/full*/cat/
                     stack/resize_``, ``cudaMemcpy*``
ElementWise          point-wise and row-wise math: ``elementwise``, ``vectorized_``,
                     ``reduce_kernel``, ``multi_tensor_apply`` (foreach optimizers), activations,
                     norms (``layer_norm``, ``rms_norm``, ``batch_norm``, ``bn_fw``/``bn_bw``,
                     ``GammaBetaBackward``, ``RowwiseMoments``), ``softmax``, losses (``nll_loss``,
                     ``cross_entropy``, ``mse``), ``dropout``, ``add``, ``mul``, ``div``, ``sub``,
                     ``relu``, ``gelu``, ``silu``, ``tanh``, ``sigmoid``, ``exp``, ``pow``, ``sqrt``,
                     ``rsqrt``, ``mean``, ``sum``, ``aten::*_backward`` of those, optimizer updates
                     (``_foreach_*``, ``adam``), synthesized ``rope``/``swiglu``/``layernorm``/…
Others               everything else (views and layout changes that move no data: ``view``,
                     ``transpose``, ``t``, ``as_strided``, ``detach``; indexing, sorting, scans,
                     pooling, framework bookkeeping)
===================  ================================================================================

``classify_names`` works on a whole array of (interned) names and classifies each distinct name
once, so it costs one regex search per distinct name, not per node. ``is_wrapper`` tells the
names that stand for a group of operators when they contain other ops (autograd nodes, their
``evaluate_function`` wrappers, annotations): :mod:`ettools.validate` counts their children, not
them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import numpy as np

CLASSES = ("GeMM", "Attention", "ElementWise", "Communication", "Memory", "Others")

RULES: list[tuple[str, str]] = [
    ("Others", r"^ProfilerStep#|^Optimizer\.|^nn\.Module|^## |^DistributedDataParallel\.|"
               r"^\[pytorch\|profiler"),
    ("Communication", r"nccl|rccl|c10d::|^gloo:|record_param_comms|all_?reduce|all_?gather|"
                      r"reduce_?scatter|all_?to_?all|alltoall|broadcast|^send$|^recv$|^send_|^recv_|"
                      r"barrier|p2p"),
    # serving kernels named after attention that do not compute it: the KV-cache write is a copy,
    # the page-index build is bookkeeping
    ("Memory", r"reshape_and_cache|kv_cache_write|store_kvcache"),
    ("Others", r"kv_indices|kv_indptr"),
    ("Attention", r"flash|fmha|scaled_dot_product|attention|sdpa|_efficient_attention|"
                  r"(?:^|_)attn_(?:fwd|bwd)|(?:^|_)attn(?:$|_kernel)"),
    ("Memory", r"direct_copy_kernel|FillFunctor|CatArrayBatchedCopy|nchwToNhwc|nhwcToNchw"),
    ("ElementWise", r"fbgemm_gpu::.*(?:quantize|_to_float|to_hfp8|hfp8_to)|elementwise_kernel<.*fbgemm|"
                    r"\bscal_kernel|scalePackedTensor"),
    ("GeMM", r"aten::(mm|addmm|_addmm_activation|bmm|baddbmm|matmul|linear|einsum|conv\w*|"
             r"cudnn_convolution\w*|_convolution\w*|mkldnn_convolution\w*|miopen_convolution\w*|"
             r"slow_conv\w*|addmv|mv|dot|addbmm)$|"
             r"(?<!fb)gemm|gemv|gemmk1|cublas|cutlass(?!::(?:bfloat16_t|half_t|tfloat32_t|float_e\w+|complex))"
             r"(?!.*attention)|xmma|Cijk_|nvjet|^bmm_|"
             r"scudnn|winograd|fft2d|dgrad|wgrad|implicit_gemm|convolution|conv2d|conv1d|conv3d|"
             r"cask_cudnn|im2col|col2im|^igemm_|splitKreduce|^matmul|^einsum|^linear"),
    ("Others", r"embedding|index_?select|index_put|index_add|index_copy|gpu_index_kernel|"
               r"index_elementwise_kernel|scatter_gather|gather|scatter|"
               r"^dispatch\b|^combine\b|^topk\b|^split\b|^view\b|scan\b"),
    ("Memory", r"memcpy|memset|aten::(copy_|clone|contiguous|to|_to_copy|_copy_from\w*|empty\w*|"
               r"new_empty\w*|new_zeros|new_ones|new_full|zero_|fill_|zeros\w*|ones\w*|full\w*|cat|"
               r"_cat|stack|resize_)$|"
               r"^copy|^memory|cudamemcpy|hipmemcpy|^mem_"),
    ("ElementWise", r"elementwise|vectorized_|reduce_kernel|multi_tensor_apply|norm|bn_fw|bn_bw|"
                    r"GammaBeta|RowwiseMoments|softmax|dropout|nll_loss|cross_entropy|mse_|"
                    r"aten::(add|add_|mul|mul_|div|div_|sub|sub_|rsub|neg|neg_|abs|relu\w*|gelu\w*|"
                    r"silu\w*|tanh\w*|sigmoid\w*|exp|exp_|expm1|log|log_|log2|log1p|pow|pow_|sqrt|rsqrt|"
                    r"mean|sum|max|min|amax|amin|where|masked_fill\w*|threshold\w*|lerp_|addcmul_|"
                    r"addcdiv_|sign|clamp\w*|_foreach_\w+|reciprocal|square|erf|hardtanh\w*|lt|gt|le|ge|eq|ne|"
                    r"logical_\w+|bitwise_\w+|aminmax|"
                    r"leaky_relu\w*|\w*_backward|\w*_backward_data)$|"
                    r"^(add|mul|div|sub|relu|gelu|geglu|silu|swiglu|tanh|sigmoid|exp|rsqrt|residual|"
                    r"scale|dropout|softmax|norm|layernorm|rmsnorm|adam|sgd|optimizer|update|cast|rope|"
                    r"rotary|activation|loss|cross_entropy|mask)\b|_foreach_|adam|sgd_"),
]
_COMPILED = [(cls, re.compile(pat, re.IGNORECASE)) for cls, pat in RULES]

_CHAKRA_SUFFIX = re.compile(r"\(\d+\)$")
# ettools synth names: "KIND[.PHASE] MODULE.TENSOR" (``matmul.dgrad gpt_block.qkv``)
_SYNTH = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*) [A-Za-z_][\w\-]*\.\S+$")
_EVALUATE = "autograd::engine::evaluate_function: "
_AUTOGRAD_NODE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*?)Backward\d*$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WRAPPER = re.compile(
    r"^autograd::engine::evaluate_function: |^[A-Za-z_][A-Za-z0-9_]*Backward\d*$|^ProfilerStep#|"
    r"^Optimizer\.|^nn\.Module|^## |^DistributedDataParallel\.|^torch::autograd::|"
    r"^\[pytorch\|profiler"
)


def _without_parameters(name: str) -> str:
    """A demangled kernel signature without its parameter list (``void k<T>(int, flashinfer::X)``
    → ``void k<T>``): parameter types name libraries the kernel only takes arguments from."""
    if not name.endswith(")") or not name.startswith(("void ", "std::")):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        c = name[i]
        depth += c == ")"
        depth -= c == "("
        if depth == 0:
            return name[:i] if i > 0 else name
    return name


def normalize(name: str) -> str:
    """The name the rules see (see the module docstring, step 1)."""
    name = _without_parameters(_CHAKRA_SUFFIX.sub("", name.strip()))
    m = _SYNTH.match(name)
    if m:
        return m.group(1)
    if name.startswith(_EVALUATE):
        name = name[len(_EVALUATE):]
    if "::" not in name:
        m = _AUTOGRAD_NODE.match(name)
        if m:
            return "aten::" + _CAMEL.sub("_", m.group(1)).lower()
    return name


@functools.lru_cache(maxsize=1 << 16)  # the names of a trace repeat in every rank, step and trace read
def classify(name: str) -> str:
    """The class of one op name (see the module table)."""
    norm = normalize(name)
    for cls, pat in _COMPILED:
        if pat.search(norm):
            return cls
    return "Others"


def is_wrapper(name: str) -> bool:
    """Whether ``name`` stands for a group of ops when it contains others (autograd nodes and their
    ``evaluate_function`` wrappers, profiler/optimizer/module annotations, ``torch::autograd::*``)."""
    return bool(_WRAPPER.search(_CHAKRA_SUFFIX.sub("", name.strip())))


def classify_names(name_ids: np.ndarray, strings: Sequence[str] | object) -> np.ndarray:
    """Class index (into :data:`CLASSES`) of each interned name id; one regex pass per distinct name."""
    uniq, inverse = np.unique(name_ids, return_inverse=True)
    idx = {c: i for i, c in enumerate(CLASSES)}
    codes = np.array([idx[classify(strings[int(u)])] if u >= 0 else idx["Others"] for u in uniq],
                     np.int8)
    return codes[inverse] if len(uniq) else np.zeros(0, np.int8)


def wrapper_names(name_ids: np.ndarray, strings: Sequence[str] | object) -> np.ndarray:
    """``is_wrapper`` of each interned name id, one regex search per distinct name."""
    uniq, inverse = np.unique(name_ids, return_inverse=True)
    flags = np.array([is_wrapper(strings[int(u)]) if u >= 0 else False for u in uniq], bool)
    return flags[inverse] if len(uniq) else np.zeros(0, bool)
