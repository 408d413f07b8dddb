"""What a Kineto file says about the whole trace: the rank it holds, the world size, the process
groups and the device properties (``distributedInfo``, ``deviceProperties``, the file's name).

Used by :func:`ettools.converters.kineto.read_kineto` once per file, then once after every file
(groups meaning "every rank" get the final world size).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ettools.errors import TraceError
from ettools.graph import MAX_WORLD_SIZE, ProcessGroup, TraceMeta
from ettools.io import short


def _rank_from_name(path: Path, several: bool = True) -> int | None:
    """The rank a file name states: ``rank3``/``rank-3``/``rank_3``; else, among several files, the
    last number of the name (``trace_3.json``). A lone file's other numbers are not ranks
    (``h100.json.gz``, ``bs_32.json``)."""
    m = re.search(r"rank[-_]?(\d+)", path.name, re.IGNORECASE)
    if m:
        return int(m.group(1))
    if not several:
        return None
    nums = re.findall(r"\d+", path.name.split(".")[0])
    return int(nums[-1]) if nums else None


def _rank_of(path: Path, data: dict[str, Any], several: bool = True) -> int:
    """``distributedInfo.rank``, else the rank the file name states, else 0."""
    info = data.get("distributedInfo")
    if isinstance(info, dict) and "rank" in info:
        r, ws = info["rank"], info.get("world_size")
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < MAX_WORLD_SIZE:
            raise TraceError(path, f"distributedInfo.rank is {short(r)}: expected an integer in "
                             f"0..{MAX_WORLD_SIZE - 1}")
        if isinstance(ws, int) and not isinstance(ws, bool) and r >= ws:
            raise TraceError(path, f"distributedInfo.rank {r} is not below distributedInfo.world_size {ws}")
        return r
    r = _rank_from_name(path, several)
    return r if r is not None else 0


def _merge_meta(meta: TraceMeta, data: dict[str, Any], path: Path, empty_pg: list[str]) -> None:
    """World size, process groups and device properties of one file into ``meta``."""
    info = data.get("distributedInfo")
    if isinstance(info, dict):
        ws = info.get("world_size")
        if ws is not None and (not isinstance(ws, int) or isinstance(ws, bool) or not 1 <= ws <= MAX_WORLD_SIZE):
            raise TraceError(path, f"distributedInfo.world_size is {short(ws)}: expected an integer in "
                             f"1..{MAX_WORLD_SIZE}")
        if isinstance(ws, int) and ws > meta.world_size:
            meta.world_size = ws
        backend = info.get("backend")
        if isinstance(backend, str):
            meta.extra.setdefault("backend", backend)
        if isinstance(info.get("nccl_version"), str):
            meta.extra.setdefault("nccl_version", info["nccl_version"])
        pgs = info.get("pg_config") or []
        if not isinstance(pgs, list):
            raise TraceError(path, f"distributedInfo.pg_config is {type(pgs).__name__}, expected a list")
        for pg in pgs:
            if not isinstance(pg, dict) or "pg_name" not in pg:
                continue
            name = str(pg["pg_name"])
            ranks = pg.get("ranks")
            if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
                continue
            if not ranks:
                empty_pg.append(name)
                size = pg.get("pg_size") if isinstance(pg.get("pg_size"), int) else meta.world_size
                ranks = list(range(max(size, meta.world_size)))
            group = ProcessGroup(name, tuple(ranks), str(pg.get("pg_desc", "")), str(pg.get("backend_config", "")))
            try:
                if name in empty_pg:
                    meta.process_groups[name] = group
                else:
                    meta.add_group(group)
            except ValueError as e:
                raise TraceError(path, str(e)) from None
    props = data.get("deviceProperties")
    if isinstance(props, list) and props and not meta.device_properties:
        meta.device_properties = [p for p in props if isinstance(p, dict)]


def _fix_all_rank_groups(meta: TraceMeta, empty_pg: list[str]) -> None:
    """Groups meaning "every rank" get the final world size (known only after every file)."""
    world = tuple(range(meta.world_size))
    names = set(empty_pg)
    implicit = meta.extra.get("implicit_world_group")
    if implicit:
        names.add(implicit)
    for name in names:
        g = meta.process_groups.get(name)
        if g is not None and g.ranks != world:
            meta.process_groups[name] = ProcessGroup(name, world, g.desc, g.backend)
