"""``torch.cuda`` answered as the emulated GPU would, and the fake tensor mode the program runs in.

Call :func:`install` after :func:`.native.load` and ``import torch``. The Python-level CUDA API of
a CPU-only build raises (its C functions are missing); here it reports the named GPU (name, SM
count, capability, memory from the hardware preset), keeps the current device and stream, and
answers memory queries from the recorder's allocator model. ``synchronize`` and event waits are
recorded as host waits. Modules moved between devices get new fake parameters (PyTorch's
in-place swap refuses fake tensors).
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

from ettools.replay.devices import Hardware

from .recorder import Memory, State


class EmulatedStream:
    """A CUDA stream of the emulated device: an id the recorder tags ops with."""

    _next = 20

    def __init__(self, device: Any = None, priority: int = 0, stream_id: int | None = None, **_: Any) -> None:
        if stream_id is None:
            stream_id = EmulatedStream._next
            EmulatedStream._next += 1
        self.stream_id = stream_id
        self.device = torch.device("cuda", _DEV.index)
        self.priority = priority
        self.cuda_stream = stream_id

    def wait_stream(self, _other: Any) -> None:
        return None

    def wait_event(self, _event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> EmulatedEvent:
        event = event or EmulatedEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        _sync("cudaStreamSynchronize")

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EmulatedStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(self.stream_id)

    def __enter__(self) -> EmulatedStream:
        self._prev = _STATE.stream
        _STATE.stream = self.stream_id
        return self

    def __exit__(self, *exc: Any) -> None:
        _STATE.stream = self._prev


class EmulatedEvent:
    """A CUDA event of the emulated device; a timing query is answered NaN and counted (no kernel
    runs here: the replay of the capture has the times), so a script that logs its step time goes on."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.stream: int | None = None

    def record(self, stream: Any = None) -> None:
        self.stream = stream.stream_id if stream is not None else _STATE.stream

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _sync("cudaEventSynchronize")

    def elapsed_time(self, _end: Any) -> float:
        _STATE.event_timings += 1
        return float("nan")


class _Device:
    index = 0


_DEV = _Device()
_STATE = State()
_MEMORY: Memory | None = None
_RECORD_SYNC: list[Any] = []


def _sync(kind: str) -> None:
    for fn in _RECORD_SYNC:
        fn(kind)


def _props(spec: Hardware) -> SimpleNamespace:
    match = spec.match
    major, minor = (list(match.get("compute") or [9, 0]) + [0])[:2]
    return SimpleNamespace(
        name=spec.name or "emulated GPU", total_memory=int(spec.memory_bytes),
        multi_processor_count=int(match.get("sms") or 0), major=int(major), minor=int(minor),
        is_integrated=False, is_multi_gpu_board=False, gcnArchName=str(match.get("arch") or ""),
        L2_cache_size=0, warp_size=64 if match.get("vendor") == "amd" else 32, uuid="emulated")


