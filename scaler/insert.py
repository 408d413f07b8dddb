"""Collectives inserted between producer and consumer units of a step: :class:`Inserter` chains
them on one process group and orders them as the program issues them. Used by tensor
parallelism (:mod:`ettools.scaler.tp`) and TrioSim's flagged form of it
(:mod:`ettools.scaler.triosim`), below both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ettools.graph import CollectiveType, EdgeKind, NodeType
from ettools.scaler.dp import consumer_row, producer_row, unit_device_rows
from ettools.scaler.edit import Editor, comm_time_us
from ettools.scaler.model import StepModel


@dataclass
class Step:
    """One collective of a chain: its type and bytes."""

    kind: CollectiveType
    bytes: int


class Inserter:
    """Appends collectives to an :class:`Editor` between producer and consumer units."""

    def __init__(self, ed: Editor, m: StepModel, group: str, size: int) -> None:
        self.ed, self.m, self.group, self.size = ed, m, group, size
        self.devs = unit_device_rows(m)
        self.nodes: list[tuple[float, int, int]] = []  # (program position, row, id)
        # issue order = the program order of the units they follow (host order: device times of a
        # GPU trace run behind the host and would interleave forward and backward collectives)
        self.upos = np.full(len(m.g), -1.0)
        self.upos[m.units] = np.arange(len(m.units), dtype=np.float64)

    def chain(self, steps, after: int | None, before: list[int], phase: str) -> int:
        """Collectives ``steps`` in a row after unit ``after`` (None: no producer), before ``before`` units."""
        ed, m = self.ed, self.m
        start = ed.current("start")
        dur = ed.current("dur")
        if after is not None:
            prod = producer_row(m, after, self.devs)
            t = float(start[prod] + np.nan_to_num(dur[prod]))
            prev_id = int(m.g.id[prod])
            pos = float(self.upos[int(m.unit[after])]) if m.unit[after] >= 0 else 0.0
        else:
            t = float(min(start[consumer_row(m, c, self.devs)] for c in before))
            prev_id = -1
            pos = min(float(self.upos[int(m.unit[c])]) for c in before) - 0.5
        last = -1
        for s in steps:
            kind = CollectiveType(int(s.kind))
            nbytes = int(s.bytes)
            d = comm_time_us(kind.name, nbytes, self.size, m.has_device)
            row, nid = ed.add_node(
                f"{kind.name.lower()} tp.{phase}", NodeType.COMM_COLL_NODE, start=t, dur=d,
                is_cpu_op=0 if m.has_device else 1, comm_type=int(kind), comm_bytes=nbytes,
                comm_group=self.group, resource=f"comm {self.group}")
            ed.set_attr(row, "scaler", f"tp.{phase}", "string_val")
            if prev_id >= 0:
                ed.add_edge(row, prev_id, EdgeKind.DATA)
            self.nodes.append((pos, row, nid))
            t += d
            prev_id = nid
            last = nid
        for c in before:
            ed.add_edge(consumer_row(m, c, self.devs), last, EdgeKind.DATA)
        return last

    def order(self) -> None:
        """Chain the group's collectives in issue order (one communicator runs them in turn)."""
        nodes = sorted(self.nodes)
        for (_, _, a), (_, row_b, _) in zip(nodes[:-1], nodes[1:]):
            self.ed.add_edge(row_b, a, EdgeKind.ORDER)
