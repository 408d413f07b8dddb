"""Device memory from tensor lifetimes: one model shared by the structural check and the replay.

A rank graph's tensor table and node inputs/outputs give, per *storage* (tensors sharing a
``storage_id`` count once, at their largest extent ``(offset + numel) × elem_bytes``):

* when it is first and last touched, in a given node order;
* whether it is *resident*: its first use is a read (weights, optimizer state, inputs that exist
  before the step) — resident storages are live for the whole step;
* otherwise it is live from the node that first writes it to the end of the last node using it.

Only the device's tensors count: the GPU ones (``cuda``/``gpu``/``hip``/``xpu``/``mps``) when the
rank has any, else (CPU captures) all of them. All work is vectorized: O(uses + tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ettools.graph import RankGraph, TensorTable

DEVICE_PREFIXES = ("cuda", "gpu", "hip", "xpu", "mps")


def storage_keys(t: TensorTable) -> tuple[np.ndarray, int]:
    """Storage index of each tensor row (by storage id, else tensor id, else the row) and how many."""
    if not len(t):
        return np.zeros(0, np.int64), 0
    kind = np.where(t.storage_id >= 0, 0, np.where(t.tensor_id >= 0, 1, 2))
    val = np.where(kind == 0, t.storage_id, np.where(kind == 1, t.tensor_id, np.arange(len(t))))
    _, key = np.unique(np.stack([kind, val], axis=1), axis=0, return_inverse=True)
    key = key.reshape(-1).astype(np.int64)
    return key, int(key.max()) + 1


def device_tensor_mask(g: RankGraph) -> np.ndarray:
    """Tensor rows on the device: the GPU ones when the rank has any, else every row."""
    t = g.tensors
    ids = [int(d) for d in np.unique(t.device).tolist()
           if d >= 0 and g.strings[int(d)].lower().startswith(DEVICE_PREFIXES)]
    if ids:
        return np.isin(t.device, ids)
    return np.ones(len(t), bool)


def storage_lifetimes(g: RankGraph, order_key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per storage ``(size bytes, first position, last position, flags)``.

    Positions follow ``order_key`` (one sortable value per node; ties by row). Flags: bit 0 = the
    first use is a read (resident), bit 1 = the last use is a write. Unused storages have
    ``last == -1``.
    """
    t = g.tensors
    n = len(g)
    pos = np.empty(n, np.int64)
    pos[np.lexsort((np.arange(n), order_key))] = np.arange(n)
    in_node = np.repeat(np.arange(n), np.diff(g.in_ptr))
    out_node = np.repeat(np.arange(n), np.diff(g.out_ptr))
    use_t = np.concatenate([g.in_tensor, g.out_tensor]).astype(np.int64)
    use_node = np.concatenate([in_node, out_node])
    is_write = np.concatenate([np.zeros(len(in_node), bool), np.ones(len(out_node), bool)])
    key, nk = storage_keys(t)
    extent = (np.maximum(t.offset, 0) + np.maximum(t.numel, 0)) * np.maximum(t.elem_bytes, 0).astype(np.int64)
    size = np.zeros(nk, np.int64)
    np.maximum.at(size, key, extent)
    uk = key[use_t]
    up = pos[use_node]
    first = np.full(nk, n, np.int64)
    last = np.full(nk, -1, np.int64)
    np.minimum.at(first, uk, up)
    np.maximum.at(last, uk, up)
    # an in-place op on an input counts as a read at its first use: resident
    fr = np.zeros(nk, bool)
    lw = np.zeros(nk, bool)
    fr[uk[(up == first[uk]) & ~is_write]] = True
    lw[uk[(up == last[uk]) & is_write]] = True
    flags = fr.astype(np.int8) | (lw.astype(np.int8) << 1)
    return size, first, last, flags


@dataclass
class LiveBytes:
    """Live device bytes of one rank along a node order."""

    order: np.ndarray  # node rows in the order used
    live: np.ndarray  # live bytes while each node of ``order`` runs
    resident_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Highest live total."""
        return int(self.live.max()) if len(self.live) else 0

    @property
    def peak_row(self) -> int:
        """Node row at which the peak is first reached (-1 when empty)."""
        return int(self.order[int(np.argmax(self.live))]) if len(self.live) else -1

    @property
    def transient_peak_bytes(self) -> int:
        """Peak above the resident state."""
        return self.peak_bytes - self.resident_bytes


def has_tensors(g: RankGraph) -> bool:
    """Whether the graph records tensors used by nodes."""
    return bool(len(g.tensors) and (len(g.in_tensor) or len(g.out_tensor)))


def live_bytes(g: RankGraph, order_key: np.ndarray) -> LiveBytes | None:
    """The live-bytes curve of ``g`` with nodes ordered by ``order_key``; None without tensors."""
    if not has_tensors(g):
        return None
    n = len(g)
    size, first, last, flags = storage_lifetimes(g, order_key)
    key, _ = storage_keys(g.tensors)
    on = np.zeros(len(size), bool)
    on[key[device_tensor_mask(g)]] = True
    used = (last >= 0) & on
    resident = (flags & 1) == 1
    start_at = np.where(resident, 0, first)
    end_at = np.where(resident, n - 1, last)
    delta = np.zeros(n + 1, np.int64)
    np.add.at(delta, start_at[used], size[used])
    np.add.at(delta, end_at[used] + 1, -size[used])
    order = np.lexsort((np.arange(n), order_key))
    return LiveBytes(order, np.cumsum(delta[:n]), int(size[used & resident].sum()))