def _move_module(module: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
    """``Module._apply`` for fake parameters: each moved tensor replaces the old one (PyTorch's own
    path swaps them in place, which fake tensors refuse); other modules take the original."""
    if recurse:
        for child in module.children():
            _move_module(child, fn)
    for key, p in list(module._parameters.items()):
        if p is None:
            continue
        with torch.no_grad():
            new = fn(p)
        if new is p:
            continue
        grad = p.grad
        param = torch.nn.Parameter(new, requires_grad=p.requires_grad)
        if grad is not None:
            with torch.no_grad():
                param.grad = fn(grad)
        module._parameters[key] = param
    for key, b in list(module._buffers.items()):
        if b is not None:
            module._buffers[key] = fn(b)
    return module


def _answer_addresses() -> None:
    """``data_ptr`` of fake storage: a distinct stand-in address per storage (its impl's address),
    so programs that compare addresses to find views and aliases (FSDP-style parameter sharing)
    see what they would on a device; real storage keeps its own."""
    import warnings

    storage_ptr = torch.UntypedStorage.data_ptr
    tensor_ptr = torch.Tensor.data_ptr

    def untyped_data_ptr(self: torch.UntypedStorage) -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                p = storage_ptr(self)
            except RuntimeError:
                p = 0
        return int(self._cdata) if p == 0 and self.nbytes() > 0 else p

    def data_ptr(self: torch.Tensor) -> int:
        if isinstance(self, FakeTensor):
            return int(self.untyped_storage()._cdata) + self.storage_offset() * self.element_size()
        return tensor_ptr(self)

    torch.UntypedStorage.data_ptr = untyped_data_ptr
    torch.Tensor.data_ptr = data_ptr


def _fused_attention() -> None:
    """``scaled_dot_product_attention`` on the emulated GPU picks the fused kernel a GPU would
    (flash without a mask, memory-efficient with one or with a value head size other than the
    query's, as multi-head latent attention has: flash takes one head size) instead of the CPU build's math path, which
    materializes the score matrix (8 GiB for one 8k-token layer) that a GPU never holds."""
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    aten = torch.ops.aten

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, dropout_p: float = 0.0,
             is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
        fused = (isinstance(q, FakeTensor) and q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16)
                 and q.dim() == 4 and q.shape[-1] <= 256)
        if not fused:
            return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                            enable_gqa=enable_gqa)
        if k.shape[-3] != q.shape[-3]:  # grouped-query attention: the KV heads repeated
            rep = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
        if attn_mask is None and v.shape[-1] == q.shape[-1]:  # flash needs one head size (MLA's V is narrower)
            return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        mask = attn_mask if attn_mask is None or attn_mask.dtype != torch.bool else torch.zeros_like(attn_mask, dtype=q.dtype)
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, grad, dropout_p, is_causal,
                                                             scale=scale)[0]

    F.scaled_dot_product_attention = sdpa


def _tensors_from_data() -> None:
    """``torch.tensor(data, device="cuda")`` and friends build the tensor on the host before any
    mode sees it (a real CUDA allocation here): build it on the CPU, then move it (fake)."""
    for name in ("tensor", "as_tensor", "asarray"):
        original = getattr(torch, name)

        def make(data: Any, *args: Any, _original: Any = original, device: Any = None, **kwargs: Any) -> torch.Tensor:
            dev = torch.device(device) if device is not None else None
            if dev is None or dev.type != "cuda":
                return _original(data, *args, device=device, **kwargs)
            grad = bool(kwargs.pop("requires_grad", False))
            kwargs.pop("pin_memory", None)
            with unset_fake_temporarily():
                host = _original(data, *args, **kwargs)
            t = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=dev)
            return t.requires_grad_(grad) if grad else t

        setattr(torch, name, make)


