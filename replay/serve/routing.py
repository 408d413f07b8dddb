"""Which engine serves each request: the router in front of a pool of model replicas.

* ``round-robin``: request ``i`` (in arrival order) to engine ``i mod n``;
* ``least-work``: each request to the engine with the least backlog when it arrives (among idle
  engines the one idle longest): a fluid
  estimate of each engine's queued work, in µs, that grows by the request's estimated work and
  drains at one µs per µs (the engine is busy while it has work). A request's work is its prefill
  (the step cost of its prompt tokens as one chunk) plus its decode share (its output tokens times
  the per-sequence time of a decode iteration at the engine's typical batch, ``decode_batch``);
  it balances heavy-tailed lengths that round-robin leaves uneven;
* ``prefix``: the requests of one prefix group to one engine (group id mod n, as a cache-aware
  router keeps a prefix's KV cache on one replica), requests without a group by least work.

The estimate only routes: each engine is then simulated exactly (:mod:`.engine`).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

ROUTINGS = ("round-robin", "least-work", "prefix")


def request_work_us(cost: Any, prompt: np.ndarray, output: np.ndarray, decode_batch: int = 32) -> np.ndarray:
    """Estimated engine time of each request (see the module docstring)."""
    per_seq = cost.iteration_us(decode_batch, decode_batch, 0.0, 0.0, decode_batch) / decode_batch
    uniq, inv = np.unique(np.asarray(prompt, np.int64), return_inverse=True)
    pre = np.array([cost.iteration_us(int(p), 1, 0.0, p * p / 2.0, 1) for p in uniq.tolist()])[inv] \
        if len(uniq) <= 4096 else _prefill_interp(cost, prompt)
    return pre + np.asarray(output, np.float64) * per_seq


def _prefill_interp(cost: Any, prompt: np.ndarray) -> np.ndarray:
    """Prefill estimates at geometric prompt lengths, interpolated (many distinct prompts)."""
    p = np.asarray(prompt, np.float64)
    grid = np.unique(np.geomspace(1, max(float(p.max()), 2.0), 64).round())
    y = np.array([cost.iteration_us(int(g), 1, 0.0, g * g / 2.0, 1) for g in grid])
    return np.interp(p, grid, y)


def route(arrival_us: np.ndarray, prompt: np.ndarray, output: np.ndarray, n_engines: int, policy: str,
          cost: Any = None, group: np.ndarray | None = None) -> np.ndarray:
    """The engine (0 .. ``n_engines`` − 1) of each request, in the order given (arrival order)."""
    if policy not in ROUTINGS:
        raise ValueError(f"unknown routing {policy!r} ({', '.join(ROUTINGS)})")
    n = len(arrival_us)
    if policy == "round-robin" or n_engines == 1 or n == 0:
        return np.arange(n) % max(n_engines, 1)
    work = request_work_us(cost, prompt, output).tolist()
    arr = np.asarray(arrival_us, np.float64).tolist()
    pinned = np.asarray(group).tolist() if (policy == "prefix" and group is not None) else None
    out = np.empty(n, np.int64)
    # an engine's backlog at time t is max(free_at − t, 0): the least backlog is the least free_at,
    # kept in a heap (stale entries, superseded by a pinned request's update, are skipped)
    free_at = [0.0] * n_engines
    heap = [(0.0, k) for k in range(n_engines)]
    for i in range(n):
        t = arr[i]
        if pinned is not None and pinned[i] >= 0:
            k = int(pinned[i]) % n_engines
        else:
            while True:
                f, k = heap[0]
                if f == free_at[k]:
                    break
                heapq.heappop(heap)
            heapq.heappop(heap)
        out[i] = k
        free_at[k] = max(free_at[k], t) + work[i]
        heapq.heappush(heap, (free_at[k], k))
    return out
