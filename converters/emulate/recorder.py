"""The op recorder of an emulated capture: a dispatch mode above ``FakeTensorMode``.

Every aten op the program dispatches passes here first. The op is run by the fake mode below
(shapes, dtypes, strides and devices propagate; no data exists) and recorded as one row:
its schema name, operands in the profiler's form (``Input Dims``, ``Input type``, ``Concrete
Inputs``), the device it ran on, the emulated stream, the autograd phase and module path, and the
program's own host time since the previous op returned (measured on this machine; the time this
recorder and the fake mode spend is not counted). Allocations and frees of device storage are
tracked for the emulated GPU's memory; an allocation past it raises the out-of-memory error the
real job would hit.

Values that exist only on the device cannot be answered: reading one (``loss.item()``,
``if torch.isnan(x)``) gets a placeholder (0 / False) and is counted; an op whose output *shape*
depends on values (``nonzero``, boolean-mask indexing) stops the capture with one line naming the
call and the program line that made it.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    UnsupportedOperatorException,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode

# ops that launch no device work: allocation, aliasing, metadata
NO_KERNEL = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::detach", "aten::alias", "aten::lift_fresh", "aten::set_", "aten::resize_", "aten::_local_scalar_dense",
    "aten::_has_compatible_shallow_copy_type", "aten::is_same_size", "aten::_version", "aten::record_stream",
})
# dispatcher traffic that is bookkeeping of the framework, not the program's ops
SKIPPED = frozenset({"prim::device", "prim::layout", "prim::dtype", "profiler::_record_function_enter_new",
                     "profiler::_record_function_exit", "profiler::_record_function_enter"})

_KINETO_DTYPE = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool", torch.complex64: "c10::complex<float>",
}
for _name, _label in (("float8_e4m3fn", "c10::Float8_e4m3fn"), ("float8_e5m2", "c10::Float8_e5m2")):
    if hasattr(torch, _name):
        _KINETO_DTYPE[getattr(torch, _name)] = _label

_DROPOUTS = frozenset({"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout"})
# reads of one value (``.item()``; under inference mode ``aten::item`` is not decomposed first)
_VALUE_READS = frozenset({"aten::_local_scalar_dense", "aten::item"})
_DEVICE_MOVES = frozenset({"aten::to", "aten::_to_copy", "aten::copy", "aten::copy_"})
_ALLOC_ROUND = 512  # the CUDA caching allocator's block granularity


class EmulationError(RuntimeError):
    """The program did something emulation cannot answer; the message names the call and line."""


def program_line() -> str:
    """``file:line`` of the innermost frame of the program itself (not torch, not ettools)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch_dir = os.path.dirname(torch.__file__)
    for fr in reversed(traceback.extract_stack()):
        f = os.path.abspath(fr.filename)
        if f.startswith((torch_dir, here)) or "importlib" in f or f.startswith("<"):
            continue
        return f"{fr.filename}:{fr.lineno}"
    return "?"


@dataclass
class Memory:
    """Device memory of the emulated GPU as the caching allocator would see it (blocks rounded to
    512 B; live until the last tensor on the storage is gone)."""

    capacity: int
    gpu: str
    current: int = 0
    peak: int = 0
    allocs: int = 0
    oom: str | None = None
    on_oom: Any = None  # called before the out-of-memory error is raised (writes the record)
    live: dict[int, int] = field(default_factory=dict)

    def track(self, t: FakeTensor) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        nbytes = -(-int(st.nbytes()) // _ALLOC_ROUND) * _ALLOC_ROUND
        if self.current + nbytes > self.capacity:
            gib = 1 << 30
            self.oom = (
                f"CUDA out of memory (emulated {self.gpu}): tried to allocate {nbytes / gib:.2f} GiB with "
                f"{self.current / gib:.2f} GiB of {self.capacity / gib:.2f} GiB in use, at {program_line()}")
            if self.on_oom is not None:
                self.on_oom()
            raise torch.OutOfMemoryError(self.oom)
        self.live[key] = nbytes
        self.current += nbytes
        self.allocs += 1
        self.peak = max(self.peak, self.current)
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)


