"""What an operator is and how much work it does, from its name and operands.

Its op class (:data:`OP_CLASSES`: the cost model's functional forms, :mod:`.opmodel`), memory kind
(:data:`MEM_KINDS`), dtype group (:data:`DTYPES`), FLOPs, bytes moved and GEMM/attention shape
(:class:`OpFeatures`, :func:`op_features`), read from Kineto ``Input Dims``/``Input type`` or
PyTorch ET operands (:func:`et_operands_as_kineto`). :mod:`.opsamples` pairs these with measured
kernel times; the replay's re-timing and op-model columns read them too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# op classes of the cost model (each has its own functional form in .opmodel)
OP_CLASSES = ("gemm", "attention", "conv", "embedding", "memory", "other")
GEMM, ATTENTION, CONV, EMBEDDING, MEMORY, OTHER = range(6)
# dtype groups: half = fp16/bf16 (tensor cores); tf32 = fp32 tensors multiplied on tensor cores
# (TF32 math), fp32 = fp32 on the SIMT cores (about 8x slower on A100/H100)
DTYPES = ("fp32", "tf32", "half", "fp64", "int8")

_DT_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
             "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2, "c10::Float8_e4m3fn": 1,
             "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8}
_DT_GROUP = {"float": "fp32", "c10::BFloat16": "half", "c10::Half": "half", "double": "fp64",
             "c10::Float8_e4m3fn": "int8", "c10::Float8_e5m2": "int8", "c10::Float8_e4m3fnuz": "int8",
             "c10::Float8_e5m2fnuz": "int8"}

_GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_scaled_mm",
             "aten::addmv", "aten::mv", "aten::_addmm_activation", "aten::linear", "aten::matmul"}
_ATTN_RE = re.compile(r"attention|flash_attn|_efficient_attention|_flash_attention|attn_fwd|attn_bwd", re.I)
_CONV_RE = re.compile(r"conv", re.I)
_EMB_OPS = {"aten::embedding", "aten::embedding_dense_backward", "aten::index_select", "aten::gather",
            "aten::index", "aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_backward",
            "aten::index_add_", "aten::scatter_add_", "aten::_index_put_impl_", "aten::index_put_",
            "aten::embedding_backward", "aten::_embedding_bag_dense_backward", "aten::take_along_dim"}
_GEMM_KERNEL_RE = re.compile(r"gemm|cutlass|xmma|cublas|_mm_|Cijk_", re.I)
# a tensor-core kernel of fp32 tensors runs TF32 math: cuBLAS/cuDNN/CUTLASS name it (sm80_xmma_..._tf32f32_...,
# cutlass_80_tensorop_s1688gemm, cutlass_tensorop_s1688wgrad_..._tf32); SIMT kernels are sgemm/scudnn/
# implicit_convolve_sgemm/gemv/..._ffma_...
_TF32_KERNEL_RE = re.compile(r"tf32|tensorop|s1688|s16816|hmma", re.I)


def fp32_math(cls: int, kernel_names: list[str] | None = None, has_tf32: bool = True) -> str:
    """Dtype group of an fp32 GEMM/conv: ``tf32`` when one of its kernels is a tensor-core (TF32)
    kernel, ``fp32`` (SIMT) when its kernels are known and none is. Without kernel names (an ET-only
    or synthesized op) PyTorch's defaults decide: ``torch.backends.cuda.matmul.allow_tf32`` is False
    since 1.12 (GEMMs run SIMT fp32) and ``torch.backends.cudnn.allow_tf32`` is True (convolutions
    run TF32) — on a GPU with TF32 tensor cores (``has_tf32``; V100 and older have none)."""
    if kernel_names:
        return "tf32" if any(_TF32_KERNEL_RE.search(k) for k in kernel_names) else "fp32"
    return "tf32" if cls == CONV and has_tf32 else "fp32"


_SIMT_KERNEL_RE = re.compile(r"sgemm|scudnn|ffma|gemv|gemmSN|_engine<float", re.I)


def fp32_math_of_name(cls: int, name: str, has_tf32: bool = True) -> str:
    """:func:`fp32_math` of one op of a graph by its name: a kernel name says its math (TF32
    tensor-core or SIMT); an op name (``aten::mm``, a synthesized ``matmul ...``) takes PyTorch's
    default."""
    if _TF32_KERNEL_RE.search(name):
        return "tf32" if has_tf32 else "fp32"
    if _SIMT_KERNEL_RE.search(name):
        return "fp32"
    return fp32_math(cls, None, has_tf32)
_FUSED_RE = re.compile(r"^CompiledFunction|Torch-Compiled Region|triton|inductor", re.I)
_COMM_RE = re.compile(r"nccl|rccl|allreduce|all_reduce|allgather|reducescatter|sendrecv", re.I)


def op_class(name: str) -> int:
    """The cost-model class of an op (ATen name, synthesized op name or kernel name)."""
    n = name.split(" ")[0].lower()  # synthesized names are "<op> <module>.<tensor>"
    if name in _GEMM_OPS or n in ("matmul", "matmul.dgrad", "matmul.wgrad", "einsum", "einsum.dgrad",
                                   "einsum.wgrad", "linear", "mm", "bmm", "gemm") \
            or re.search(r"gemm|cutlass|matmul|_mm_|ampere_.*_tn|sm\d+_xmma|cublas", n):
        return GEMM
    if _ATTN_RE.search(n):
        return ATTENTION
    if "conv" in n and "convert" not in n:
        return CONV
    if name in _EMB_OPS or n.startswith("embedding") or "index_select" in n or "gather" in n:
        return EMBEDDING
    if ("::" in name and not name.startswith("aten::")) or _FUSED_RE.search(name):
        # custom ops (fbgemm::, autograd C++ nodes) and torch.compile regions: their arguments do
        # not say the work
        return OTHER
    return MEMORY


# kinds of memory-bound ops: each moves its bytes at its own achieved bandwidth (a norm reads its
# input twice, a reduction is latency-bound on its tree, a scatter is random access)
MEM_KINDS = ("elementwise", "reduction", "norm", "softmax", "copy", "optimizer", "index", "fused")
ELEMENTWISE, REDUCTION, NORM, SOFTMAX, COPY, OPTIMIZER, INDEX, FUSED = range(8)
_REDUCE = {"sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean", "std_mean", "any",
           "all", "argmax", "argmin", "logsumexp", "cumsum", "cumprod", "norm", "linalg_vector_norm", "nansum",
           "aminmax", "count_nonzero", "sum_to_size", "mse_loss", "binary_cross_entropy_with_logits", "l1_loss",
           "smooth_l1_loss", "_adaptive_avg_pool2d", "adaptive_avg_pool2d", "mean.bwd"}
_COPY = {"copy_", "_to_copy", "to", "clone", "contiguous", "cat", "stack", "fill_", "zero_", "zeros", "ones",
         "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "constant_pad_nd",
         "pad", "repeat", "flip", "roll", "_copy_from", "_copy_from_and_resize", "copy", "memcpy", "memset",
         "_cat", "hstack", "vstack", "tile", "expand_copy", "permute_copy", "transpose_copy", "index_copy_"}
_INDEX = {"scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "gather", "index", "index_put_",
          "_index_put_impl_", "index_add_", "nonzero", "masked_select", "masked_scatter_", "sort", "topk", "unique",
          "_unique2", "searchsorted", "bucketize", "repeat_interleave", "take", "put_", "argsort", "index_fill_",
          "_embedding_bag_backward", "embedding_dense_backward", "index_select_backward"}
_WRITE_ONLY = {"fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
               "index_copy_", "masked_scatter_", "set_"}
_BOOL_OUT = {"eq", "ne", "lt", "gt", "le", "ge", "isnan", "isinf", "isfinite", "logical_not", "logical_and",
             "logical_or", "logical_xor", "isclose"}


def memory_kind(name: str) -> int:
    """The kind (:data:`MEM_KINDS`) of a memory-bound op from its ATen or synthesized name."""
    n = name.split(" ")[0].lower()
    n = n[6:] if n.startswith("aten::") else n
    if n.startswith("_foreach") or n.startswith("_fused_adam") or n.startswith("_fused_sgd") or \
            any(x in n for x in ("adam", "adagrad", "optimizer", "lamb")) or n in ("addcdiv_", "addcmul_", "lerp_"):
        return OPTIMIZER
    if ("norm" in n and "vector_norm" not in n and n not in ("norm", "renorm")) or n.startswith("layernorm"):
        return NORM
    if "softmax" in n or "cross_entropy" in n or n.startswith("nll_loss"):
        return SOFTMAX
    if "pool" in n:
        return INDEX if "backward" in n or ".bwd" in n else REDUCTION  # backward scatters by indices
    if "compiled" in n or "triton" in n or n.startswith("fused") or "inductor" in n:
        return FUSED
    if n in _REDUCE or n.startswith("reduce"):
        return REDUCTION
    if n in _COPY:
        return COPY
    if n in _INDEX or n.startswith("scatter") or n.startswith("index_"):
        return INDEX
    return ELEMENTWISE


def _ints(v: Any) -> list[int] | None:
    """A ``Concrete Inputs`` entry as a list of ints ('[1, 1]' or '2'); None when it is not one."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return [int(v)]
    if not isinstance(v, str) or not v.strip():
        return None
    try:
        x = json.loads(v)
    except ValueError:
        return None
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return [x]
    if isinstance(x, list) and all(isinstance(y, int) and not isinstance(y, bool) for y in x):
        return x
    return None


