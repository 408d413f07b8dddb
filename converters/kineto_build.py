"""One Kineto file's events → one :class:`~ettools.graph.RankGraph`.

Selects the events of the chosen steps, joins device ops to the runtime calls that launched them
(LAUNCH edges; stand-in launches for ops launched outside the trace), orders the kept events into
node rows (:class:`~ettools.converters.kineto_rank._Rank`), has the edge, collective, sync and
attribute builders fill them, gathers the rank's meta and assembles the graph (CSR dependencies).
"""

from __future__ import annotations

import logging
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from ettools.converters import kineto_comm as kc
from ettools.converters import kineto_sync as ks
from ettools.converters.kineto_attrs import _attributes
from ettools.converters.kineto_edges import _device_order, _fwdbwd, _gloo_rows, _nesting
from ettools.converters.kineto_events import (
    ABSENT,
    CATEGORY_CLASS,
    IS_DEVICE,
    IS_HOST,
    RANGE_CATEGORIES,
    RUNTIME,
    SYNC_EV,
    Events,
    annotation_steps,
    choose_steps,
    distinct,
    extract,
    find_steps,
    int_column,
    start_order,
    unseen_launches,
)
from ettools.converters.kineto_rank import _Rank
from ettools.graph import EdgeKind, RankGraph, StringTable
from ettools.json_chunks import ItemChunks

log = logging.getLogger("ettools.converters.kineto")  # the reader's logger, as before the split

_ABSENT = ABSENT  # sentinel for a missing integer arg
_int_column = int_column


def _build_rank(
    path: Path, ev: list[Any] | ItemChunks, rank: int, wanted: set[int] | None, strings: StringTable, groups: kc.GroupRegistry
) -> tuple[RankGraph, float]:
    """One file's events → (graph with times relative to ``base``, ``base``)."""
    e = extract(path, ev)
    cls, ts, dur = e.cls, e.ts, e.dur
    host = IS_HOST[cls]
    device = IS_DEVICE[cls]
    # correlation ids: runtime calls and device ops (their join is the launch edge)
    rt = np.flatnonzero(cls == RUNTIME)
    dv = np.flatnonzero(device)
    rt_corr = e.int_arg("correlation", rt)
    dv_corr = e.int_arg("correlation", dv)
    launcher_ev = _join(dv_corr, rt_corr, rt)
    steps = find_steps(e)
    inferred = not steps
    if inferred:  # no ProfilerStep: execute spans marked by annotations (serving traces)
        steps = annotation_steps(e, distinct(launcher_ev[launcher_ev >= 0]))
    chosen = choose_steps(path, steps, wanted)
    if chosen and (wanted is not None or not inferred):  # annotation steps alone select nothing
        s0 = min(s.start for s in chosen)
        s1 = max(s.end for s in chosen)
        in_span = (ts >= s0) & (ts < s1)
    else:
        in_span = np.ones(e.n, bool)
    sy = np.flatnonzero(cls == SYNC_EV)
    keep = host & in_span
    has_l = launcher_ev >= 0
    keep[dv] = np.where(has_l, keep[np.maximum(launcher_ev, 0)], in_span[dv])
    # device ops without a launch in the trace that started on an idle stream: a stand-in launch
    unseen = unseen_launches(e, dv, keep[dv] & ~has_l)
    if unseen is not None:
        e, new_rows, launched = unseen
        cls, ts, dur = e.cls, e.ts, e.dur
        m = len(new_rows)
        keep = np.concatenate((keep, np.ones(m, bool)))
        host = np.concatenate((host, np.ones(m, bool)))
        device = np.concatenate((device, np.zeros(m, bool)))
        launcher_ev = launcher_ev.copy()
        launcher_ev[launched] = new_rows
        has_l = launcher_ev >= 0
        rt = np.concatenate((rt, new_rows))
        rt_corr = np.concatenate((rt_corr, np.full(m, _ABSENT, np.int64)))
    sel = np.flatnonzero(keep)
    order = sel[start_order(ts[sel], dur[sel])]
    base = float(ts[order].min()) if len(order) else 0.0
    r = _Rank(e, order, strings, base)
    r.rank = rank
    row_of = np.full(e.n, -1, np.int64)
    row_of[order] = np.arange(r.n)
    # launch edges: device op -> runtime call
    dv_rows = row_of[dv]
    ok = (dv_rows >= 0) & has_l
    r.launcher[dv_rows[ok]] = row_of[launcher_ev[ok]]
    r.corr = np.full(r.n, _ABSENT, np.int64)
    r.corr[row_of[rt][row_of[rt] >= 0]] = rt_corr[row_of[rt] >= 0]
    r.corr[dv_rows[dv_rows >= 0]] = dv_corr[dv_rows >= 0]
    lrows = np.flatnonzero(r.launcher >= 0)
    r.add_edges(lrows, r.launcher[lrows], EdgeKind.LAUNCH)

    gloo_p2p = _gloo_rows(r)
    _nesting(r, gloo_p2p)
    _device_order(r)
    kc.build_collectives(r, groups, gloo_p2p)
    # cuda_sync events kept with their runtime call
    sync_args = e.pick("args", sy)
    ks.sync_edges(r, sync_args)
    ks.launch_facts(r)
    r.meta["sync_guessed"] += r.meta.get("gloo_waits_guessed", 0)
    _attributes(r)
    _fwdbwd(r, e, base)
    _rank_meta(r, e, chosen, base, path, int((~keep & (host | device)).sum()), len(sy))
    g = _assemble(r, rank)
    return g, base