def install(spec: Hardware, local_rank: int = 0, devices: int = 8) -> tuple[FakeTensorMode, State, Memory]:
    """Patch ``torch.cuda`` for the GPU ``spec`` (a hardware preset) and return the fake mode to
    enter, the recorder state and the memory model."""
    global _MEMORY
    props = _props(spec)
    _DEV.index = min(local_rank, devices - 1)
    from . import native

    native.set_device(_DEV.index)  # torchrun's LOCAL_RANK: "cuda" is this rank's GPU
    _MEMORY = Memory(capacity=props.total_memory, gpu=props.name)
    cuda = torch.cuda

    def set_device(d: Any) -> None:
        from . import native

        if isinstance(d, torch.device):
            idx = d.index
        elif isinstance(d, int):
            idx = d
        else:
            idx = int(str(d).rsplit(":", 1)[-1]) if ":" in str(d) else 0
        _DEV.index = min(max(int(idx or 0), 0), devices - 1)
        native.set_device(_DEV.index)

    @contextlib.contextmanager
    def stream(s: Any):  # noqa: ANN202
        if s is None:
            yield
            return
        with s:
            yield

    def mem_stats(*_a: Any, **_k: Any) -> dict[str, int]:
        return {"allocated_bytes.all.current": _MEMORY.current, "allocated_bytes.all.peak": _MEMORY.peak,
                "reserved_bytes.all.current": _MEMORY.current, "reserved_bytes.all.peak": _MEMORY.peak,
                "num_alloc_retries": 0, "num_ooms": 0}

    def reset_peak(*_a: Any, **_k: Any) -> None:
        _MEMORY.peak = _MEMORY.current

    default = EmulatedStream(stream_id=7)
    patches: dict[str, Any] = {
        "is_available": lambda: True, "is_initialized": lambda: True, "init": lambda: None,
        "_lazy_init": lambda: None, "device_count": lambda: devices,
        "current_device": lambda: _DEV.index, "set_device": set_device,
        "get_device_name": lambda *_: props.name, "get_device_properties": lambda *_: props,
        "get_device_capability": lambda *_: (props.major, props.minor),
        "is_bf16_supported": lambda *_a, **_k: props.major >= 8 or spec.match.get("vendor") == "amd",
        "synchronize": lambda *_: _sync("cudaDeviceSynchronize"),
        "Stream": EmulatedStream, "Event": EmulatedEvent, "stream": stream,
        "current_stream": lambda *_: EmulatedStream(stream_id=_STATE.stream),
        "default_stream": lambda *_: default,
        "memory_allocated": lambda *_: _MEMORY.current, "max_memory_allocated": lambda *_: _MEMORY.peak,
        "memory_reserved": lambda *_: _MEMORY.current, "max_memory_reserved": lambda *_: _MEMORY.peak,
        "mem_get_info": lambda *_: (props.total_memory - _MEMORY.current, props.total_memory),
        "memory_stats": mem_stats, "reset_peak_memory_stats": reset_peak, "reset_max_memory_allocated": reset_peak,
        "empty_cache": lambda: None, "manual_seed": lambda *_: None, "manual_seed_all": lambda *_: None,
        "seed": lambda: None, "seed_all": lambda: None, "ipc_collect": lambda: None,
        "get_rng_state": lambda *_: torch.get_rng_state(), "set_rng_state": lambda *_: None,
        "get_arch_list": lambda: [f"sm_{props.major}{props.minor}"],
    }
    for name, value in patches.items():
        setattr(cuda, name, value)
    if hasattr(torch, "accelerator"):
        for name in ("is_available", "device_count", "synchronize"):
            if hasattr(torch.accelerator, name):
                setattr(torch.accelerator, name, patches[name])
    nvtx = SimpleNamespace(range_push=lambda *_a, **_k: 0, range_pop=lambda *_a, **_k: 0,
                           mark=lambda *_a, **_k: None, range=contextlib.nullcontext)
    cuda.nvtx = nvtx
    _refuse_cuda_graphs()
    original_record = torch.Tensor.record_stream

    def record_stream(self: torch.Tensor, s: Any) -> None:
        # a caching-allocator hint (FSDP1 calls it on its unshard stream): nothing to record here
        if not isinstance(s, EmulatedStream):
            original_record(self, s)

    torch.Tensor.record_stream = record_stream
    original_apply = torch.nn.Module._apply

    def apply(self: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
        if any(isinstance(t, FakeTensor) for t in self.parameters()) or any(
                isinstance(t, FakeTensor) for t in self.buffers()):
            return _move_module(self, fn, recurse)
        return original_apply(self, fn, recurse)

    torch.nn.Module._apply = apply
    _answer_addresses()
    _tensors_from_data()
    _fused_attention()
    mode = _EmulatedFakeMode(allow_non_fake_inputs=True)
    return mode, _STATE, _MEMORY


def _refuse_cuda_graphs() -> None:
    """``torch.cuda.CUDAGraph`` (and ``torch.cuda.graph``, ``make_graphed_callables``, which build
    one) stops the program with one line naming the call: graph capture and replay are not
    emulated, and the CPU build's placeholder class fails with a message about a "dummy base class"."""
    from .recorder import EmulationError, program_line

    class CUDAGraph:
        def __init__(self, *_a: Any, **_k: Any) -> None:
            message = (f"torch.cuda.CUDAGraph (CUDA graph capture and replay) is not emulated: run the program "
                       f"without CUDA graphs (eager mode), called at {program_line()}")
            _STATE.error = _STATE.error or message
            raise EmulationError(message)

    torch.cuda.CUDAGraph = CUDAGraph
    import torch.cuda.graphs as graphs

    graphs.CUDAGraph = CUDAGraph


class _EmulatedFakeMode(FakeTensorMode):
    """The fake mode, told that no real device exists: small constant tensors are not computed
    for real once they move to the emulated GPU (that would allocate on a device that is not there)."""

    @property
    def avoid_device_init(self) -> bool:
        return True