# (stride, padding, dilation, groups, transposed) argument positions of the convolution ops
_CONV_ARGS = {"aten::conv1d": (3, 4, 5, 6, -1), "aten::conv2d": (3, 4, 5, 6, -1), "aten::conv3d": (3, 4, 5, 6, -1),
              "aten::convolution": (3, 4, 5, 8, 6), "aten::_convolution": (3, 4, 5, 8, 6),
              "aten::cudnn_convolution": (3, 2, 4, 5, -1), "aten::miopen_convolution": (4, 3, 5, 6, -1),
              "aten::mkldnn_convolution": (4, 3, 5, 6, -1), "aten::convolution_backward": (4, 5, 6, 9, 7)}


def conv_out_shape(name: str, x: tuple[int, ...], w: tuple[int, ...], concrete: list[Any] | None) -> tuple[int, ...] | None:
    """Output shape ``(N, K, P, Q, ...)`` of a convolution from its input, weight and the stride,
    padding, dilation in ``Concrete Inputs``: P = ⌊(H + 2·pad − dil·(R − 1) − 1)/stride⌋ + 1.
    None when the parameters are absent or the op is a transposed convolution."""
    pos = _CONV_ARGS.get(name)
    if pos is None or not concrete or len(x) < 3 or len(w) != len(x):
        return None
    sp = len(x) - 2

    def arg(i: int, default: int) -> list[int] | None:
        v = _ints(concrete[i]) if 0 <= i < len(concrete) else None
        if v is None:
            return None if 0 <= i < len(concrete) and str(concrete[i]).strip() else [default] * sp
        return v * sp if len(v) == 1 else v

    if pos[4] >= 0 and pos[4] < len(concrete) and str(concrete[pos[4]]).strip() == "True":
        return None
    st, pd, dl = arg(pos[0], 1), arg(pos[1], 0), arg(pos[2], 1)
    if st is None or pd is None or dl is None or len(st) != sp or len(pd) != sp or len(dl) != sp:
        return None
    out = [int(x[0]), int(w[0])]
    for i in range(sp):
        o = (int(x[2 + i]) + 2 * pd[i] - dl[i] * (int(w[2 + i]) - 1) - 1) // max(st[i], 1) + 1
        if o <= 0:
            return None
        out.append(o)
    return tuple(out)


