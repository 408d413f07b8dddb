"""DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, §3.2.1 and Table 2): a bidirectional
pipeline whose forward and backward chunks of two micro-batches are overlapped.

The model is cut into ``pp`` stages and kept **twice**: the forward-direction copy (chunk 0) runs
stage ``r`` on rank ``r``, the reverse-direction copy (chunk 1) stage ``pp − 1 − r``. Half the
micro-batches (``0 … m/2 − 1``, chunk 0) enter at rank 0 and flow towards rank ``pp − 1``; the other
half (``m/2 … m − 1``, chunk 1) enter at rank ``pp − 1`` and flow back. Ranks ``r`` and
``pp − 1 − r`` hold the same two stages (each the other's copy), so after the last backward the two
copies' gradients are all-reduced over that pair (the *mirror* group, axis ``mesh.MIRROR``) before
the optimizer step, which keeps the copies equal. A tied embedding needs no collective of its own:
ranks 0 and ``pp − 1`` each hold the embedding of one copy and the LM head of the other, and the
mirror reduction sums the copies over exactly those two ranks.

Units are ``(kind, micro_batch, chunk)`` as in :mod:`.schedule`, with kinds

* ``F``: a forward; ``B``: a full backward (input and weight gradients);
* ``I`` and ``W``: a backward split as zero-bubble pipelining splits it (input gradients now, weight
  gradients later; the weight halves run first in, first out, as DualPipe's ``WeightGradStore``);
* ``OF`` immediately followed by ``OB``: a forward and a full backward of two micro-batches (of
  the two chunks) overlapped — both start once the previous unit has ended, the next unit starts
  once both have ended; their compute and communication interleave (the paper's ``F&B`` chunk).

Each rank's order is the reference implementation's (github.com/deepseek-ai/DualPipe), described
per rank from its *near* chunk (the direction whose input enters at this rank's end of the
pipeline: chunk 0 on the first half of the ranks, chunk 1 on the second) and its *far* chunk, with
``H = pp/2`` and ``h = min(r, pp − 1 − r)`` (the rank's distance from its end):

1. ``2(H − h − 1)`` forwards of the near chunk (warm-up);
2. ``h + 1`` times a near forward and a far forward;
3. ``H − h − 1`` times a far split backward, its weight half, a far forward;
4. ``m/2 − pp + h + 1`` times two overlapped pairs: near forward with far backward, far forward
   with near backward (on the two middle ranks the very first pair is not overlapped, as in the
   reference, which lets the turn-around micro-batch go on at once);
5. ``H − h − 1`` times a far backward and a pair (far forward, near backward);
6. ``h + 1`` times a far and a near backward, the last ``h + 1`` of them split;
7. ``H − h − 1`` times a weight half and a near split backward;
8. the ``h + 1`` weight halves left.

The reference asserts ``pp`` even and ``m`` even with ``m ≥ 2·pp``: step 4 runs
``m/2 − pp + h + 1`` times, which must be at least once on the end ranks (``h = 0``) for the
order to hold (:func:`check_dualpipe`).
"""

from __future__ import annotations

import numpy as np

from ettools.graph import CollectiveType, NodeType, StringTable

from .compiled import Compiled
from .plan import check_dualpipe

Unit = tuple[str, int, int]


def chunk_stage(pp: int, rank: int, chunk: int) -> int:
    """The model stage that ``chunk`` of ``rank`` holds (chunk 0: forward direction, 1: reverse)."""
    return rank if chunk == 0 else pp - 1 - rank


def dualpipe_units(pp: int, rank: int, micro_batches: int) -> list[Unit]:
    """DualPipe's ordered units on ``rank`` (see the module docstring)."""
    check_dualpipe(pp, micro_batches)
    half_m, H = micro_batches // 2, pp // 2
    h = min(rank, pp - 1 - rank)
    near, far = (0, 1) if rank < H else (1, 0)
    nxt_f = {0: 0, 1: half_m}  # next micro-batch each chunk forwards (chunk 1's are m/2 …)
    nxt_b = dict(nxt_f)  # … and backwards, in the same order (first in, first out)
    pending_w: list[tuple[int, int]] = []  # split backwards whose weight half is still to run
    out: list[Unit] = []

    def fwd(c: int, kind: str = "F") -> None:
        out.append((kind, nxt_f[c], c))
        nxt_f[c] += 1

    def bwd(c: int, kind: str = "B") -> None:
        out.append((kind, nxt_b[c], c))
        if kind == "I":
            pending_w.append((nxt_b[c], c))
        nxt_b[c] += 1

    def weight() -> None:
        mb, c = pending_w.pop(0)
        out.append(("W", mb, c))

    def pair(cf: int, cb: int) -> None:
        fwd(cf, "OF")
        bwd(cb, "OB")

    for _ in range(2 * (H - h - 1)):  # 1: warm-up of the near direction
        fwd(near)
    for _ in range(h + 1):  # 2
        fwd(near)
        fwd(far)
    for _ in range(H - h - 1):  # 3: the far backward split, its weights at once
        bwd(far, "I")
        weight()
        fwd(far)
    for i in range(half_m - pp + h + 1):  # 4: the steady state, two overlapped pairs
        if i == 0 and h == H - 1:
            # the middle ranks turn the first micro-batch around without overlapping it
            fwd(near)
            bwd(far)
        else:
            pair(near, far)
        pair(far, near)
    for _ in range(H - h - 1):  # 5
        bwd(far)
        pair(far, near)
    n6 = 2 * (h + 1)  # 6: the last h + 1 of these backwards leave their weights for later
    for j in range(n6):
        bwd(far if j % 2 == 0 else near, "I" if j >= n6 - (h + 1) else "B")
    for _ in range(H - h - 1):  # 7
        weight()
        bwd(near, "I")
    while pending_w:  # 8
        weight()
    return out


def mirror_reduction(strings: StringTable, nbytes: int, slot: int) -> Compiled:
    """The one-node program all-reducing a rank's gradients (both chunks, ``nbytes``) with its mirror
    rank's, which holds the other copy of the same two stages."""
    cols = {"type": np.array([int(NodeType.COMM_COLL_NODE)], np.uint8),
            "name": np.array([strings.intern("all_reduce dualpipe.mirror_grads")], np.int32),
            "num_ops": np.array([-1], np.int64), "tensor_size": np.array([-1], np.int64),
            "comm_type": np.array([int(CollectiveType.ALL_REDUCE)], np.int8),
            "comm_bytes": np.array([nbytes], np.int64), "slot": np.array([slot], np.int32),
            "dur": np.array([np.nan]), "shape_kind": np.zeros(1, np.int8), "shape": np.full((1, 4), -1, np.int64)}
    z = np.zeros(0, np.int64)
    return Compiled("dualpipe.mirror_grads", 1, cols, z, z, {}, {})
