"""Sequence alignment for the Kineto↔ET linker (:mod:`.link`): two name sequences aligned on
anchors unique on both sides (longest increasing chain), each segment between anchors by Myers'
exact diff when it differs by few edits, else by a greedy diff (:func:`align_sequences`)."""

from __future__ import annotations

import bisect
from collections import Counter


def _lis(js: list[int]) -> list[int]:
    """Indices of a longest strictly increasing subsequence of ``js`` (O(k log k))."""
    tails: list[int] = []
    tails_idx: list[int] = []
    prev = [-1] * len(js)
    for i, v in enumerate(js):
        k = bisect.bisect_left(tails, v)
        if k == len(tails):
            tails.append(v)
            tails_idx.append(i)
        else:
            tails[k] = v
            tails_idx[k] = i
        prev[i] = tails_idx[k - 1] if k > 0 else -1
    out = []
    i = tails_idx[-1] if tails_idx else -1
    while i >= 0:
        out.append(i)
        i = prev[i]
    return out[::-1]


def _positions(seq: list[int]) -> dict[int, list[int]]:
    pos: dict[int, list[int]] = {}
    for i, x in enumerate(seq):
        p = pos.get(x)
        if p is None:
            pos[x] = [i]
        else:
            p.append(i)
    return pos


def _greedy(
    a: list[int], b: list[int], a_lo: int, a_hi: int, b_lo: int, b_hi: int,
    pos_a: dict[int, list[int]], pos_b: dict[int, list[int]], reverse: bool, out: list[tuple[int, int]],
) -> None:
    """Greedy diff of ``a[a_lo:a_hi]`` and ``b[b_lo:b_hi]`` (walking backwards if ``reverse``)."""
    if reverse:
        i, j = a_hi - 1, b_hi - 1
        while i >= a_lo and j >= b_lo:
            x, y = a[i], b[j]
            if x == y:
                out.append((i, j))
                i -= 1
                j -= 1
                continue
            pb = pos_b.get(x)
            jb = -1
            if pb:
                k = bisect.bisect_right(pb, j) - 1
                if k >= 0 and pb[k] >= b_lo:
                    jb = pb[k]
            pa = pos_a.get(y)
            ia = -1
            if pa:
                k = bisect.bisect_right(pa, i) - 1
                if k >= 0 and pa[k] >= a_lo:
                    ia = pa[k]
            if jb < 0 and ia < 0:
                i -= 1
                j -= 1
            elif ia < 0 or (jb >= 0 and j - jb <= i - ia):
                if jb < 0:
                    i -= 1
                else:
                    j = jb
            else:
                i = ia
        return
    i, j = a_lo, b_lo
    while i < a_hi and j < b_hi:
        x, y = a[i], b[j]
        if x == y:
            out.append((i, j))
            i += 1
            j += 1
            continue
        pb = pos_b.get(x)
        jb = -1
        if pb:
            k = bisect.bisect_left(pb, j)
            if k < len(pb) and pb[k] < b_hi:
                jb = pb[k]
        pa = pos_a.get(y)
        ia = -1
        if pa:
            k = bisect.bisect_left(pa, i)
            if k < len(pa) and pa[k] < a_hi:
                ia = pa[k]
        if jb < 0 and ia < 0:
            i += 1
            j += 1
        elif ia < 0 or (jb >= 0 and jb - j <= ia - i):
            if jb < 0:
                i += 1
            else:
                j = jb
        else:
            i = ia


MYERS_MAX_EDITS = 256  # per segment; past it the greedy diff takes over (cost grows as edits²)


def _myers(
    a: list[int], b: list[int], a_lo: int, a_hi: int, b_lo: int, b_hi: int, max_d: int
) -> list[tuple[int, int]] | None:
    """Longest common subsequence of two slices by Myers' O((n+m)·D) diff; None past ``max_d`` edits."""
    A, B = a[a_lo:a_hi], b[b_lo:b_hi]
    n, m = len(A), len(B)
    if n == 0 or m == 0:
        return []
    if abs(n - m) > max_d:
        return None
    # lower bound on the edits from the name counts: skip hopeless segments cheaply
    ca = Counter(A)
    common = sum(min(c, ca.get(x, 0)) for x, c in Counter(B).items())
    if n + m - 2 * common > max_d:
        return None
    maxd = min(max_d, n + m)
    off = maxd + 1
    v = [0] * (2 * off + 1)
    trace: list[list[int]] = []
    found = -1
    for d in range(maxd + 1):
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]
            else:
                x = v[off + k - 1] + 1
            y = x - k
            while x < n and y < m and A[x] == B[y]:
                x += 1
                y += 1
            v[off + k] = x
            if x >= n and y >= m:
                found = d
                break
        trace.append(v[:])
        if found >= 0:
            break
    if found < 0:
        return None
    pairs: list[tuple[int, int]] = []
    x, y = n, m
    for d in range(found, 0, -1):
        pv = trace[d - 1]
        k = x - y
        down = k == -d or (k != d and pv[off + k - 1] < pv[off + k + 1])
        pk = k + 1 if down else k - 1
        px = pv[off + pk]
        py = px - pk
        mx, my = (px, py + 1) if down else (px + 1, py)
        while x > mx and y > my:
            x -= 1
            y -= 1
            pairs.append((a_lo + x, b_lo + y))
        x, y = px, py
    while x > 0 and y > 0:
        x -= 1
        y -= 1
        pairs.append((a_lo + x, b_lo + y))
    pairs.reverse()
    return pairs


