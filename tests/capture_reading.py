"""An independent reader of the sample captures' PyTorch execution traces, for tests: counts read
with plain ``json``/``gzip``, never through ettools' readers."""

from __future__ import annotations

import math
from pathlib import Path

from shared_kineto import read_json

FLOAT = 4  # the sample models are float32
# c10d op -> (Chakra type, index of the input whose size is comm_size)
C10D = {
    "c10d::allreduce_": ("ALL_REDUCE", 0),
    "c10d::_allgather_base_": ("ALL_GATHER", 1),
    "c10d::_reduce_scatter_base_": ("REDUCE_SCATTER", 1),
    "c10d::alltoall_base_": ("ALL_TO_ALL", 1),
    "c10d::send": ("SEND", 0),
    "c10d::recv_": ("RECV", 0),
}


def numel(shape) -> int:
    """Elements of a shape, or of a list of shapes."""
    if shape and isinstance(shape[0], list):
        return sum(numel(s) for s in shape)
    return math.prod(shape) if shape else 0


def captured(path: Path) -> tuple[int, dict[str, list[int]], list[tuple[str, int]]]:
    """(aten::mm count, {type: [count, bytes]}, [(SEND|RECV, tag)]) of one captured execution trace.

    Bytes follow Chakra's ``comm_size`` meaning, from the input shapes of the ``c10d::`` ops.
    """
    et = read_json(path)
    mm = 0
    comm: dict[str, list[int]] = {}
    tags = []
    for n in et["nodes"]:
        name = n["name"]
        if name == "aten::mm":
            mm += 1
        elif name in C10D:
            kind, idx = C10D[name]
            t = comm.setdefault(kind, [0, 0])
            t[0] += 1
            t[1] += numel(n["inputs"]["shapes"][idx]) * FLOAT
            if kind in ("SEND", "RECV"):
                tags.append((kind, n["inputs"]["values"][-1]))
    return mm, comm, tags
