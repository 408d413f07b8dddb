"""The on-disk layout of a Chakra trace set: which file holds which rank (``<prefix>.<rank>.et``),
``comm_group.json`` (read, its keys chosen and written) and rank lists (``"0-3,8"``, the ranks
missing from a set).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import orjson

from ettools.errors import TraceError
from ettools.filenames import rank_from_name
from ettools.graph import ProcessGroup, Trace, TraceMeta
from ettools.io import load_json

COMM_GROUP_FILE = "comm_group.json"


_ET_SUFFIXES = (".et", ".et.gz")


def rank_of(path: Path) -> int | None:
    """Rank number in a file name (``trace.3.et``, ``rank3.et``), if any."""
    return rank_from_name(path)


def resolve_rank_files(paths: list[Path] | Path, suffixes: tuple[str, ...] = _ET_SUFFIXES) -> list[tuple[int, Path]]:
    """``(rank, file)`` pairs from files and/or directories of ``<prefix>.<rank><suffix>`` files.

    A single file whose name has no number is rank 0.
    """
    items = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    files: list[Path] = []
    for p in items:
        if p.is_dir():
            with os.scandir(p) as it:  # the entry types come with the listing: no stat per file
                names = sorted(e.name for e in it
                               if e.is_file() and not e.name.startswith(".") and e.name.endswith(suffixes))
            kids = [p / nm for nm in names]
            if not kids:
                raise TraceError(p, f"directory holds no {' or '.join(suffixes)} files")
            files.extend(kids)
        elif p.is_file():
            files.append(p)
        else:
            raise TraceError(p, "no such file or directory")
    if not files:
        raise TraceError(items[0] if items else ".", "no input files")
    out: list[tuple[int, Path]] = []
    seen: dict[int, Path] = {}
    for f in files:
        r = rank_of(f)
        if r is None:
            if len(files) > 1:
                raise TraceError(f, "cannot tell the rank from the file name (expected <prefix>.<rank>.et)")
            r = 0
        if r in seen:
            raise TraceError(f, f"rank {r} given twice (also {seen[r]})")
        seen[r] = f
        out.append((r, f))
    return sorted(out)


def read_comm_groups(path: Path, meta: TraceMeta) -> None:
    """Add the groups of a ``comm_group.json`` (``{"1": [0, 1], ...}``) to ``meta``."""
    obj = load_json(path)
    if not isinstance(obj, dict):
        raise TraceError(path, "expected an object mapping group ids to lists of ranks")
    for key in sorted(obj, key=natural_key):
        ranks = obj[key]
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0
                                                  for r in ranks):
            raise TraceError(path, f"group {key!r}: expected a list of non-negative integer ranks")
        try:
            meta.add_group(ProcessGroup(name=str(key), ranks=tuple(ranks)))
        except ValueError as e:
            raise TraceError(path, str(e)) from None
        if ranks:
            meta.world_size = max(meta.world_size, max(ranks) + 1)


def natural_key(s: str) -> tuple:
    """Sort key putting ``"2"`` before ``"10"`` (numbers by value, then text)."""
    parts = re.split(r"(\d+)", s)
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p != "")


def parse_rank_list(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def format_rank_list(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    rs = sorted(set(int(r) for r in ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def missing_ranks(trace: Trace) -> list[int]:
    """Ranks of the job whose file is absent: ranks ``0 .. world-1`` (world from the file names and
    ``comm_group.json``), or the ranks a partial write says it wrote, minus the ranks read."""
    declared: set[int] = set()
    for g in trace.graphs.values():
        if g.meta.get("ranks_written"):
            declared.update(parse_rank_list(g.meta["ranks_written"]))
    want = declared or set(range(trace.meta.world_size))
    return sorted(want - set(trace.graphs))


def group_keys(meta: TraceMeta, strict: bool) -> dict[str, str]:
    """Process-group name -> the key written as ``pg_name`` and in ``comm_group.json``.

    Strict: decimal keys of one width (``"1"`` … ``"9"``; ``"10"`` … ``"99"`` for 10 to 90
    groups; ``"100"`` … for more), in natural order of the names: every rank's ``pg_name`` bytes
    then have the same length, so ranks that differ only in their groups share one encoding with
    the keys patched in. Keys are ``> 0`` (ASTRA-sim reads them as group ids). Faithful: the
    names themselves.
    """
    names = sorted(meta.process_groups, key=natural_key)
    if strict:
        width = 1
        while 9 * 10 ** (width - 1) < len(names):
            width += 1
        base = 10 ** (width - 1)
        return {nm: str(base + i) for i, nm in enumerate(names)}
    return {nm: nm for nm in names}


def comm_group_json(meta: TraceMeta, keys: dict[str, str]) -> bytes:
    """``comm_group.json`` bytes: ``{key: [global ranks]}`` in key order."""
    obj = {keys[nm]: list(meta.process_groups[nm].ranks) for nm in keys}
    return orjson.dumps(obj) + b"\n"