def _join(keys: np.ndarray, ref_keys: np.ndarray, ref_vals: np.ndarray) -> np.ndarray:
    """``ref_vals`` at the position where ``ref_keys == keys`` (-1 where absent)."""
    out = np.full(len(keys), -1, np.int64)
    if len(ref_keys) == 0 or len(keys) == 0:
        return out
    o = np.argsort(ref_keys, kind="stable")
    sk = ref_keys[o]
    pos = np.minimum(np.searchsorted(sk, keys), len(sk) - 1)
    hit = (sk[pos] == keys) & (keys != _ABSENT)
    out[hit] = ref_vals[o[pos[hit]]]
    return out


def _rank_meta(
    r: _Rank, e: Events, chosen: list[Any], base: float, path: Path, outside: int, n_sync: int
) -> None:
    m = r.meta
    m["source_file"] = str(path)
    m["steps"] = [(s.name, s.start - base, s.end - base) for s in chosen]
    m["step_times_us"] = [s.end - s.start for s in chosen]
    m["span_us"] = (float(r.start.min()), float(r.end.max())) if r.n else (0.0, 0.0)
    skipped = dict(e.skipped)
    m["skipped"] = skipped
    unknown = {k: v for k, v in skipped.items() if k.lower() not in CATEGORY_CLASS}
    if unknown:
        log.warning("%s: skipped events of unknown categories: %s", path,
                    ", ".join(f"{k} ({v})" for k, v in sorted(unknown.items())))
    ranges = {k: v for k, v in skipped.items() if k.lower() in RANGE_CATEGORIES}
    if ranges:
        log.warning("%s: skipped range-profiler events (hardware counters; their times are an even split of "
                    "the profiling span, not measured): %s", path,
                    ", ".join(f"{k} ({v})" for k, v in sorted(ranges.items())))
    m["outside_steps"] = outside
    m["sync_events"] = n_sync
    m["negative_durations"] = e.negative_dur
    m["devices"] = r.devices
    m["host_timeline"] = True  # measured host threads: replay slices them (idle gaps are host time)
    if e.memory_events:
        mem = e.memory  # memory_rows: (ts, allocated, reserved, bytes, device id, device type)
        if chosen:
            s0 = min(s.start for s in chosen)
            s1 = max(s.end for s in chosen)
            mem = [x for x in mem if s0 <= x[0] < s1]
        mem = sorted(mem, key=itemgetter(0))
        m["memory"] = {
            "ts": np.array([x[0] for x in mem], np.float64) - base,
            "total_allocated": _int_column([x[1] for x in mem]),
            "total_reserved": _int_column([x[2] for x in mem]),
            "bytes": _int_column([x[3] for x in mem]),
            "device_id": _int_column([x[4] for x in mem]),
            "device_type": _int_column([x[5] for x in mem]),
        }


def _assemble(r: _Rank, rank: int) -> RankGraph:
    """Columns, CSR dependencies and attributes → RankGraph (node id = row)."""
    n = r.n
    if r.edges:
        dst = np.concatenate([d for d, _, _ in r.edges])
        src = np.concatenate([s for _, s, _ in r.edges])
        kind = np.concatenate([np.full(len(d), k, np.uint8) for d, _, k in r.edges])
    else:
        dst = src = np.zeros(0, np.int64)
        kind = np.zeros(0, np.uint8)
    o = np.argsort(dst, kind="stable")
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=dep_ptr[1:])
    columns = {
        "id": np.arange(n, dtype=np.uint64),
        "name": r.name_id,
        "type": r.type,
        "start": r.start,
        "dur": r.dur,
        "resource": r.res,
        "is_cpu_op": r.is_host.astype(np.int8),
        "tensor_size": r.tensor_size,
        "comm_type": r.comm_type,
        "comm_bytes": r.comm_bytes,
        "comm_group": r.comm_group,
        "comm_peer": r.comm_peer,
        "comm_tag": r.comm_tag,
    }
    return RankGraph(rank, r.strings, columns, dep_ptr, src[o].astype(np.uint64), kind[o], r.attrs, meta=r.meta)
