"""Instantiation: numbers into the symbolic programs, programs into per-rank graphs.

Ranks of one pipeline stage run the same nodes; they differ only in the process groups of their
collectives and the peers of their sends/receives. So a graph is built once per stage
(:class:`StageGraph`, with a *slot* per collective — the set of mesh axes of its group — and a
peer *offset* per send/recv) and every rank is stamped out of it by looking its groups and peers
up (:meth:`Stamper.rank_graph`), sharing all other columns.

A stage graph is assembled from program *instances* (a module's forward for micro-batch 7, the
backward of layer 12, …) without a Python loop over nodes: each program is evaluated once into
numpy columns, instances of the same program are tiled with offset ids, and the links between
instances (ports, see :class:`~.program.Program`) are resolved once per instance.

Programs become arrays in :mod:`.compiled`, the rank layout is :mod:`.mesh`'s, stage graphs are
assembled in :mod:`.stage`; this module stamps ranks out of them (:class:`Stamper`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.graph import AttrColumn, ProcessGroup, RankGraph, StringTable, TraceMeta

# what moved to compiled, mesh and stage stays importable from here (synth imports it here)
from .compiled import (  # noqa: F401
    DEFAULT_DEVICE,
    FP8_GEMM,
    SHAPE_ATTRS,
    SHAPE_COLS,
    SHAPE_KINDS,
    Compiled,
    compile_program,
    merge_sync,
)
from .mesh import MESH_AXES, Mesh  # noqa: F401
from .stage import StageGraph, assign_stages, build_stage  # noqa: F401


class Stamper:
    """Per-rank graphs from stage graphs: group names from slots, peers from offsets."""

    def __init__(self, mesh: Mesh, stages: list[StageGraph], slots: dict[tuple, int], strings: StringTable,
                 meta_extra: dict[str, Any] | None = None) -> None:
        self.mesh = mesh
        self.stages = stages
        self.slots = slots
        self.strings = strings
        self.slot_axes = [ax for ax, _ in sorted(slots.items(), key=lambda kv: kv[1])]
        self.meta_extra = meta_extra or {}
        self._groups: dict[int, np.ndarray] = {}  # slot -> name id per group index

    def group_name(self, axes: tuple[str, ...], index: int) -> str:
        """Name of the ``index``-th group along ``axes`` (``"tp.3"``, ``"cp+tp.0"``)."""
        return f"{'+'.join(axes)}.{index}"

    def register_groups(self, meta: TraceMeta) -> None:
        """Add every group any slot uses to ``meta.process_groups``."""
        for s, axes in enumerate(self.slot_axes):
            members = self.mesh.group_members(axes)
            ids = np.empty(len(members), np.int32)
            for gi, row in enumerate(members.tolist()):
                name = self.group_name(axes, gi)
                meta.add_group(ProcessGroup(name, tuple(row), desc="+".join(axes)))
                ids[gi] = self.strings.intern(name)
            self._groups[s] = ids

    def stage_of(self, rank: int) -> int:
        """Pipeline stage of ``rank``."""
        return int(self.mesh.coords(np.array([rank]))["pp"][0])

    def slot_groups(self, rank: int) -> np.ndarray:
        """Group index of ``rank`` for every slot."""
        r = np.array([rank])
        return np.array([int(self.mesh.group_index(r, ax)[0]) for ax in self.slot_axes], np.int64)

    def rank_graph(self, rank: int) -> RankGraph:
        """The graph of ``rank`` (node columns shared with its stage graph but groups and peers)."""
        sg = self.stages[self.stage_of(rank)]
        c = sg.cols
        slot = c["slot"]
        comm_group = np.full(sg.n, -1, np.int32)
        has = slot >= 0
        if has.any():
            gidx = self.slot_groups(rank)
            table = np.array([self._groups[s][gidx[s]] for s in range(len(self.slot_axes))], np.int32)
            comm_group[has] = table[slot[has]]
        peer = np.where(sg.tags >= 0, rank + sg.peer_delta, -1).astype(np.int32)
        ids = sg.cols.get("_ids")
        if ids is None:
            ids = sg.cols["_ids"] = np.arange(sg.n, dtype=np.uint64)  # shared by the stage's ranks
        res = sg.cols.get("_resource")
        if res is None:
            # NCCL runs a communicator's collectives one at a time on its stream: one lane per group
            streams = np.array([self.strings.intern(f"stream nccl {'+'.join(ax)}") for ax in self.slot_axes]
                               + [-1], np.int32)
            res = sg.cols["_resource"] = streams[np.where(slot >= 0, slot, len(self.slot_axes))]
        cols = {"id": ids, "name": c["name"], "type": c["type"], "dur": c["dur"], "is_cpu_op": _zeros_i8(sg),
                "resource": res,
                "num_ops": c["num_ops"], "tensor_size": c["tensor_size"], "comm_type": c["comm_type"],
                "comm_bytes": c["comm_bytes"], "comm_group": comm_group, "comm_peer": peer,
                "comm_tag": sg.tags}
        meta = {"synth_stage": sg.stage, "peak_memory_bytes": sg.peak_memory,
                "model_flops": sg.model_flops}
        meta.update(self.meta_extra)
        attrs = _shape_attrs(sg)
        if meta.get("durations"):
            from ettools.converters.chakra.metadata import synth_metadata

            # written to the Chakra GlobalMetadata: a reader knows the durations are estimates
            meta["chakra_metadata"] = synth_metadata(meta)
        return RankGraph(rank, self.strings, cols, sg.dep_ptr, sg.dep_id, sg.dep_kind, dict(attrs), meta=meta)


def _shape_attrs(sg: StageGraph) -> dict[str, AttrColumn]:
    """The local op shapes of a stage as sparse ``int64_list`` attributes (``gemm_shape`` = m, n,
    k, batch; ``attention_shape`` = batch, seq_q, seq_kv, heads·head_dim), built once per stage:
    they travel with the graph (and a Chakra file) so a compute model can time each op by its shape."""
    cached = sg.cols.get("_shape_attrs")
    if cached is None:
        cached = {}
        kind = sg.cols.get("shape_kind")
        if kind is not None:
            for code, attr in SHAPE_ATTRS.items():
                rows = np.flatnonzero((kind == code) | ((kind == FP8_GEMM) & (code == SHAPE_KINDS["gemm"])))
                if len(rows):
                    cached[attr] = AttrColumn("int64_list", rows.astype(np.int64), sg.cols["shape"][rows].tolist())
            rows = np.flatnonzero(kind == FP8_GEMM)
            if len(rows):
                cached["compute_dtype"] = AttrColumn("string_val", rows.astype(np.int64), ["fp8"] * len(rows))
        sg.cols["_shape_attrs"] = cached  # type: ignore[assignment]
    return cached


def _zeros_i8(sg: StageGraph) -> np.ndarray:
    z = sg.cols.get("_is_cpu")
    if z is None:
        z = sg.cols["_is_cpu"] = np.zeros(sg.n, np.int8)
    return z


__all__ = ["DEFAULT_DEVICE", "Compiled", "Mesh", "StageGraph", "Stamper", "assign_stages", "build_stage",
           "compile_program"]
