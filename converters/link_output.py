"""The linked rank graph (:mod:`.link`): the ET graph timed by the Kineto ops it matched, plus
the attached device ops with their ``LAUNCH`` and stream ``ORDER`` edges and Kineto attributes,
and the collective moved onto the op that carries the transfer (the ET comm node demoted)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ettools.converters.link_columns import _full_int, _parents
from ettools.graph import COMM_NODE_TYPES, AttrColumn, EdgeKind, NodeType, RankGraph, StringTable

NCCL_PREFIXES = ("ncclKernel", "ncclDevKernel")


def _build_output(
    et: RankGraph, k: RankGraph, strings: StringTable, kmap: np.ndarray, matched: np.ndarray,
    dev: np.ndarray, dev_et_row: np.ndarray, dev_launch: np.ndarray, k_launcher: np.ndarray,
) -> RankGraph:
    """ET graph with Kineto times, plus the attached device ops."""
    n_e, n_d = len(et), len(dev)
    km = np.flatnonzero(matched >= 0)
    start = et.start.copy()
    dur = et.dur.copy()
    start[matched[km]] = k.start[km]
    dur[matched[km]] = k.dur[km]

    order = np.lexsort((dev, k.start[dev]))
    dev, dev_et_row, dev_launch = dev[order], dev_et_row[order], dev_launch[order]
    first_id = int(et.id.max()) + 1 if n_e else 0
    dev_ids = np.arange(first_id, first_id + n_d, dtype=np.uint64)

    def kstr(col: str) -> np.ndarray:
        v = k.columns[col][dev]
        if not len(kmap):
            return np.full(len(v), -1, np.int32)
        return np.where(v >= 0, kmap[np.maximum(v, 0)], -1)

    cols: dict[str, np.ndarray] = {}
    for c in et.columns:
        if c in ("name", "resource", "comm_group"):
            dv = kstr(c)
        else:
            dv = k.columns[c][dev]
        cols[c] = np.concatenate([et.columns[c], dv.astype(et.columns[c].dtype)])
    cols["id"][n_e:] = dev_ids
    cols["start"][:n_e] = start
    cols["dur"][:n_e] = dur
    cols["is_cpu_op"][n_e:] = 0

    # communication: the op that carries the transfer in Kineto (an NCCL kernel, a gloo span matched
    # to an ET op) becomes the comm node; the ET host comm node above it is demoted
    comm_cols = ("comm_type", "comm_bytes", "comm_group", "comm_peer", "comm_tag")
    comm_types = [int(t) for t in COMM_NODE_TYPES]
    dtype = cols["type"]
    is_nccl = np.fromiter((strings[int(x)].startswith(NCCL_PREFIXES) for x in cols["name"][n_e:]), bool, n_d)
    dev_comm = np.isin(dtype[n_e:], comm_types) | is_nccl
    et_parent = _parents(et, EdgeKind.NEST)
    carriers: list[tuple[int, int, bool]] = [(n_e + d, int(dev_et_row[d]), True) for d in np.flatnonzero(dev_comm)]
    host_k_comm = km[np.isin(k.type[km], comm_types)]
    for kr in host_k_comm.tolist():
        er = int(matched[kr])
        if int(et.type[er]) in comm_types:
            continue  # the ET already calls this op the collective
        dtype[er] = k.type[kr]
        for c in comm_cols:
            v = k.columns[c][kr]
            cols[c][er] = (kmap[v] if v >= 0 else -1) if c == "comm_group" else v
        # the op that issued it: Kineto's LAUNCH edge (gloo span -> c10d op) beats the ET parent,
        # which ET gets wrong around gloo collectives
        lk = int(k_launcher[kr])
        issuer = int(matched[lk]) if lk >= 0 and matched[lk] >= 0 else int(et_parent[er])
        carriers.append((er, issuer, False))
    host_comm_attrs: dict[str, tuple[list[int], list[Any]]] = {
        "host_comm_type": ([], []), "host_comm_bytes": ([], []), "host_comm_group": ([], [])}
    demoted: set[int] = set()
    for row, r, device in carriers:
        while r >= 0 and int(et.type[r]) not in comm_types:
            r = int(et_parent[r])
        if r < 0:
            continue  # no ET collective above it: keeps what Kineto says (or stays compute)
        if dtype[row] not in comm_types:
            dtype[row] = et.type[r]
        for c in comm_cols:
            if cols[c][row] < 0 or (not device and et.columns[c][r] >= 0):
                cols[c][row] = et.columns[c][r]  # ET facts win on host carriers, fill gaps on kernels
        if r not in demoted:
            demoted.add(r)
            host_comm_attrs["host_comm_type"][0].append(r)
            host_comm_attrs["host_comm_type"][1].append(int(et.comm_type[r]))
            host_comm_attrs["host_comm_bytes"][0].append(r)
            host_comm_attrs["host_comm_bytes"][1].append(int(et.comm_bytes[r]))
            host_comm_attrs["host_comm_group"][0].append(r)
            host_comm_attrs["host_comm_group"][1].append(et.group_name(r))
    for r in demoted:
        dtype[r] = int(NodeType.COMP_NODE)
        for c in comm_cols:
            cols[c][r] = -1

    # edges: the ET's, then LAUNCH and stream ORDER for device ops
    e_cnt = np.diff(et.dep_ptr)
    launch_ids = et.id[dev_et_row].astype(np.uint64)
    res = cols["resource"][n_e:]
    prev = np.full(n_d, -1, np.int64)
    last: dict[int, int] = {}
    for d, rr in enumerate(res.tolist()):
        p = last.get(rr)
        if p is not None:
            prev[d] = p
        last[rr] = d
    d_cnt = 1 + (prev >= 0)
    dep_ptr = np.zeros(n_e + n_d + 1, np.int64)
    np.cumsum(np.concatenate([e_cnt, d_cnt]), out=dep_ptr[1:])
    dep_id = np.empty(int(dep_ptr[-1]), np.uint64)
    dep_kind = np.empty(int(dep_ptr[-1]), np.uint8)
    ne = len(et.dep_id)
    dep_id[:ne] = et.dep_id
    dep_kind[:ne] = et.dep_kind
    starts = dep_ptr[n_e:-1]
    dep_id[starts] = launch_ids
    dep_kind[starts] = int(EdgeKind.LAUNCH)
    has_prev = prev >= 0
    dep_id[starts[has_prev] + 1] = dev_ids[prev[has_prev]]
    dep_kind[starts[has_prev] + 1] = int(EdgeKind.ORDER)

    # attributes: the ET's, the Kineto ones of device ops, launch facts, and on each matched
    # ET op the External id of its Kineto op (to find the event again)
    attrs = dict(et.attrs)
    ext = k.attrs.get("ext_id")
    if ext is not None and len(km):
        ext_full = _full_int(k, "ext_id", -1)[km]
        has = ext_full >= 0
        rows = matched[km][has]
        o = np.argsort(rows, kind="stable")
        attrs["kineto_ext_id"] = AttrColumn("int64_val", rows[o], ext_full[has][o].tolist())
    for name, (rows, vals) in host_comm_attrs.items():
        if rows:
            o = np.argsort(rows)
            kind = "string_val" if name == "host_comm_group" else "int64_val"
            attrs[name] = AttrColumn(kind, np.asarray(rows, np.int64)[o], [vals[i] for i in o])
    pos_in_dev = np.full(len(k), -1, np.int64)
    pos_in_dev[dev] = np.arange(n_d)
    for name, col in k.attrs.items():
        if not len(col.rows):
            continue
        m = pos_in_dev[col.rows] >= 0
        if not m.any():
            continue
        new_rows = n_e + pos_in_dev[col.rows[m]]
        vals = [v for v, keep in zip(col.values, m.tolist()) if keep]
        o = np.argsort(new_rows, kind="stable")
        key = name if name not in attrs else f"kineto_{name}"
        attrs[key] = AttrColumn(col.kind, new_rows[o], [vals[i] for i in o.tolist()])
    if n_d:
        lr = np.arange(n_e, n_e + n_d, dtype=np.int64)
        has_l = dev_launch >= 0
        offs = np.where(has_l, k.start[np.maximum(dev_launch, 0)] - start[dev_et_row], math.nan)
        attrs["launch_offset_us"] = AttrColumn("double_val", lr[has_l], offs[has_l].tolist())
        attrs["launch_api"] = AttrColumn(
            "string_val", lr[has_l], [k.strings[int(x)] for x in k.name[dev_launch[has_l]].tolist()])

    n_t = n_e + n_d
    in_ptr = np.concatenate([et.in_ptr, np.full(n_d, et.in_ptr[-1], np.int64)])
    out_ptr = np.concatenate([et.out_ptr, np.full(n_d, et.out_ptr[-1], np.int64)])
    assert len(in_ptr) == n_t + 1
    return RankGraph(
        et.rank, strings, cols, dep_ptr, dep_id, dep_kind, attrs, et.tensors,
        in_ptr, et.in_tensor, out_ptr, et.out_tensor, dict(et.meta),
    )