def _pool_out(x: tuple[int, ...], concrete: list[Any] | None) -> tuple[int, ...] | None:
    """Output shape of ``max_pool``/``avg_pool`` (self, kernel, stride, padding, dilation...)."""
    if not concrete or len(x) < 3 or len(concrete) < 3:
        return None
    k, st = _ints(concrete[1]), _ints(concrete[2]) or _ints(concrete[1])
    pd = (_ints(concrete[3]) if len(concrete) > 3 else None) or [0]
    if not k or not st:
        return None
    sp = min(len(k), len(x) - 2)
    k, st, pd = (v * sp if len(v) == 1 else v for v in (k, st, pd))
    lead = list(x[:len(x) - sp])
    return tuple(lead + [max((int(x[len(lead) + i]) + 2 * pd[i] - k[i]) // max(st[i], 1) + 1, 1) for i in range(sp)])


def memory_bytes(name: str, ta: list[tuple[tuple[int, ...], str]], concrete: list[Any] | None) -> tuple[float, float]:
    """``(bytes, elements)`` a memory-bound op moves: its inputs (Kineto records them) plus the output
    its semantics implies — in-place ops write ``self`` (write-only ops do not read it),
    reductions and pooling write the reduced shape, norms/softmax/elementwise one tensor the size of
    their (broadcast) input, comparisons a bool, concatenation the sum of its inputs."""
    if not ta:
        return 0.0, 0.0
    sizes = [_numel(s) * _DT_BYTES.get(t, 4) for s, t in ta]
    first_shape, first_t = ta[0]
    esz = _DT_BYTES.get(first_t, 4)
    n = name[6:] if name.startswith("aten::") else name
    ins = float(sum(sizes))
    big = max(_numel(s) for s, _ in ta)
    kind = memory_kind(name)
    if n.endswith("_") and not n.startswith("_foreach") and kind != OPTIMIZER:
        if n in _WRITE_ONLY:
            return float(sum(sizes[1:]) + sizes[0]), float(_numel(first_shape))
        return ins + sizes[0], float(_numel(first_shape))
    if n.startswith("_foreach") or kind == OPTIMIZER:
        # lists of tensors; in-place variants write the first list back
        return 2.0 * ins if n.endswith("_") else ins + ins / max(len(ta), 1), float(big)
    if kind == REDUCTION:
        if "pool" in n:
            out = _pool_out(first_shape, concrete) if "adaptive" not in n else None
            if "adaptive" in n and concrete and len(concrete) > 1:
                osz = _ints(concrete[1])
                out = tuple(first_shape[:len(first_shape) - len(osz)]) + tuple(osz) if osz else None
            on = _numel(out) if out else _numel(first_shape) // 4
            idx = on * 8 if "indices" in n else 0
            return float(sizes[0] + on * esz + idx), float(_numel(first_shape))
        dims = _ints(concrete[1]) if concrete and len(concrete) > 1 else None
        if dims is not None and first_shape:
            red = _numel([first_shape[d] for d in dims if -len(first_shape) <= d < len(first_shape)])
            on = _numel(first_shape) // max(red, 1)
        else:
            on = 1  # a full reduction writes a scalar
        return ins + on * esz, float(_numel(first_shape))
    if kind == COPY and n in ("cat", "stack", "_cat", "hstack", "vstack"):
        return 2.0 * ins, float(big)
    if "pool" in n and "backward" in n:
        return ins, float(_numel(first_shape))  # reads grad_out and indices, writes grad_input (not self)
    if kind in (NORM, SOFTMAX) or n.endswith("_backward") or n.endswith("backward_data"):
        return ins + sizes[0], float(_numel(first_shape))
    try:
        out_n = _numel(np.broadcast_shapes(*[s for s, _ in ta]))
    except ValueError:
        out_n = big
    # type promotion: the result has the widest floating dtype of the tensor inputs (0-dim are scalars)
    wide = max((_DT_BYTES[t] for s, t in ta if t in _DT_GROUP and len(s) > 0), default=esz)
    osz = 1 if n in _BOOL_OUT else wide
    return ins + out_n * osz, float(out_n)


def _numel(s: list[int] | tuple[int, ...]) -> int:
    n = 1
    for x in s:
        n *= max(int(x), 0)
    return n


def _tensor_args(dims: list[Any], types: list[Any], list_type: str | None = None) -> list[tuple[tuple[int, ...], str]]:
    """(shape, type) of the tensor arguments (scalars left out; tensor lists flattened). The profiler
    records a ``TensorList`` argument (``aten::cat``, ``aten::stack``, the ``_foreach_*`` optimizer
    ops) by its elements' shapes only: its elements take ``list_type`` (the caller's best knowledge,
    :func:`dominant_float_type` of the trace) and are left out without it."""
    out: list[tuple[tuple[int, ...], str]] = []
    for d, t in zip(dims, types):
        if isinstance(t, str) and t in _DT_BYTES and isinstance(d, list) and all(isinstance(x, int) for x in d):
            out.append((tuple(d), t))
        elif isinstance(t, str) and isinstance(d, list) and (t.startswith("GenericList") or (t == "TensorList" and list_type)):
            elem = "float" if t.startswith("GenericList") else str(list_type)
            for x in d:
                if isinstance(x, list) and all(isinstance(y, int) for y in x):
                    out.append((tuple(x), elem))
    return out


def dominant_float_type(type_lists: Iterable[Any]) -> str | None:
    """The floating-point Kineto ``Input type`` (``c10::BFloat16``, ``float`` ...) that most tensor
    arguments of these ops have, or None: what a ``TensorList`` argument's elements, whose dtype the
    profiler does not record, are taken to be (:func:`_tensor_args`)."""
    counts: dict[str, int] = {}
    for types in type_lists:
        if isinstance(types, list):
            for t in types:
                if isinstance(t, str) and t in _DT_GROUP:
                    counts[t] = counts.get(t, 0) + 1
    return max(sorted(counts), key=counts.__getitem__) if counts else None


@dataclass
class OpFeatures:
    """Features of one op from its name and tensor arguments."""

    cls: int
    dtype: str
    flops: float
    nbytes: float
    m: int = -1
    n: int = -1
    k: int = -1
    batch: int = -1
    kind: int = -1  # memory kind (MEM_KINDS) of a memory-bound op
    hdim: int = -1  # attention: head dim (-1 unknown); m, n, k, batch are seq_q, seq_kv, heads·head_dim, batch
    causal: int = 0  # attention: 1 when causally masked (bottom-right aligned: query i sees seq_kv - seq_q + i + 1 keys); 2: causal, and the kernel also appends the chunk's K/V to the cache


def gemm_mnk(name: str, shapes: list[tuple[int, ...]]) -> tuple[int, int, int, int] | None:
    """``(m, n, k, batch)`` of a GEMM op from its input shapes (PyTorch argument order)."""
    mats = [s for s in shapes if len(s) >= 1]
    if name in ("aten::addmm", "aten::_addmm_activation", "aten::baddbmm", "aten::addbmm") and len(mats) >= 3:
        mats = mats[1:3]  # (bias/self, a, b)
    elif name == "aten::_scaled_mm":
        mats = mats[:2]
    if name == "aten::linear" and len(mats) >= 2:
        x, w = mats[0], mats[1]
        if len(w) != 2 or not x:
            return None
        return _numel(x[:-1]), int(w[0]), int(x[-1]), 1
    if len(mats) < 2:
        return None
    a, b = mats[0], mats[1]
    if name in ("aten::addmv", "aten::mv"):
        if len(a) == 2:
            return int(a[0]), 1, int(a[1]), 1
        return None
    if len(a) < 2 or len(b) < 2:
        return None
    if len(a) == 2 and len(b) == 2:
        return int(a[0]), int(b[1]), int(a[1]), 1
    if len(a) == 3 and len(b) == 3:
        return int(a[1]), int(b[2]), int(a[2]), int(a[0])
    # matmul broadcasting: leading dims of a are rows (b 2-D) or batch (b batched)
    if len(b) == 2:
        return _numel(a[:-1]), int(b[1]), int(a[-1]), 1
    return int(a[-2]), int(b[-1]), int(a[-1]), _numel(a[:-2])


# position of ``is_causal`` (bool) or ``custom_mask_type`` (int, >= 1 causal) in Concrete Inputs
_CAUSAL_ARG = {"aten::scaled_dot_product_attention": 5, "aten::_scaled_dot_product_flash_attention": 4,
               "aten::_scaled_dot_product_efficient_attention": 6, "aten::_scaled_dot_product_cudnn_attention": 6,
               "aten::_flash_attention_forward": 8, "aten::_efficient_attention_forward": 9,
               "aten::_scaled_dot_product_flash_attention_backward": 11, "aten::_flash_attention_backward": 11,
               "aten::_scaled_dot_product_efficient_attention_backward": 11,
               "aten::_efficient_attention_backward": 14, "aten::_scaled_dot_product_cudnn_attention_backward": 14}
# ops whose q, k, v are [batch, seq, heads, head_dim] (the SDPA family is [batch, heads, seq, head_dim])
_BSHD = {"aten::_flash_attention_forward", "aten::_flash_attention_backward", "aten::_efficient_attention_forward",
         "aten::_efficient_attention_backward"}


def attention_keys(sq: float, sk: float, causal: bool | np.ndarray) -> Any:
    """Mean keys a query attends to: ``seq_kv``, or under a causal mask (bottom-right aligned, as
    FlashAttention and SDPA align a chunk of new queries after a cache) ``seq_kv - seq_q/2``."""
    return np.where(causal, np.maximum(np.asarray(sk, float) - np.asarray(sq, float) / 2.0, 0.5), sk) \
        if isinstance(causal, np.ndarray) else (max(sk - sq / 2.0, 0.5) if causal else float(sk))


# FlashAttention-2/3 compute a causal mask in tiles: 128-row query tiles against 64- or 128-key
# blocks in the forward, 128-key blocks against 64-row query tiles in the backward; every count
# comes to the blocks of a 128 x 128 grid on or below the diagonal
FLASH_TILE = 128


def flash_causal_keys(sq: int, sk: int, tile: int = FLASH_TILE) -> float:
    """Mean keys per query a tiled causal attention kernel computes (bottom-right aligned, as
    :func:`attention_keys`): every ``tile``-row query tile computes whole ``tile``-key blocks up to
    its last row's last visible key (clipped to ``sk``). ``(S + tile)/2`` for ``sq = sk = S`` a
    multiple of the tile, versus the exact mask's ``S/2``."""
    sq, sk = int(sq), int(sk)
    if sq < 1 or sk < 1:
        return float(max(sk, 0))
    i = np.arange(-(-sq // tile), dtype=np.float64)
    rows = np.minimum(tile, sq - i * tile)
    vis = np.minimum(np.minimum((i + 1) * tile, sq) + (sk - sq), sk)
    cols = np.minimum(np.ceil(np.maximum(vis, 1) / tile) * tile, sk)
    return float((rows * cols).sum() / sq)


def attention_shape(name: str, shapes: list[tuple[int, ...]], concrete: list[Any] | None
                    ) -> tuple[int, int, int, int, int, bool] | None:
    """``(batch, heads, seq_q, seq_kv, head_dim, causal)`` of a fused attention op from its 4-D q, k
    (v) arguments — [b, h, s, d] for the SDPA ops, [b, s, h, d] for the flash/efficient kernels'
    own ops (others: heads are the smaller middle dim) — and its causal flag from ``Concrete Inputs``
    (``is_causal``; ``custom_mask_type`` >= 1). None without three 4-D tensors."""
    four = [s for s in shapes if len(s) == 4]
    if "backward" in name or "bwd" in name:
        four = four[1:]  # grad_out first
    if len(four) < 3:
        return None
    q, kk = four[0], four[1]
    bshd = name in _BSHD or (name not in _CAUSAL_ARG and q[1] > q[2])
    if bshd:
        b, sq, h, d = q
        sk = kk[1]
    else:
        b, h, sq, d = q
        sk = kk[2]
    causal = False
    i = _CAUSAL_ARG.get(name)
    if i is not None and concrete and i < len(concrete):
        v = str(concrete[i]).strip()
        causal = v == "True" or (v.isdigit() and int(v) >= 1)
    if min(b, h, sq, sk, d) <= 0:
        return None
    return int(b), int(h), int(sq), int(sk), int(d), causal



# arguments of the functional overload of common elementwise ops (Kineto records scalars too): a
# call with one more argument, a tensor, is the ``out=`` overload — that tensor is written, not read
_UNARY = ("neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sigmoid", "tanh", "relu", "sqrt",
          "rsqrt", "abs", "sin", "cos", "erf", "erfinv", "reciprocal", "sign", "floor", "ceil", "round", "trunc",
          "frac", "silu", "mish", "logical_not", "bitwise_not", "isnan", "sgn", "square")
_ARITY = {**dict.fromkeys(_UNARY, 1),
          **dict.fromkeys(("mul", "div", "pow", "maximum", "minimum", "fmod", "remainder", "atan2", "eq", "ne",
                           "lt", "gt", "le", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and",
                           "bitwise_or", "bitwise_xor", "hypot", "xlogy", "gelu", "leaky_relu", "sigmoid_backward",
                           "tanh_backward", "silu_backward"), 2),
          **dict.fromkeys(("add", "sub", "rsub", "clamp", "where", "lerp", "threshold", "hardtanh", "softplus",
                           "threshold_backward", "gelu_backward"), 3),
          **dict.fromkeys(("addcmul", "addcdiv"), 4)}


def _drop_out_arg(name: str, dims: list[Any], types: list[Any],
                  ta: list[tuple[tuple[int, ...], str]]) -> list[tuple[tuple[int, ...], str]]:
    """``ta`` without the output tensor of an ``out=`` call (see :data:`_ARITY`)."""
    n = name[6:] if name.startswith("aten::") else name
    ar = _ARITY.get(n)
    if ar is None or len(dims) != ar + 1 or len(ta) < 2 or not isinstance(types[-1], str) or types[-1] not in _DT_BYTES:
        return ta
    return ta[:-1]


def _memory(name: str, dtype: str, ta: list[tuple[tuple[int, ...], str]], concrete: list[Any] | None) -> OpFeatures:
    by, el = memory_bytes(name, ta, concrete)
    return OpFeatures(MEMORY, dtype, el, by, kind=memory_kind(name))


_ET_TENSOR = re.compile(r"Tensor\((.+)\)")
_ET_SCALARS = {"Int", "Double", "Bool", "SymInt", "SymFloat", "Float", "Long", "Scalar", "Number"}


def et_operands_as_kineto(values: list[Any] | None, types: list[Any]) -> tuple[list[Any], list[Any]]:
    """A PyTorch Execution Trace op's ``(input values, input types)`` in the Kineto spelling that
    :func:`op_features` reads: ``Tensor(c10::BFloat16)`` is ``c10::BFloat16`` with an empty
    concrete value (ET tensor values are ids, not values), an ``Int``/``Double``/``Bool`` argument
    is a ``Scalar`` whose concrete value is its text, ``None`` is an empty entry; tensor lists keep
    their ``GenericList[...]`` type."""
    vals = list(values) if isinstance(values, list) else [None] * len(types)
    conc: list[Any] = []
    kt: list[Any] = []
    for i, t in enumerate(types):
        v = vals[i] if i < len(vals) else None
        m = _ET_TENSOR.fullmatch(t) if isinstance(t, str) else None
        if m:
            kt.append(m.group(1))
            conc.append("")
        elif t in _ET_SCALARS:
            kt.append("Scalar")
            conc.append(str(v))
        elif t == "None":
            kt.append("")
            conc.append("")
        else:
            kt.append(t)
            conc.append("" if isinstance(v, list) else str(v))
    return conc, kt


def op_features(name: str, dims: list[Any], types: list[Any], concrete: list[Any] | None = None,
                list_type: str | None = None) -> OpFeatures:
    """Class, dtype group, FLOPs and bytes of an op from Kineto ``Input Dims``/``Input type``
    (and ``Concrete Inputs``: convolution stride/padding/dilation, reduction dims, pooling).
    ``list_type``: the element type of ``TensorList`` arguments (see :func:`_tensor_args`).

    GEMM: 2·m·n·k·batch FLOPs, bytes of A, B and C. Attention (:func:`attention_shape`):
    4·b·h·s_q·keys·d forward FLOPs with keys the mean keys a query sees (:func:`attention_keys`:
    about half under a causal mask, as the kernels skip masked blocks), backward ops 2.5× that
    (five GEMMs of two); bytes of q, k, v and the output; shape columns m, n, k, batch = s_q, s_kv,
    h·d, b and ``hdim`` = d. Convolution: 2·numel(out)·numel(w)/out_channels (output size from the
    stride/padding/dilation in ``Concrete Inputs``; without them the input's spatial size), backward
    2·numel(grad_out)·C/g·R·S per gradient its output mask asks for. Memory-bound ops: the bytes of
    :func:`memory_bytes`, with their kind (:func:`memory_kind`).
    """
    if types and any(isinstance(t, str) and t.startswith("Tensor(") for t in types):
        concrete, types = et_operands_as_kineto(concrete, types)
    ta = _drop_out_arg(name, dims or [], types or [], _tensor_args(dims or [], types or [], list_type))
    shapes = [s for s, _ in ta]
    first_float = next((t for s, t in ta if t in _DT_GROUP), "float")
    dtype = _DT_GROUP.get(first_float, "fp32")
    esz = _DT_BYTES.get(first_float, 4)
    in_bytes = float(sum(_numel(s) * _DT_BYTES.get(t, 4) for s, t in ta))
    big = max((_numel(s) * _DT_BYTES.get(t, 4) for s, t in ta), default=0)
    cls = op_class(name)
    if cls == GEMM:
        mnk = gemm_mnk(name, shapes)
        if mnk is not None and min(mnk) > 0:
            m, n, k, b = mnk
            fl = 2.0 * m * n * k * b
            by = float(esz * b * (m * k + k * n + m * n))
            return OpFeatures(GEMM, dtype, fl, by, m, n, k, b)
        return _memory(name, dtype, ta, concrete)
    if cls == ATTENTION:
        sh = attention_shape(name, shapes, concrete)
        if sh is not None:
            b, h, sq, sk, d, causal = sh
            # FLOPs as the kernels do them: QK^T and PV over the keys each query sees (a causal
            # kernel skips the masked half); backward ops 2.5x (five GEMMs of two)
            fl = 4.0 * b * h * sq * attention_keys(sq, sk, causal) * d
            if "backward" in name or "bwd" in name:
                fl *= 2.5
            q4 = [s for s in shapes if len(s) == 4]
            by = float(sum(_numel(s) for s in q4[:4]) * esz + b * h * sq * d * esz)
            return OpFeatures(ATTENTION, dtype, fl, by, sq, sk, h * d, b, hdim=d, causal=int(causal))
        return _memory(name, dtype, ta, concrete)
    if cls == CONV:
        four = [s for s in shapes if len(s) >= 3]
        if "backward" in name and len(four) >= 3:
            gout, x, w = four[0], four[1], four[2]
            # output_mask (last argument): which of grad_input, grad_weight, grad_bias are computed
            mask = re.findall(r"True|False", str(concrete[-1])) if concrete else []
            gx, gw = (mask[0] == "True", mask[1] == "True") if len(mask) >= 2 else (True, True)
            ng = max(int(gx) + int(gw), 1)
            return OpFeatures(CONV, dtype, 2.0 * ng * _numel(gout) * _numel(w) / max(w[0], 1),
                              float((_numel(gout) + (2 if gx else 1) * _numel(x) + 2 * _numel(w)) * esz))
        if len(four) >= 2:
            x, w = four[0], four[1]
            o = conv_out_shape(name, x, w, concrete)
            # without the parameters: the input's spatial size (stride 1, same padding)
            out = _numel(o) if o else x[0] * w[0] * _numel(x[2:])
            return OpFeatures(CONV, dtype, 2.0 * out * _numel(w) / max(w[0], 1),
                              float((_numel(x) + _numel(w) + out) * esz))
        return _memory(name, dtype, ta, concrete)
    if cls == EMBEDDING:
        # a gather reads and writes the rows it selects: index count × row width, not the table
        if len(shapes) >= 2 and name in ("aten::embedding", "aten::index_select", "aten::embedding_bag",
                                         "aten::_embedding_bag"):
            w, idx = shapes[0], shapes[1]
            moved = _numel(idx) * _numel(w[1:]) * esz
            return OpFeatures(EMBEDDING, dtype, float(_numel(idx)), float(2 * moved + _numel(idx) * 8))
        return OpFeatures(EMBEDDING, dtype, float(big // max(esz, 1)), in_bytes + big)
    return _memory(name, dtype, ta, concrete)

