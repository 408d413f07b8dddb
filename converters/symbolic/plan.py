"""The parallel plan: mesh degrees (``tp``, ``cp``, ``dp`` = ``ep`` × ``edp``, ``pp``), sequence
parallelism, ZeRO/FSDP, the pipeline schedule, gradient synchronisation and dtypes, with the
checks that refuse an inconsistent one (:class:`Plan`), and the mesh axes' order (:data:`AXES`)."""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("tp", "cp", "ep", "edp")  # mesh order, fastest first (pp is outermost, not a tensor axis)
DTYPE_BYTES = {"fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "float8": 1}
# inference storage dtypes: the KV cache (``kv_dtype``) and weight-only quantized weights
# (``weight_dtype``; the GEMMs still multiply in the activation dtype after dequantizing)
# (int4: AWQ/GPTQ with a 16-bit scale and zero per 128 weights; mxfp4: an 8-bit scale per 32;
# nvfp4: an FP8 scale per 16)
STORAGE_BYTES = {**DTYPE_BYTES, "int8": 1, "int4": 4.25 / 8, "mxfp4": 4.25 / 8, "nvfp4": 4.5 / 8}
SCHEDULES = ("gpipe", "1f1b", "interleaved", "deepspeed", "zb-h1", "dualpipe")


def check_dualpipe(pp: int, micro_batches: int) -> None:
    """Refuse what DualPipe cannot schedule (ValueError naming the rule)."""
    if pp < 2 or pp % 2:
        raise ValueError(f"the dualpipe schedule needs an even number of pipeline stages (pp = {pp}): "
                         "rank r pairs with rank pp - 1 - r")
    if micro_batches % 2 or micro_batches < 2 * pp:
        raise ValueError(f"the dualpipe schedule needs micro-batches even and at least 2 x pp "
                         f"({micro_batches} micro-batches, pp = {pp}): half enter at each end, and each "
                         "half must fill the pipeline (DeepSeek's reference implementation's rule)")


@dataclass
class Plan:
    """A parallel plan and training setup (plain values)."""

    tp: int = 1
    cp: int = 1
    dp: int = 1  # data-parallel degree, expert parallelism included
    ep: int = 1
    pp: int = 1
    sp: bool = False  # Megatron sequence parallelism over the TP group
    zero: int = 0  # 0 DDP, 1/2 sharded optimizer (and gradients), 3 FSDP
    fsdp_modules: tuple[str, ...] | None = None  # ZeRO-3 only these module names (None: all)
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved | deepspeed | zb-h1 | dualpipe
    vpp: int = 1  # model chunks per stage (interleaved)
    micro_batches: int = 1
    recompute: str = "none"  # none | full (each module's forward again) | selective (core attention)
    act_bytes: int = 2
    param_bytes: int = 2
    grad_bytes: int = 2
    grad_sync: str = "iteration"  # iteration | microbatch
    optimizer: str | None = "adam"
    vocab_parallel: bool = True  # @vocab parameters split over tp
    bucket_mb: float | None = None  # DDP-style gradient buckets across modules (None: one per module)
    phase: str = "train"  # train | prefill | decode (inference: forward programs only)
    # Megatron's pipeline scatter/gather: without SP each TP rank sends 1/tp of a boundary
    # activation (or its gradient) and the receiving stage all-gathers it over its TP group
    pp_scatter_gather: bool = False
    # gradient collectives after the whole backward pass (else each bucket as soon as its
    # gradients exist, overlapped with the rest of the backward)
    dp_after_backward: bool = False
    # how a micro-batch's weight gradients join the ones before it: "fused" (Megatron's gradient-
    # accumulation fusion: the weight-gradient GEMM adds into the accumulated gradient) or
    # "separate" (autograd's AccumulateGrad: an in-place add over every local gradient, per
    # micro-batch after the first, as DeepSpeed's engine and unfused frameworks run it)
    grad_accumulation: str = "fused"
    tie: bool = True  # honour the model's tied parameters (``tie`` statements); False: untied copies
    # Transformer Engine FP8 training: the linear layers' GEMMs (forward, dgrad, wgrad) in FP8 with
    # their operands cast (and transposed) by separate kernels, everything else in ``act_bytes``
    fp8_gemms: bool = False
    # inference: bytes per KV-cache element when the cache is stored in another dtype than the
    # activations (0: ``act_bytes``); weights may be fractional bytes (int4: 0.5)
    kv_bytes: float = 0.0

    def __post_init__(self) -> None:
        for k in ("tp", "cp", "dp", "ep", "pp", "vpp", "micro_batches"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp}): experts are split over data-parallel ranks")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.grad_sync not in ("iteration", "microbatch"):
            raise ValueError(f"grad_sync must be 'iteration' or 'microbatch', got {self.grad_sync!r}")
        if self.grad_accumulation not in ("fused", "separate"):
            raise ValueError(f"grad_accumulation must be 'fused' or 'separate', got {self.grad_accumulation!r}")
        if self.phase not in ("train", "prefill", "decode"):
            raise ValueError(f"phase must be train, prefill or decode, got {self.phase!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be gpipe, 1f1b, interleaved, deepspeed, zb-h1 or dualpipe, "
                             f"got {self.schedule!r}")
        if self.schedule == "dualpipe" and self.phase == "train":
            check_dualpipe(self.pp, self.micro_batches)
        if self.schedule == "deepspeed" and self.zero > 1:
            raise ValueError(f"DeepSpeed's pipeline engine runs ZeRO stage 0 or 1, not {self.zero}")

    @property
    def edp(self) -> int:
        """Data-parallel ranks per expert-parallel group."""
        return self.dp // self.ep

    def size(self, axis: str) -> int:
        """Ranks along a mesh axis."""
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "edp": self.edp, "pp": self.pp}[axis]

    @property
    def axes(self) -> tuple[str, ...]:
        """Tensor axes with more than one rank, mesh order."""
        return tuple(a for a in AXES if self.size(a) > 1)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The data-parallel axes that split the batch."""
        return tuple(a for a in ("ep", "edp") if self.size(a) > 1)

    @property
    def world(self) -> int:
        """Total ranks."""
        return self.tp * self.cp * self.dp * self.pp

    def fsdp(self, module: str) -> bool:
        """Whether ``module``'s parameters are sharded (ZeRO-3) and gathered before use."""
        return self.zero == 3 and (self.fsdp_modules is None or module in self.fsdp_modules)

