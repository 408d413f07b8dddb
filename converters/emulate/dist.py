"""``torch.distributed`` under emulation: a process group that moves no data, collectives recorded.

``init_process_group`` (any backend: ``nccl``, ``gloo``, ``cpu:gloo,cuda:nccl``) gets the
``ettools`` backend (:class:`EmulatedGroup`) and a fake store, with the rank and world size the
program asked for (or ``RANK`` / ``WORLD_SIZE``); no rendezvous. ``new_group`` and DeviceMesh
build on it unchanged. Every collective and send/recv — called from Python or from C++ (DDP's
reducer, ``all_gather_into_tensor``) — reaches the group, which records it (collective name,
message sizes, dtype, group name and global ranks, peer) and returns a completed work whose future
holds its outputs. DDP's start-up checks that read parameter values across ranks are skipped.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

import torch
import torch.distributed as dist


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    return []


class _Done(dist.Work):
    """A collective that is complete at once; its future holds the output tensors (DDP's reducer
    and ``work.get_future()`` users read them)."""

    waited: Any = None  # set by :func:`install`: ``waited(row)`` records a wait for the collective

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._result = result
        self.row: int | None = None  # the recorded collective

    def wait(self, timeout: Any = None) -> bool:
        if _Done.waited is not None:
            _Done.waited(self.row)
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(self._result)
        return fut


_COLL_OF_OP = {
    "c10d::allreduce_": "allreduce", "c10d::allreduce_coalesced_": "allreduce_coalesced",
    "c10d::allgather_": "allgather", "c10d::_allgather_base_": "_allgather_base",
    "c10d::allgather_into_tensor_coalesced_": "allgather_into_tensor_coalesced",
    "c10d::allgather_coalesced_": "allgather", "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::_reduce_scatter_base_": "_reduce_scatter_base",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced", "c10d::alltoall_base_": "all_to_all",
    "c10d::alltoall_": "all_to_all", "c10d::broadcast_": "broadcast", "c10d::reduce_": "reduce",
    "c10d::gather_": "gather", "c10d::scatter_": "scatter", "c10d::barrier": "barrier", "c10d::send": "send",
    "c10d::recv_": "recv", "c10d::recv_any_source_": "recv",
}


def dispatched(name: str, values: list[Any]) -> tuple[str, list, list, list[int], Any, int | None] | None:
    """``(collective, inputs, outputs, global ranks, group, global peer)`` of a ``c10d::`` op as the
    dispatcher passes it (outputs first, then inputs, then the group), None for other ``c10d`` ops."""
    coll = _COLL_OF_OP.get(name)
    if coll is None:
        return None
    pg, at = None, -1
    for i, v in enumerate(values):
        if isinstance(v, torch.ScriptObject):
            try:
                pg, at = dist.ProcessGroup.unbox(v), i
                break
            except (RuntimeError, TypeError, AttributeError):
                continue
    if pg is None:
        return None
    before = values[:at]
    first = _tensors(before[0]) if before else []
    second = _tensors(before[1]) if len(before) > 1 else []
    outs, ins = (first, second) if second else (first, first)
    if coll == "send":
        outs = []
    elif coll == "recv":
        ins = []
    elif coll == "barrier":
        ins, outs = [], []
    ranks = dist.get_process_group_ranks(pg)
    peer = None
    if coll in ("send", "recv"):
        ints = [v for v in values[at + 1:] if isinstance(v, int) and not isinstance(v, bool)]
        if ints:
            peer = ranks[ints[0]] if 0 <= ints[0] < len(ranks) else ints[0]
    return coll, ins, outs, ranks, pg, peer


# functional collectives (DTensor, torchtitan, compiled code): ops that return their result and
# are waited on with ``_c10d_functional::wait_tensor``; the fake mode answers their shapes without
# calling any process group, so they are recorded from the dispatched op itself
_COLL_OF_FUNCTIONAL = {
    "all_reduce": "allreduce", "all_reduce_": "allreduce", "all_reduce_coalesced": "allreduce_coalesced",
    "all_reduce_coalesced_": "allreduce_coalesced", "all_gather_into_tensor": "_allgather_base",
    "all_gather_into_tensor_out": "_allgather_base", "all_gather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
    "reduce_scatter_tensor": "_reduce_scatter_base", "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
}
FUNCTIONAL_WAIT = "_c10d_functional::wait_tensor"


def functional(name: str, values: list[Any], out: Any) -> tuple[str, list, list, list[int], Any, None] | None:
    """``(collective, inputs, outputs, global ranks, group, None)`` of a ``_c10d_functional::`` op
    (its group named by its last string argument), None for other ops."""
    if not name.startswith("_c10d_functional::"):
        return None
    coll = _COLL_OF_FUNCTIONAL.get(name.split("::", 1)[1])
    names = [v for v in values if isinstance(v, str)]
    if coll is None or not names:
        return None
    try:
        pg = dist.distributed_c10d._resolve_process_group(names[-1])
    except (RuntimeError, KeyError, ValueError):
        return None
    ins = _tensors(values[0]) if values else []
    outs = _tensors(out) if not name.endswith("_") else ins
    return coll, ins, outs, dist.get_process_group_ranks(pg), pg, None


class EmulatedGroup(dist.ProcessGroup):
    """A process group that moves no data and records each call with the recorder (see the module
    doc). Registered for cpu and cuda tensors as the ``ettools`` backend."""

    record: Any = None  # set by :func:`install`: ``record(op, coll, ins, outs, ranks, group, peer)``
    coalesced: int | None = None  # the ``batch_isend_irecv`` call now issuing send/recv (numbered)
    _batches = 0
    inside_dispatch = False  # a dispatched c10d op (recorded by the recorder) is calling the group
    last_work: Any = None  # the work of the latest call (linked to its record by the recorder)

    def getBackendName(self) -> str:  # noqa: N802 - the c10d API
        return "ettools"

    @property
    def group_name(self) -> str:
        """The name c10d registered this group under (DeviceMesh and functional collectives ask)."""
        return _group_name(self)

    @property
    def group_desc(self) -> str:
        return "emulated"

    def _done(self, op: str, coll: str, ins: Any, outs: Any, peer: int | None = None) -> _Done:
        work = _Done(_tensors(outs))
        EmulatedGroup.last_work = work
        if EmulatedGroup.record is not None and not EmulatedGroup.inside_dispatch:
            ranks = dist.get_process_group_ranks(self) if self.size() > 0 else []
            g_peer = ranks[peer] if peer is not None and 0 <= peer < len(ranks) else peer
            EmulatedGroup.record(op, coll, _tensors(ins), _tensors(outs), ranks, self, g_peer, work=work)
        return work

    def allreduce(self, tensors: Any, opts: Any = None) -> _Done:
        return self._done("c10d::allreduce_", "allreduce", tensors, tensors)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> _Done:
        return self._done("c10d::allreduce_coalesced_", "allreduce_coalesced", tensors, tensors)

    def allgather(self, outs: Any, ins: Any, opts: Any = None) -> _Done:
        return self._done("c10d::allgather_", "allgather", ins, outs)

    def _allgather_base(self, out: Any, inp: Any, opts: Any = None) -> _Done:
        return self._done("c10d::_allgather_base_", "_allgather_base", inp, out)

    def allgather_into_tensor_coalesced(self, outs: Any, ins: Any, opts: Any = None) -> _Done:
        return self._done("c10d::allgather_into_tensor_coalesced_", "allgather_into_tensor_coalesced", ins, outs)

    def reduce_scatter(self, outs: Any, ins: Any, opts: Any = None) -> _Done:
        return self._done("c10d::reduce_scatter_", "reduce_scatter", ins, outs)

    def _reduce_scatter_base(self, out: Any, inp: Any, opts: Any = None) -> _Done:
        return self._done("c10d::_reduce_scatter_base_", "_reduce_scatter_base", inp, out)

    def reduce_scatter_tensor_coalesced(self, outs: Any, ins: Any, opts: Any = None) -> _Done:
        return self._done("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter_tensor_coalesced", ins, outs)

    def alltoall_base(self, out: Any, inp: Any, out_splits: Any = None, in_splits: Any = None,
                      opts: Any = None) -> _Done:
        return self._done("c10d::alltoall_base_", "all_to_all", inp, out)

    def alltoall(self, outs: Any, ins: Any, opts: Any = None) -> _Done:
        return self._done("c10d::alltoall_", "all_to_all", ins, outs)

    def broadcast(self, tensors: Any, opts: Any = None) -> _Done:
        return self._done("c10d::broadcast_", "broadcast", tensors, tensors)

    def reduce(self, tensors: Any, opts: Any = None) -> _Done:
        return self._done("c10d::reduce_", "reduce", tensors, tensors)

    def gather(self, outs: Any, ins: Any, opts: Any = None) -> _Done:
        return self._done("c10d::gather_", "gather", ins, outs)

    def scatter(self, outs: Any, ins: Any, opts: Any = None) -> _Done:
        return self._done("c10d::scatter_", "scatter", ins, outs)

    def send(self, tensors: Any, dst: int, tag: int = 0) -> _Done:
        return self._done("c10d::send", "send", tensors, [], peer=dst)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> _Done:
        return self._done("c10d::recv_", "recv", [], tensors, peer=src)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> _Done:
        return self._done("c10d::recv_any_source_", "recv", [], tensors)

    def barrier(self, opts: Any = None) -> _Done:
        return self._done("c10d::barrier", "barrier", [], [])

    def monitored_barrier(self, *_a: Any, **_k: Any) -> None:
        return None


def _group_name(group: Any) -> str:
    """The name c10d registered ``group`` under (``"0"`` for the world group)."""
    try:
        names = dist.distributed_c10d._world.pg_names
        name = names.get(group)
        if name is None:  # looked up through the C++ wrapper: compare identities
            name = next((v for k, v in names.items() if k is group or getattr(k, "_ettools_id", None) == id(group)),
                        None)
        return str(name or "0")
    except (AttributeError, RuntimeError):
        return "0"


def describe(coll: str, ins: list[torch.Tensor], outs: list[torch.Tensor], ranks: list[int], group: Any,
             peer: int | None) -> dict[str, Any]:
    """A collective as the profiler describes an NCCL one (see the module doc)."""
    tens = ins or outs
    dtype = tens[0].dtype if tens else torch.float32
    return {"coll": coll, "in_nelems": int(sum(t.numel() for t in ins)),
            "out_nelems": int(sum(t.numel() for t in outs)),
            "elem_bytes": int(torch.empty((), dtype=dtype, device="meta").element_size()),
            "dtype": str(dtype).removeprefix("torch."), "ranks": [int(r) for r in ranks],
            "group": _group_name(group), "peer": peer,
            "device": tens[0].device.type if tens else "cuda",
            # NCCL runs one batch_isend_irecv as one group: its sends and recvs progress together
            "coalesced": EmulatedGroup.coalesced if coll in ("send", "recv") else None}


def _coalescing(original: Any) -> Any:
    """``batch_isend_irecv`` numbering the send/recv it issues (see :func:`describe`): NCCL groups
    them (``ncclGroupStart``/``End``: one kernel), so a stage's "send activation" and "receive
    gradient" never wait for each other; recorded one after another they would deadlock a replay."""

    def batch_isend_irecv(p2p_op_list: Any) -> Any:
        EmulatedGroup._batches += 1
        EmulatedGroup.coalesced = EmulatedGroup._batches
        try:
            return original(p2p_op_list)
        finally:
            EmulatedGroup.coalesced = None

    return batch_isend_irecv