@dataclass
class State:
    """What the program is doing now: recording or not, phase, module stack, stream."""

    recording: bool = False
    phase: str = "forward"
    modules: list[str] = field(default_factory=list)
    stream: int = 7  # the default stream's id as Kineto numbers it
    placeholder_reads: int = 0
    event_timings: int = 0  # CUDA event timings asked (answered NaN)
    meta_only: int = 0  # inside DTensor's sharding propagation: global-shape fakes, not device work
    error: str | None = None
    on_error: Any = None  # called when the program is stopped (writes the record)
    rows: list[tuple] = field(default_factory=list)
    host: Any = None  # the :class:`.hostcount.HostCounter` of the program's host work, if counting

    def add(self, row: tuple) -> None:
        """Append a recorded row, with the program's Python events since the previous row and
        whether it starts a top-level op (fields 12 and 13; backward ops each start one)."""
        py, top = self.host.take() if self.host is not None else (0, 1)
        self.rows.append((*row, py, 1 if self.phase == "backward" else top))


def _operand(v: Any) -> tuple[Any, str, str]:
    """``(dims, type, concrete)`` of one argument, as the profiler records it."""
    if isinstance(v, torch.Tensor):
        return list(v.shape), _KINETO_DTYPE.get(v.dtype, str(v.dtype).removeprefix("torch.")), ""
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.Tensor) for x in v):
        return [list(x.shape) for x in v], "TensorList", ""
    if isinstance(v, bool | int | float):
        return [], "Scalar", str(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, int | float | bool) for x in v):
        return [], "ScalarList", str(list(v))
    if v is None:
        return [], "", ""
    return [], "", ""


_SMALL_HOST_NUMEL = 1 << 16  # elements: host tensors this small are kept real (values exist)


def _flat_tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _flat_tensors(x)]
    if isinstance(v, dict):
        return [t for x in v.values() for t in _flat_tensors(x)]
    return []


def _to_fake(mode: Any, v: Any) -> Any:
    if isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor):
        return mode.from_tensor(v)
    if isinstance(v, list):
        return [_to_fake(mode, x) for x in v]
    if isinstance(v, tuple):
        return tuple(_to_fake(mode, x) for x in v)
    if isinstance(v, dict):
        return {k: _to_fake(mode, x) for k, x in v.items()}
    return v


