"""``torch.distributed`` under emulation: PyTorch's fake process group, collectives recorded.

``init_process_group`` (any backend: ``nccl``, ``gloo``, ``cpu:gloo,cuda:nccl``) gets the fake
backend and a fake store, with the rank and world size the program asked for (or ``RANK`` /
``WORLD_SIZE``); no rendezvous, no data. ``new_group`` and DeviceMesh build on it unchanged.
DDP's start-up checks that read parameter values across ranks are skipped (values do not exist).
Each collective reaches the recorder as a ``c10d::`` op; :class:`Collectives` describes it as
the profiler does for NCCL (collective name, message sizes, dtype, group name and ranks, peer).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch
import torch.distributed as dist

# the profiler's collective names, by c10d op
COLLECTIVE = {
    "c10d::allreduce_": "allreduce", "c10d::allreduce_coalesced_": "allreduce_coalesced",
    "c10d::allgather_": "allgather", "c10d::_allgather_base_": "_allgather_base",
    "c10d::allgather_into_tensor_coalesced_": "allgather_into_tensor_coalesced",
    "c10d::reduce_scatter_": "reduce_scatter", "c10d::_reduce_scatter_base_": "_reduce_scatter_base",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "c10d::alltoall_base_": "all_to_all", "c10d::alltoall_": "all_to_all", "c10d::broadcast_": "broadcast",
    "c10d::reduce_": "reduce", "c10d::gather_": "gather", "c10d::scatter_": "scatter",
    "c10d::barrier": "barrier", "c10d::send": "send", "c10d::recv_": "recv", "c10d::recv_any_source_": "recv",
    "c10d::monitored_barrier_": "barrier",
}


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    return []


def _group(values: list[Any]) -> Any:
    for v in values:
        if isinstance(v, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(v)
            except (RuntimeError, TypeError, AttributeError):
                continue
    return None


class Collectives:
    """Describes each recorded collective (see the module doc)."""

    def describe(self, name: str, values: list[Any]) -> dict[str, Any]:
        coll = COLLECTIVE.get(name, name.removeprefix("c10d::").rstrip("_"))
        tens = [t for v in values for t in _tensors(v)]
        pg = _group(values)
        ranks = dist.get_process_group_ranks(pg) if pg is not None else list(range(dist.get_world_size()))
        first = values[0] if values else None
        ins = _tensors(values[1]) if coll in ("_allgather_base", "_reduce_scatter_base", "all_to_all") and \
            len(values) > 1 else _tensors(first)
        outs = _tensors(first)
        if coll in ("allgather", "reduce_scatter", "allgather_into_tensor_coalesced"):
            outs, ins = _tensors(values[0]), _tensors(values[1])
        in_n = sum(t.numel() for t in ins)
        out_n = sum(t.numel() for t in outs)
        if coll in ("allgather",):
            out_n = sum(t.numel() for t in outs)
        peer = None
        if coll in ("send", "recv"):
            ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
            if ints:
                peer = ranks[ints[0]] if 0 <= ints[0] < len(ranks) else ints[0]
        dtype = tens[0].dtype if tens else torch.float32
        return {"coll": coll, "in_nelems": int(in_n), "out_nelems": int(out_n),
                "elem_bytes": int(torch.empty((), dtype=dtype, device="meta").element_size()),
                "dtype": str(dtype).removeprefix("torch."), "ranks": list(ranks),
                "group": getattr(pg, "group_name", "0") if pg is not None else "0", "peer": peer,
                "device": tens[0].device.type if tens else "cuda"}


def install(rank: int, world: int) -> None:
    """Route every ``init_process_group`` to the fake backend (see the module doc)."""
    import torch.testing._internal.distributed.fake_pg as fake_pg  # registers the "fake" backend

    original = dist.init_process_group

    sig = inspect.signature(original)

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        asked = sig.bind_partial(*args, **kwargs).arguments
        r = int(asked.get("rank", -1) if asked.get("rank") is not None else -1)
        w = int(asked.get("world_size", -1) if asked.get("world_size") is not None else -1)
        r = r if r >= 0 else int(os.environ.get("RANK", rank))
        w = w if w > 0 else int(os.environ.get("WORLD_SIZE", world))
        original("fake", store=fake_pg.FakeStore(), rank=r, world_size=w)

    dist.init_process_group = init_process_group
    torch.distributed.distributed_c10d.init_process_group = init_process_group
    import torch.distributed.utils as dist_utils
    import torch.nn.parallel.distributed as ddp_module

    def no_check(*_a: Any, **_k: Any) -> None:
        return None

    dist_utils._verify_param_shape_across_processes = no_check
    ddp_module._verify_param_shape_across_processes = no_check
    dist_utils._sync_module_states = no_check
    ddp_module._sync_module_states = no_check
