"""The rank mesh: which rank sits where along the axes ``tp``, ``cp``, ``ep``, ``edp``, ``pp``
(:class:`Mesh`), and the members and index of every process group along a set of axes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan import AXES

MESH_AXES = AXES + ("pp",)
# DualPipe's gradient group: along ``pp``, the pairs of stages {p, pp - 1 - p} (one pair per group)
MIRROR = "mirror"


@dataclass
class Mesh:
    """Rank layout: ``rank = tp_i + tp·(cp_i + cp·(ep_i + ep·(edp_i + edp·pp_i)))``."""

    sizes: dict[str, int]

    @property
    def world(self) -> int:
        """Total ranks."""
        return int(np.prod([self.sizes[a] for a in MESH_AXES]))

    def coords(self, ranks: np.ndarray) -> dict[str, np.ndarray]:
        """Coordinate of each rank along each axis."""
        out = {}
        r = np.asarray(ranks, np.int64)
        for a in MESH_AXES:
            out[a] = r % self.sizes[a]
            r = r // self.sizes[a]
        return out

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis``."""
        s = 1
        for a in MESH_AXES:
            if a == axis:
                return s
            s *= self.sizes[a]
        raise KeyError(axis)

    def group_index(self, ranks: np.ndarray, axes: tuple[str, ...]) -> np.ndarray:
        """Index of the ``axes`` group each rank belongs to (mixed radix over the other axes).
        Axis ``emb`` (the embedding group: first and last pipeline stage) is indexed as ``pp``; axis
        ``mirror`` (DualPipe's pairs of stages ``p`` and ``pp − 1 − p``) adds the pair's index."""
        mirror = MIRROR in axes
        axes = _mesh_axes(axes)
        c = self.coords(ranks)
        idx = np.zeros(len(np.atleast_1d(ranks)), np.int64)
        mult = 1
        for a in MESH_AXES:
            if a in axes:
                continue
            idx += c[a] * mult
            mult *= self.sizes[a]
        if mirror:
            p = c["pp"]
            idx += np.minimum(p, self.sizes["pp"] - 1 - p) * mult
        return idx

    def n_groups(self, axes: tuple[str, ...]) -> int:
        """Number of groups along ``axes``."""
        n = self.world // int(np.prod([self.sizes[a] for a in _mesh_axes(axes)]))
        # mirror pairs: pp / 2 groups along pp (pp is even under DualPipe)
        return n * (self.sizes["pp"] // 2) if MIRROR in axes else n

    def group_members(self, axes: tuple[str, ...]) -> np.ndarray:
        """``[n_groups, group_size]`` array of member ranks (ascending) of every ``axes`` group
        (``emb``: the first and the last rank of each pipeline group)."""
        ranks = np.arange(self.world, dtype=np.int64)
        gi = self.group_index(ranks, axes)
        order = np.argsort(gi, kind="stable")
        out = ranks[order].reshape(self.n_groups(axes), -1)
        return out[:, [0, -1]] if "emb" in axes and out.shape[1] > 1 else out


def _mesh_axes(axes: tuple[str, ...]) -> tuple[str, ...]:
    """Mesh axes of a group: the embedding group ``emb`` and the ``mirror`` pairs lie along ``pp``."""
    return tuple("pp" if a in ("emb", MIRROR) else a for a in axes)
