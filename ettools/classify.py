"""Operator classes: maps host ops, device kernels and synthesized op names to one of
GeMM, Attention, ElementWise, Communication, Memory, Others.

Rules are tried in order; the first whose pattern matches the name (case-insensitive, searched
anywhere in it) decides. The table is data, so it can be read in the README and tested:

=============  ========================================================================
class          what matches (examples)
=============  ========================================================================
Communication  NCCL/RCCL kernels (``ncclDevKernel_AllReduce…``), ``c10d::*``, ``gloo:*``,
               ``record_param_comms``, ``nccl:*``, synthesized ``all_reduce``/``send``/…
Attention      fused attention: ``flash``, ``fmha``, ``scaled_dot_product``, ``attention``,
               ``sdpa``, ``cutlass…Attention`` kernels
GeMM           matrix multiplies and convolutions: ``aten::mm/addmm/bmm/matmul/linear/
               conv*/einsum/baddbmm``, BLAS kernels (``sgemm``, ``hgemm``, ``gemv``, ``gemmk1``,
               cuBLASLt, CUTLASS GEMM, ``xmma_gemm``, ``implicit_gemm``, Tensile ``Cijk_``),
               cuDNN convolutions (``scudnn``, ``winograd``, ``fft2d``, ``dgrad``/``wgrad``
               engines, ``conv``), ``splitKreduce`` (split-K GEMM epilogue)
Memory         copies and fills: ``Memcpy``, ``Memset``, ``aten::copy_/clone/contiguous/to/
               _to_copy/empty*/zero_/fill_/zeros/ones/cat/stack``, ``cudaMemcpy*``
ElementWise    point-wise and row-wise math: ``elementwise``, ``vectorized_``, ``reduce_kernel``,
               activations, norms (``layer_norm``, ``rms_norm``, ``batch_norm``, ``bn_fw``/
               ``bn_bw``), ``softmax``, ``dropout``, ``add``, ``mul``, ``div``, ``sub``,
               ``relu``, ``gelu``, ``silu``, ``tanh``, ``sigmoid``, ``exp``, ``pow``, ``sqrt``,
               ``rsqrt``, ``mean``, ``sum``, optimizer updates (``_foreach_*``, ``adam``)
Others         everything else (indexing, sorting, scans, embedding lookups, layout changes,
               framework bookkeeping)
=============  ========================================================================

``classify_names`` works on a whole array of (interned) names and classifies each distinct name
once, so it costs one regex search per distinct name, not per node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

CLASSES = ("GeMM", "Attention", "ElementWise", "Communication", "Memory", "Others")

RULES: list[tuple[str, str]] = [
    ("Communication", r"nccl|rccl|c10d::|^gloo:|record_param_comms|all_?reduce|all_?gather|"
                      r"reduce_?scatter|all_?to_?all|alltoall|broadcast|^send$|^recv$|^send_|^recv_|"
                      r"barrier|p2p"),
    ("Attention", r"flash|fmha|scaled_dot_product|attention|sdpa|_efficient_attention"),
    ("GeMM", r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|einsum|conv\w*|cudnn_convolution\w*|"
             r"_convolution\w*|mkldnn_convolution\w*|addmv|mv|dot)$|"
             r"gemm|gemv|gemmk1|sgemm|hgemm|cublas|cutlass(?!.*attention)|xmma|Cijk_|"
             r"scudnn|winograd|fft2d|dgrad|wgrad|implicit_gemm|convolution|conv2d|conv1d|conv3d|"
             r"splitKreduce|^matmul|^einsum|^linear"),
    ("Memory", r"memcpy|memset|aten::(copy_|clone|contiguous|to|_to_copy|empty\w*|zero_|fill_|zeros\w*|"
               r"ones\w*|full\w*|cat|stack|new_empty\w*|new_zeros|resize_|set_|detach|lift_fresh)$|"
               r"^copy|^memory|cudamemcpy|hipmemcpy|^mem_"),
    ("ElementWise", r"elementwise|vectorized_|reduce_kernel|norm|bn_fw|bn_bw|softmax|dropout|"
                    r"aten::(add|add_|mul|mul_|div|div_|sub|sub_|neg|abs|relu\w*|gelu\w*|silu\w*|tanh\w*|"
                    r"sigmoid\w*|exp\w*|log\w*|pow|sqrt|rsqrt|mean|sum|max|min|amax|where|masked_fill\w*|"
                    r"threshold_backward|lerp_|addcmul_|addcdiv_|sign|clamp\w*|_foreach_\w+|"
                    r"\w*_backward)$|"
                    r"^(add|mul|div|sub|relu|gelu|silu|swiglu|tanh|sigmoid|exp|rsqrt|residual|scale|"
                    r"dropout|softmax|norm|layernorm|rmsnorm|adam|sgd|optimizer|update|cast|rope|"
                    r"rotary|activation|loss|cross_entropy|mask)\b|_foreach_|adam|sgd_"),
]
_COMPILED = [(cls, re.compile(pat, re.IGNORECASE)) for cls, pat in RULES]


def classify(name: str) -> str:
    """The class of one op name (see the module table)."""
    for cls, pat in _COMPILED:
        if pat.search(name):
            return cls
    return "Others"


def classify_names(name_ids: np.ndarray, strings: Sequence[str] | object) -> np.ndarray:
    """Class index (into :data:`CLASSES`) of each interned name id; one regex pass per distinct name."""
    uniq, inverse = np.unique(name_ids, return_inverse=True)
    idx = {c: i for i, c in enumerate(CLASSES)}
    codes = np.array([idx[classify(strings[int(u)])] if u >= 0 else idx["Others"] for u in uniq],
                     np.int8)
    return codes[inverse] if len(uniq) else np.zeros(0, np.int8)