def install(rank: int, world: int, record: Any, waited: Any = None) -> None:
    """Route every ``init_process_group`` to the emulated group (see the module doc); ``record``
    receives each collective, ``waited`` each wait on one."""
    _Done.waited = waited
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def create(_store: Any, group_rank: int, group_size: int, _timeout: Any) -> EmulatedGroup:
        return EmulatedGroup(group_rank, group_size)

    if "ettools" not in dist.Backend.backend_list:
        dist.Backend.register_backend("ettools", create, devices=["cpu", "cuda"])
    EmulatedGroup.record = record
    original = dist.init_process_group
    sig = inspect.signature(original)

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        asked = sig.bind_partial(*args, **kwargs).arguments
        r = int(asked.get("rank", -1) if asked.get("rank") is not None else -1)
        w = int(asked.get("world_size", -1) if asked.get("world_size") is not None else -1)
        r = r if r >= 0 else int(os.environ.get("RANK", rank))
        w = w if w > 0 else int(os.environ.get("WORLD_SIZE", world))
        original("ettools", store=FakeStore(), rank=r, world_size=w)

    dist.init_process_group = init_process_group
    torch.distributed.distributed_c10d.init_process_group = init_process_group
    # modules that imported the function by name before this ran (DeviceMesh calls its own copy
    # when no group exists yet: ``init_device_mesh("cuda", …)`` alone starts the job)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("torch.") and getattr(mod, "init_process_group", None) is original:
            mod.init_process_group = init_process_group
    batch = dist.batch_isend_irecv
    grouped = _coalescing(batch)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("torch.") and getattr(mod, "batch_isend_irecv", None) is batch:
            mod.batch_isend_irecv = grouped
    dist.batch_isend_irecv = grouped
    import torch.distributed.utils as dist_utils
    import torch.nn.parallel.distributed as ddp_module

    def no_check(*_a: Any, **_k: Any) -> None:
        return None

    # DDP's start-up compares parameter shapes and broadcasts values across ranks: no values here
    dist_utils._verify_param_shape_across_processes = no_check
    ddp_module._verify_param_shape_across_processes = no_check
    dist_utils._sync_module_states = no_check
    ddp_module._sync_module_states = no_check
    # after its first iteration DDP rebuilds its buckets in gradient-ready order, agreeing on the
    # order by broadcasting index tensors' values; emulation keeps the first iteration's buckets
    torch._C._distributed_c10d.Reducer._rebuild_buckets = lambda self: False
    # DDP's runtime statistics time its iterations with CUDA events: nothing runs to time
    torch._C._distributed_c10d.Logger.set_runtime_stats_and_log = lambda self: None