def _segment(
    a: list[int], b: list[int], a_lo: int, a_hi: int, b_lo: int, b_hi: int,
    pos_a: dict[int, list[int]], pos_b: dict[int, list[int]], side: str, out: list[tuple[int, int]],
) -> None:
    """Align one segment: exact LCS when the slices differ by few edits, else the greedy diff.

    ``side`` is "mid" (between anchors), "head" (ends at an anchor: matches kept near its end)
    or "tail" (starts after an anchor).
    """
    if a_hi <= a_lo or b_hi <= b_lo:
        return
    # head/tail: try the LCS on a window of b next to the anchor only
    span = 2 * (a_hi - a_lo) + 64
    wb_lo, wb_hi = b_lo, b_hi
    if side == "head":
        wb_lo = max(b_lo, b_hi - span)
    elif side == "tail":
        wb_hi = min(b_hi, b_lo + span)
    pairs = _myers(a, b, a_lo, a_hi, wb_lo, wb_hi, MYERS_MAX_EDITS)
    if pairs is not None:
        out.extend(pairs)
        return
    if side == "head":
        head: list[tuple[int, int]] = []
        _greedy(a, b, a_lo, a_hi, b_lo, b_hi, pos_a, pos_b, True, head)
        out.extend(reversed(head))
    else:
        _greedy(a, b, a_lo, a_hi, b_lo, b_hi, pos_a, pos_b, False, out)


def align_sequences(
    a: list[int], b: list[int], a_seq: list[int] | None = None, b_seq: list[int] | None = None
) -> tuple[list[tuple[int, int]], int]:
    """Align two name sequences; returns matched ``(i, j)`` pairs (increasing) and the anchor count.

    ``a_seq``/``b_seq`` are autograd sequence numbers (-1 for none); ``(name, seq)`` keys unique on
    both sides become anchors (see the module docstring). Each segment between anchors is
    aligned exactly (longest common subsequence, Myers) when it differs by at most
    ``MYERS_MAX_EDITS`` edits, else by the greedy diff.
    """
    anchors: list[tuple[int, int]] = []
    if a_seq is not None and b_seq is not None:
        ka: dict[tuple[int, int], int] = {}
        for i, (x, s) in enumerate(zip(a, a_seq)):
            if s >= 0:
                key = (x, s)
                ka[key] = -1 if key in ka else i
        kb: dict[tuple[int, int], int] = {}
        for j, (y, s) in enumerate(zip(b, b_seq)):
            if s >= 0:
                key = (y, s)
                if key in ka:
                    kb[key] = -1 if key in kb else j
        cand = sorted((ka[k], j) for k, j in kb.items() if j >= 0 and ka[k] >= 0)
        if cand:
            keep = _lis([j for _, j in cand])
            anchors = [cand[k] for k in keep]
    pos_a = _positions(a)
    pos_b = _positions(b)
    out: list[tuple[int, int]] = []
    if not anchors:
        _segment(a, b, 0, len(a), 0, len(b), pos_a, pos_b, "mid", out)
        return out, 0
    i0, j0 = anchors[0]
    _segment(a, b, 0, i0, 0, j0, pos_a, pos_b, "head", out)
    for k, (i, j) in enumerate(anchors):
        out.append((i, j))
        if k + 1 < len(anchors):
            i1, j1 = anchors[k + 1]
            _segment(a, b, i + 1, i1, j + 1, j1, pos_a, pos_b, "mid", out)
    il, jl = anchors[-1]
    _segment(a, b, il + 1, len(a), jl + 1, len(b), pos_a, pos_b, "tail", out)
    return out, len(anchors)