def _to_cuda(args: Any, kwargs: dict) -> bool:
    """Whether a device-moving op targets the emulated GPU (a device argument or a CUDA tensor)."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.device) and v.type == "cuda" or isinstance(v, torch.Tensor) and v.is_cuda:
            return True
        if isinstance(v, str) and v.startswith("cuda"):
            return True
    return False


def _host_inputs(args: Any, kwargs: dict) -> int | None:
    """Total elements of the op's tensor inputs when all are real host tensors and it asks for no
    device (0: no tensor inputs), else None."""
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        return None
    ins = _flat_tensors(args) + _flat_tensors(kwargs)
    if any(isinstance(t, FakeTensor) or t.device.type != "cpu" for t in ins):
        return None
    return sum(t.numel() for t in ins)


def _small_host_outputs(out: Any) -> bool:
    outs = _flat_tensors(out)
    return bool(outs) and all(t.device.type == "cpu" for t in outs) and \
        sum(t.numel() for t in outs) <= _SMALL_HOST_NUMEL


def _storages(v: Any) -> set[int]:
    out: set[int] = set()
    for t in (v if isinstance(v, (list, tuple)) else (v,)):
        if isinstance(t, torch.Tensor):
            try:
                out.add(int(t.untyped_storage()._cdata))
            except (RuntimeError, NotImplementedError):
                continue
        elif isinstance(t, (list, tuple)):
            out |= _storages(t)
    return out


def _aliases_input(values: list[Any], out: Any) -> bool:
    """Whether every tensor ``out`` holds lives in the storage of an input (a view or the input)."""
    outs = _storages(out)
    return bool(outs) and outs <= _storages(values)


def _devices(args: Any, out: Any) -> str:
    """``"cuda"`` when any tensor operand or output is on the (emulated) GPU, else ``"cpu"``."""
    for v in (*args, out):
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                return "cuda"
    return "cpu"


class _Pending:
    """The recorded row of a functional collective, for its wait."""

    row: int | None = None


@functools.cache
def _wrapper_subclass(t: type) -> bool:
    """A tensor subclass that wraps other tensors (DTensor, FSDP2's sharded parameters), not the
    fake tensors the emulated device is made of."""
    return t is not torch.Tensor and not issubclass(t, FakeTensor) and hasattr(t, "__tensor_flatten__")


def _quiet_sharding_propagation(state: State) -> bool:
    """Make DTensor's sharding propagation invisible to the recorder: it runs the op on fake
    tensors of the *global* shapes to learn the output's shape (under the active fake mode, so
    through here), which no GPU runs and no allocator holds. Patched when the first DTensor op is
    seen (importing DTensor up front would cost every emulated process ~1 s)."""
    mod = sys.modules.get("torch.distributed.tensor._sharding_prop")
    cls = getattr(mod, "ShardingPropagator", None)
    original = getattr(cls, "_propagate_tensor_meta_non_cached", None)
    if original is None:
        return False

    def propagate(self: Any, *a: Any, **k: Any) -> Any:
        state.meta_only += 1
        try:
            return original(self, *a, **k)
        finally:
            state.meta_only -= 1

    cls._propagate_tensor_meta_non_cached = propagate
    return True


class Recorder(TorchDispatchMode):
    """Dispatch mode recording each op (see the module doc); ``comm`` describes collectives."""

    def __init__(self, state: State, memory: Memory, describe: Any = None, dispatched: Any = None,
                 group_cls: Any = None, fake_mode: Any = None) -> None:
        super().__init__()
        self.state = state
        self.memory = memory
        self.describe = describe  # collective -> its record (:func:`.dist.describe`)
        self.dispatched = dispatched  # a dispatched c10d op -> its collective (:func:`.dist.dispatched`)
        self.group_cls = group_cls  # the emulated process group class (told when a c10d op calls it)
        self.fake_mode = fake_mode
        self.last = time.perf_counter_ns()
        self._functional: dict[int, _Pending] = {}  # output storage -> its functional collective
        self._quiet_propagation = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if any(_wrapper_subclass(t) for t in types):
            # a DTensor (or another wrapper subclass) op: its class runs it as ops on the local
            # shards, and collectives where placements change, which come back here and are what a
            # GPU runs (recorded here it would be one op at the global shape, its collectives unseen)
            if not self._quiet_propagation:
                self._quiet_propagation = _quiet_sharding_propagation(self.state)
            return NotImplemented
        if self.state.meta_only:  # DTensor deriving an output's global shape: no device work
            return func(*args, **kwargs)
        start = time.perf_counter_ns()
        kwargs = kwargs or {}
        name = func._schema.name
        if name in SKIPPED:
            return func(*args, **kwargs)
        comm = name.startswith("c10d::")
        if self.fake_mode is not None and (comm or name in _DEVICE_MOVES and _to_cuda(args, kwargs)):
            # a collective moves no data here, and a real host tensor moved to the emulated GPU
            # (``x[:, [0, -1]]`` under inference mode dispatches ``aten::to`` of the index list)
            # cannot be computed for real: they take part as fakes
            args, kwargs = _to_fake(self.fake_mode, args), _to_fake(self.fake_mode, kwargs)
        try:
            if comm and self.group_cls is not None:
                self.group_cls.inside_dispatch = True
                self.group_cls.last_work = None
            # host bookkeeping (step counters, device-mesh coordinates, small index tensors) runs
            # for real, so its values exist when the program reads them
            host = _host_inputs(args, kwargs)
            if host is not None and 0 < host <= _SMALL_HOST_NUMEL:
                with unset_fake_temporarily():
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
                if host == 0 and _small_host_outputs(out):  # a factory of a small host tensor
                    with unset_fake_temporarily():
                        out = func(*args, **kwargs)
        except DataDependentOutputException:
            if name not in _VALUE_READS:
                raise self._fail(f"{name} needs tensor values, which emulation does not have "
                                 f"(called at {program_line()})") from None
            out = self._placeholder(args[0])
        except UnsupportedOperatorException:
            raise self._fail(f"{name} has no shape rule (a custom kernel or extension without a fake/meta "
                             f"implementation), called at {program_line()}") from None
        except DynamicOutputShapeException:
            raise self._fail(f"{name} returns a shape that depends on tensor values, which emulation "
                             f"does not have (called at {program_line()})") from None
        finally:
            if comm and self.group_cls is not None:
                self.group_cls.inside_dispatch = False
        st = self.state
        if st.recording and comm and self.dispatched is not None:
            values = list(args) + [kwargs[a.name] for a in func._schema.arguments[len(args):] if a.name in kwargs]
            d = self.dispatched(name, values)
            if d is not None:
                self.last = start
                work = getattr(self.group_cls, "last_work", None)
                self.record_comm(name, *d, work=work)
        elif st.recording and name.startswith("_c10d_functional::") and self.dispatched is not None:
            self._record_functional(func, name, args, kwargs, out, start)
        elif st.recording:
            self._record(func, name, args, kwargs, out, start)
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, FakeTensor) and t.device.type == "cuda":
                self.memory.track(t)
        self.last = time.perf_counter_ns()
        return out

    def _fail(self, message: str) -> EmulationError:
        self.state.error = self.state.error or message
        if self.state.on_error is not None:
            self.state.on_error()  # a forked worker may end without running exit handlers
        return EmulationError(message)

    def _placeholder(self, t: torch.Tensor) -> Any:
        self.state.placeholder_reads += 1
        if t.dtype == torch.bool:
            return False
        return 0 if not t.dtype.is_floating_point else 0.0

    def _record(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any, start: int) -> None:
        st = self.state
        values = list(args)
        for a in func._schema.arguments[len(args):]:
            if a.kwarg_only or a.name in kwargs:
                values.append(kwargs.get(a.name))
        dims, typ, conc = zip(*(_operand(v) for v in values)) if values else ((), (), ())
        device = _devices(values, out)
        # no kernel: allocation and metadata ops, and any op that hands back (a view of) one of its
        # inputs — views, ``to`` without a change, ``dropout`` in eval, ``contiguous`` of a contiguous
        # tensor; an in-place op (``add_``) writes its input and does launch one
        inplace = name.endswith("_") and not name.endswith("__")
        kind = "none" if name in NO_KERNEL or (not inplace and _aliases_input(values, out)) else "kernel"
        if name in _DROPOUTS and len(values) > 2 and values[2] is False:
            kind = "none"  # dropout in eval is the identity (composite: no kernel)
        if name in _VALUE_READS:
            kind = "sync"
        module = st.modules[-1] if st.modules and st.phase == "forward" else ""
        reads = sorted(_storages(values)) if device == "cuda" and kind != "none" else []
        st.add((name, (start - self.last) / 1e3, list(dims), list(typ), list(conc), device, st.stream,
                        st.phase, module, kind, None, reads))

    def _record_functional(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any, start: int) -> None:
        """A functional collective (recorded as one, its output remembered for its wait) or its
        ``wait_tensor`` (the stream waits for the collective that made the tensor)."""
        from . import dist

        if name == dist.FUNCTIONAL_WAIT:
            pending = self._functional.pop(next(iter(_storages(args[:1])), None), None)
            if pending is not None:
                self.record_wait(pending.row)
            return
        values = list(args) + [kwargs[a.name] for a in func._schema.arguments[len(args):] if a.name in kwargs]
        d = dist.functional(name, values, out)
        if d is None:
            self._record(func, name, args, kwargs, out, start)
            return
        pending = _Pending()
        self.last = start
        self.record_comm(name, *d, work=pending)
        for key in _storages(d[2]):
            self._functional[key] = pending

    def record_comm(self, op: str, coll: str, ins: list[torch.Tensor], outs: list[torch.Tensor], ranks: list[int],
                    group: Any, peer: int | None, work: Any = None) -> None:
        """One collective or send/recv (called by the emulated process group)."""
        st = self.state
        now = time.perf_counter_ns()
        if st.recording and self.describe is not None:
            tens = ins or outs
            dims = [[list(t.shape) for t in tens]] if tens else [[]]
            typ = ["TensorList"] if tens else [""]
            comm = self.describe(coll, ins, outs, ranks, group, peer)
            comm["writes"] = sorted(_storages(outs) | _storages(ins)) if coll not in ("send",) else []
            module = st.modules[-1] if st.modules and st.phase == "forward" else ""
            st.add((op, (now - self.last) / 1e3, dims, typ, [""], comm["device"], st.stream, st.phase,
                            module, "comm", comm, []))
            if work is not None:
                work.row = len(st.rows) - 1
        self.last = time.perf_counter_ns()

    def record_wait(self, row: int | None) -> None:
        """The program waits for collective ``row`` (``work.wait()``; a synchronous collective too):
        the current stream waits for its end."""
        st = self.state
        if st.recording and row is not None and 0 <= row < len(st.rows):
            st.add(("c10d::wait", 0.0, [], [], [], "cuda", st.stream, st.phase, "", "wait", {"row": row}, []))


def install_module_hooks(state: State, register: bool = True) -> tuple[Any, Any]:
    """Module path of forward ops: forward pre/post hooks keep a stack of qualified names
    (``GPT.blocks.3.attn``), named from each root module's ``named_modules`` when first seen;
    registered as global module hooks, or (``register=False``) returned to be called by the host
    counter. ``(pre, post)``."""
    names: dict[int, str] = {}

    def pre(module: torch.nn.Module, _args: Any) -> None:
        if id(module) not in names:
            root = type(module).__name__
            for sub_name, sub in module.named_modules():
                names.setdefault(id(sub), f"{root}.{sub_name}" if sub_name else root)
        state.modules.append(names[id(module)])

    def post(_module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if state.modules:
            state.modules.pop()

    if register:
        torch.nn.modules.module.register_module_forward_pre_hook(pre)
        torch.nn.modules.module.register_module_forward_hook(post)
    return pre, post


def install_phase_hooks(state: State) -> None:
    """Autograd phase: ``backward`` while ``torch.autograd.backward``/``grad`` run, ``optimizer``
    inside ``Optimizer.step``, else ``forward``."""
    for mod, attr in ((torch.autograd, "backward"), (torch.autograd, "grad")):
        inner = getattr(mod, attr)

        def wrapped(*a, _inner=inner, **k):  # noqa: ANN002, ANN003, ANN202
            prev, state.phase = state.phase, "backward"
            try:
                return _inner(*a, **k)
            finally:
                state.phase = prev

        setattr(mod, attr, wrapped)
    _optim_hooks().register_optimizer_step_pre_hook(lambda *_: setattr(state, "phase", "optimizer"))
    _optim_hooks().register_optimizer_step_post_hook(lambda *_: setattr(state, "phase", "forward"))



def _optim_hooks():  # noqa: ANN202
    """``torch.optim.optimizer`` (the package deletes the attribute; the module holds the hooks)."""
    import importlib

    return importlib.import_module("torch.optim.optimizer")
