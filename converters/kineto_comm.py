"""Collectives in Kineto traces: NCCL kernels and gloo transfers become communication nodes.

Used by :mod:`ettools.converters.kineto`; see its docstring for the graph built. This module knows:

* the element size of every dtype spelling Kineto uses (``Float``/``float``/``c10::BFloat16``...);
* collective names in all their spellings (``allreduce``, ``_allgather_base``, ``c10d::alltoall_base_``,
  ``gloo:reduce_scatter``, ``nccl:all_reduce``, ``ncclDevKernel_AllGather_RING_LL``) → Chakra types;
* where an NCCL kernel's metadata lives (its own args on recent PyTorch, else the
  ``record_param_comms`` op or ``nccl:<op>`` annotation around its launch) and how gloo's
  ``c10d::<op>`` caller ops pair with the ``gloo:<op>`` spans that time the transfer.

Bytes follow Chakra's ``comm_size`` semantics: NCCL ``In msg nelems`` × dtype size (the per-rank
input buffer: full buffer for all-reduce, full input for reduce-scatter, per-rank input for
all-gather, per-rank total for all-to-all); gloo spans carry that same input in ``Input Dims``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ettools.converters.kineto_columns import ANNOT, CPU_OP, KERNEL, unique
from ettools.graph import CollectiveType, NodeType, ProcessGroup, TraceMeta

# Element sizes for every spelling seen in Kineto args: record_param_comms "dtype" (Float, BFloat16),
# "Input type" of cpu ops (float, c10::BFloat16, long int, unsigned char).
DTYPE_BYTES: dict[str, int] = {}
for _names, _size in (
    (("float", "float32", "float", "single"), 4),
    (("double", "float64"), 8),
    (("half", "float16", "c10::half"), 2),
    (("bfloat16", "c10::bfloat16"), 2),
    (("long", "int64", "long int", "int64_t", "long long"), 8),
    (("int", "int32", "int32_t"), 4),
    (("short", "int16", "int16_t"), 2),
    (("char", "byte", "int8", "uint8", "signed char", "unsigned char", "bool", "int8_t", "uint8_t"), 1),
    (("uint16", "uint16_t", "unsigned short"), 2),
    (("uint32", "uint32_t", "unsigned int"), 4),
    (("uint64", "uint64_t", "unsigned long", "unsigned long int"), 8),
    (("complexfloat", "c10::complex<float>", "complex64"), 8),
    (("complexdouble", "c10::complex<double>", "complex128"), 16),
    (("complexhalf", "c10::complex<c10::half>"), 4),
    (
        (
            "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
            "c10::float8_e4m3fn", "c10::float8_e5m2", "c10::float8_e4m3fnuz", "c10::float8_e5m2fnuz",
        ),
        1,
    ),
):
    for _n in _names:
        DTYPE_BYTES[_n] = _size


def dtype_size(name: Any) -> int | None:
    """Bytes per element of a Kineto dtype spelling, or None if unknown."""
    if not isinstance(name, str):
        return None
    return DTYPE_BYTES.get(name.strip().lower())


# Order matters: the first substring found wins ("reducescatter" before "reduce"/"scatter").
_COLL_PATTERNS: tuple[tuple[str, NodeType, int], ...] = (
    ("reducescatter", NodeType.COMM_COLL_NODE, CollectiveType.REDUCE_SCATTER),
    ("allreduce", NodeType.COMM_COLL_NODE, CollectiveType.ALL_REDUCE),
    ("allgather", NodeType.COMM_COLL_NODE, CollectiveType.ALL_GATHER),
    ("alltoall", NodeType.COMM_COLL_NODE, CollectiveType.ALL_TO_ALL),
    ("broadcast", NodeType.COMM_COLL_NODE, CollectiveType.BROADCAST),
    ("barrier", NodeType.COMM_COLL_NODE, CollectiveType.BARRIER),
    ("sendrecv", NodeType.INVALID_NODE, -1),  # NCCL's p2p kernel: the host op says what it was
    ("send", NodeType.COMM_SEND_NODE, -1),
    ("recv", NodeType.COMM_RECV_NODE, -1),
    ("reduce", NodeType.COMM_COLL_NODE, CollectiveType.REDUCE),
    ("gather", NodeType.COMM_COLL_NODE, CollectiveType.GATHER),
    ("scatter", NodeType.COMM_COLL_NODE, CollectiveType.SCATTER),
)
_PREFIX = re.compile(r"^(c10d::|gloo:|nccl:|nccldevkernel_|ncclkernel_|rccl)")


def collective_kind(name: str) -> tuple[NodeType, int] | None:
    """``(node type, collective type)`` of a collective name in any spelling, or None.

    Send/recv give ``(COMM_SEND_NODE|COMM_RECV_NODE, -1)``; NCCL's ``SendRecv`` kernel, which can be
    a send, a recv or part of an all-to-all, gives ``(INVALID_NODE, -1)`` (ask the host op).
    """
    s = name.split("(", 1)[0].strip().lower()
    s = _PREFIX.sub("", s).replace("_", "").replace(" ", "")
    for pat, ntype, ctype in _COLL_PATTERNS:
        if pat in s:
            return ntype, int(ctype)
    return None


def is_nccl_kernel(name: str) -> bool:
    """True for NCCL/RCCL device kernels (``ncclKernel_*``, ``ncclDevKernel_*``)."""
    return name.startswith(("ncclKernel", "ncclDevKernel", "rcclKernel", "rccl_", "nccl"))


def dims_bytes(dims: Any, types: Any) -> int | None:
    """Bytes of the tensors described by Kineto ``Input Dims``/``Input type`` (known dtypes only)."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total, found = 0, False
    for d, t in zip(dims, types):
        size = dtype_size(t)
        if size is None or not isinstance(d, list):
            continue
        if d and isinstance(d[0], list):  # a tensor list: sum its members
            n = sum(math.prod(x) for x in d if isinstance(x, list))
        else:
            n = math.prod(d)
        total += n * size
        found = True
    return total if found else None


def parse_ranks(text: Any) -> list[int] | None:
    """Global ranks from a ``Process Group Ranks`` arg (``"[0, 1]"``); None when absent/truncated."""
    if isinstance(text, list):
        return [int(x) for x in text] if all(isinstance(x, int) for x in text) else None
    if not isinstance(text, str):
        return None
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")) or "..." in body:
        return None
    body = body[1:-1].strip()
    if not body:
        return []
    try:
        return [int(x) for x in body.split(",")]
    except ValueError:
        return None


MAX_COMM_BYTES = 1 << 50  # one transfer; a size above this is a corrupt element count


@dataclass
class CommInfo:
    """What a collective is: node type, collective type, bytes, group, peer, tag."""

    ntype: NodeType
    ctype: int = -1
    nbytes: int | None = None
    group: str | None = None
    peer: int = -1  # global rank
    tag: int = -1
    seq: int = -1
    source: str = ""  # where the metadata came from (kernel, record_param_comms, annotation, ...)


class GroupRegistry:
    """Process groups of a trace: from ``distributedInfo.pg_config`` and from event args."""

    def __init__(self, meta: TraceMeta, path: object) -> None:
        self.meta = meta
        self.path = path
        self.guessed = 0

    def world_name(self) -> str:
        """Name of the group holding every rank (created as ``"0"`` if the trace named none)."""
        world = tuple(range(self.meta.world_size))
        pgs = self.meta.process_groups
        for name, g in pgs.items():
            if g.desc == "default_pg" and g.ranks == world:
                return name
        for name, g in pgs.items():
            if g.ranks == world:
                return name
        name = "0" if "0" not in pgs else "world"
        self.meta.add_group(ProcessGroup(name, world, "world (implicit)", ""))
        self.meta.extra["implicit_world_group"] = name
        return name

    def resolve(self, args: dict[str, Any]) -> str:
        """Group name for an event carrying ``Process Group Name``/``Ranks`` args (registers it)."""
        name = args.get("Process Group Name")
        if isinstance(name, (str, int)) and name != "":
            name = str(name)
            if name in self.meta.process_groups:
                return name
            ranks = parse_ranks(args.get("Process Group Ranks"))
            if not ranks:
                start, stride = args.get("Global rank start"), args.get("Global rank stride")
                size = args.get("Group size")
                if isinstance(start, int) and isinstance(stride, int) and isinstance(size, int) and size > 0:
                    ranks = [start + stride * i for i in range(size)]
            if ranks is not None and len(ranks) == 0:
                ranks = list(range(self.meta.world_size))
            if ranks:
                desc = args.get("Process Group Description")
                try:
                    self.meta.add_group(ProcessGroup(name, tuple(ranks), desc if isinstance(desc, str) else ""))
                except ValueError as e:
                    from ettools.errors import TraceError

                    raise TraceError(self.path, str(e)) from None
                return name
        self.guessed += 1
        return self.world_name()

    def global_rank(self, group: str, group_rank: int) -> int:
        """Global rank of member ``group_rank`` of ``group`` (-1 if out of range)."""
        g = self.meta.process_groups.get(group)
        if g is None or not 0 <= group_rank < len(g.ranks):
            return -1
        return g.ranks[group_rank]


def nccl_info_from_args(args: dict[str, Any], groups: GroupRegistry, source: str) -> CommInfo | None:
    """CommInfo from ``Collective name``/``In msg nelems``/``dtype`` args (kernel or record_param_comms)."""
    cname = args.get("Collective name")
    if not isinstance(cname, str):
        return None
    kind = collective_kind(cname)
    if kind is None or kind[0] == NodeType.INVALID_NODE:
        return None
    nelems = args.get("In msg nelems")
    size = dtype_size(args.get("dtype"))
    nbytes = nelems * size if isinstance(nelems, int) and size is not None else None
    group = groups.resolve(args)
    info = CommInfo(kind[0], kind[1], nbytes, group, source=source)
    seq = args.get("Seq")
    if isinstance(seq, int):
        info.seq = seq
    if kind[0] != NodeType.COMM_COLL_NODE:
        key = "Dst Rank" if kind[0] == NodeType.COMM_SEND_NODE else "Src Rank"
        peer = args.get(key)
        if isinstance(peer, str) and peer.lstrip("-").isdigit():
            peer = int(peer)
        if not isinstance(peer, int):
            r = args.get("Rank")
            peer = groups.global_rank(group, int(r)) if isinstance(r, int) else -1
        info.peer = peer
    return info


# gloo: which gloo:<op> spans a c10d::<op> may run as (gloo implements reduce_scatter as all_reduce).
_GLOO_COMPAT = {
    int(CollectiveType.REDUCE_SCATTER): {int(CollectiveType.REDUCE_SCATTER), int(CollectiveType.ALL_REDUCE)},
}


def gloo_compatible(c10d_kind: tuple[NodeType, int], gloo_kind: tuple[NodeType, int]) -> bool:
    """Whether a ``gloo:<op>`` span can be the transfer of a ``c10d::<op>`` call."""
    if c10d_kind[0] != gloo_kind[0]:
        return False
    if c10d_kind[0] != NodeType.COMM_COLL_NODE:
        return True
    return gloo_kind[1] in _GLOO_COMPAT.get(c10d_kind[1], {c10d_kind[1]})


def concrete_int(args: dict[str, Any], i: int) -> int | None:
    """``Concrete Inputs[i]`` as an int (gloo send/recv: [2] = peer group rank, [3] = tag)."""
    ci = args.get("Concrete Inputs")
    if isinstance(ci, list) and len(ci) > i:
        v = ci[i]
        if isinstance(v, int):
            return v
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


# ---------------------------------------------------------------------------------------------
# building comm nodes of one rank (``r`` is kineto_rank._Rank: node columns sorted by start)
# ---------------------------------------------------------------------------------------------

_TOL_US = 1.0


def build_collectives(r: Any, groups: GroupRegistry, gloo_p2p: Any) -> None:
    """Turn NCCL kernels and gloo spans of rank ``r`` into COMM nodes (in place)."""
    import numpy as np

    from ettools.graph import EdgeKind

    guessed0 = groups.guessed
    made: list[tuple[int, CommInfo]] = []
    unknown = 0
    kern = np.flatnonzero(r.cls == KERNEL)
    if len(kern):
        ids = [i for i in unique(r.name_id[kern]).tolist() if is_nccl_kernel(r.strings[i])]
        for row in kern[np.isin(r.name_id[kern], ids)].tolist():
            info = _nccl_info(r, row, groups)
            if info is None:
                # an NCCL/RCCL kernel whose launch (and its annotation) is outside the trace and whose
                # name does not say which collective it runs (SendRecv, RCCL's Generic): still a
                # collective of the default group, its type and size unknown and counted
                unknown += 1
                info = CommInfo(NodeType.COMM_COLL_NODE, -1, None, groups.resolve({}), source="kernel name")
            made.append((row, info))

    ann = np.flatnonzero(r.cls == ANNOT)
    gloo_ids = [i for i in unique(r.name_id[ann]).tolist() if r.strings[i].startswith("gloo:")]
    gloo = ann[np.isin(r.name_id[ann], gloo_ids)] if gloo_ids else np.zeros(0, np.int64)
    launch_dst: list[int] = []
    launch_src: list[int] = []
    if len(gloo):
        cpu = np.flatnonzero(r.cls == CPU_OP)
        c10d_ids = [i for i in unique(r.name_id[cpu]).tolist()
                    if r.strings[i].startswith("c10d::") and collective_kind(r.strings[i]) is not None]
        c10d = cpu[np.isin(r.name_id[cpu], c10d_ids)] if c10d_ids else np.zeros(0, np.int64)
        issuer = _match_gloo(r, gloo, c10d)
        p2p = set(np.asarray(gloo_p2p).tolist())
        for g in gloo.tolist():
            kind = collective_kind(r.name(g))
            if kind is None or kind[0] == NodeType.INVALID_NODE:
                unknown += 1
                continue
            o = issuer.get(g, -1)
            src_args = r.args[o] if o >= 0 else {}
            if o >= 0:
                kind = collective_kind(r.name(o)) or kind
                launch_dst.append(g)
                launch_src.append(o)
            nbytes = dims_bytes(r.args[g].get("Input Dims"), r.args[g].get("Input type"))
            if nbytes is None and o >= 0:
                nbytes = dims_bytes(src_args.get("Input Dims"), src_args.get("Input type"))
            if kind[1] == CollectiveType.BARRIER and nbytes is None:
                nbytes = 0
            info = CommInfo(kind[0], kind[1], nbytes, groups.resolve(src_args), source="gloo")
            if kind[0] != NodeType.COMM_COLL_NODE:
                peer = concrete_int(src_args, 2)
                tag = concrete_int(src_args, 3)
                info.peer = groups.global_rank(info.group, peer) if peer is not None else -1
                info.tag = tag if tag is not None else -1
            if g in p2p:
                r.res[g] = r.strings.intern(f"{r.strings[int(r.res[g])]} p2p")
            made.append((g, info))
        r.add_edges(np.array(launch_dst, np.int64), np.array(launch_src, np.int64), EdgeKind.LAUNCH)
        _gloo_waits(r, launch_dst, launch_src)

    # write the columns; NCCL send/recv get tags by message count per (group, sender, receiver)
    counts: dict[tuple[str, int, int], int] = {}
    seq_rows, seq_vals, src_rows, src_vals = [], [], [], []
    no_bytes = 0
    for row, info in made:
        r.type[row] = int(info.ntype)
        r.comm_group[row] = r.strings.intern(info.group or groups.world_name())
        if info.nbytes is None:
            no_bytes += 1  # unknown size: -1 (never a silent 0), counted and shown by ``ettools info``
        elif not 0 <= info.nbytes <= MAX_COMM_BYTES:
            raise ValueError(f"{info.source or 'a'} communication of {info.nbytes:,} bytes (its element count "
                             f"times element size): beyond 2^50 B, not a real transfer")
        r.comm_bytes[row] = info.nbytes if info.nbytes is not None else -1
        if info.ntype == NodeType.COMM_COLL_NODE:
            r.comm_type[row] = info.ctype
        else:
            r.comm_peer[row] = info.peer
            if info.tag < 0 and info.peer >= 0 and info.source != "gloo":
                key = (info.group or "", r.rank, info.peer) if info.ntype == NodeType.COMM_SEND_NODE else (
                    info.group or "", info.peer, r.rank)
                info.tag = counts.get(key, 0)
                counts[key] = info.tag + 1
            r.comm_tag[row] = info.tag
        if info.seq >= 0:
            seq_rows.append(row)
            seq_vals.append(info.seq)
        src_rows.append(row)
        src_vals.append(info.source)
    r.set_attr("comm_seq", "int64_val", np.array(seq_rows, np.int64), seq_vals)
    r.set_attr("comm_source", "string_val", np.array(src_rows, np.int64), src_vals)
    r.meta["comm_nodes"] = len(made)
    r.meta["comm_unknown"] = unknown
    r.meta["comm_bytes_unknown"] = no_bytes
    r.meta["comm_group_guessed"] = groups.guessed - guessed0


def _nccl_info(r: Any, row: int, groups: GroupRegistry) -> CommInfo | None:
    """Metadata of an NCCL kernel: its args, else the host ops around its launch, else its name."""
    a = r.args[row]
    if "Collective name" in a:
        info = nccl_info_from_args(a, groups, "kernel")
        if info is not None:
            return info
    ann_info: CommInfo | None = None
    rpc_bytes: int | None = None
    anc = int(r.launcher[row])
    depth = 0
    while anc >= 0 and depth < 200:
        nm = r.name(anc)
        aa = r.args[anc]
        if nm == "record_param_comms":
            if "Collective name" in aa:
                info = nccl_info_from_args(aa, groups, "record_param_comms")
                if info is not None:
                    return info
            elif rpc_bytes is None:
                rpc_bytes = dims_bytes(aa.get("Input Dims"), aa.get("Input type"))
        elif ann_info is None and nm.startswith(("nccl:", "c10d::")):
            kind = collective_kind(nm)
            if kind is not None and kind[0] != NodeType.INVALID_NODE:
                ann_info = CommInfo(kind[0], kind[1], dims_bytes(aa.get("Input Dims"), aa.get("Input type")),
                                    None, source=nm.split(":")[0])
                ann_args = aa
        anc = int(r.parent[anc])
        depth += 1
    if ann_info is not None:
        if ann_info.nbytes is None:
            ann_info.nbytes = rpc_bytes
        ann_info.group = groups.resolve(ann_args)
        return ann_info
    kind = collective_kind(r.name(row))
    if kind is None or kind[0] == NodeType.INVALID_NODE or kind[0] != NodeType.COMM_COLL_NODE:
        return None
    return CommInfo(kind[0], kind[1], rpc_bytes, groups.resolve({}), source="kernel name")


def _match_gloo(r: Any, gloo: Any, c10d: Any) -> dict[int, int]:
    """gloo span row → the c10d op row that issued it.

    Send/recv spans run on the caller's thread and start inside their ``c10d::send``/``recv_``;
    collective spans run on runloop threads: each c10d collective takes, in time order, the first
    compatible unclaimed span that starts after it.
    """
    out: dict[int, int] = {}
    kinds = {row: collective_kind(r.name(row)) for row in list(gloo.tolist()) + list(c10d.tolist())}
    p2p_ops = [o for o in c10d.tolist() if kinds[o][0] != NodeType.COMM_COLL_NODE]
    coll_ops = [o for o in c10d.tolist() if kinds[o][0] == NodeType.COMM_COLL_NODE]
    for g in gloo.tolist():
        k = kinds[g]
        if k is None or k[0] == NodeType.COMM_COLL_NODE:
            continue
        best = -1
        for o in p2p_ops:
            if (r.res[o] == r.res[g] and kinds[o][0] == k[0] and r.start[o] <= r.start[g] + _TOL_US
                    and r.start[g] <= r.end[o] + _TOL_US and o not in out.values()):
                if best < 0 or r.start[o] > r.start[best]:
                    best = o
        if best >= 0:
            out[g] = best
    spans = [g for g in gloo.tolist() if kinds[g] is not None and kinds[g][0] == NodeType.COMM_COLL_NODE]
    spans.sort(key=lambda g: r.start[g])
    claimed = [False] * len(spans)
    lo = 0
    for o in sorted(coll_ops, key=lambda o: r.start[o]):
        while lo < len(spans) and claimed[lo]:
            lo += 1
        for j in range(lo, len(spans)):
            g = spans[j]
            if claimed[j] or r.start[g] < r.start[o] - _TOL_US:
                continue
            if gloo_compatible(kinds[o], kinds[g]):
                claimed[j] = True
                out[g] = o
                break
    return out


def _gloo_waits(r: Any, comm_rows: list[int], issuers: list[int]) -> None:
    """SYNC_GUESSED: the issuing thread sat idle until the transfer ended, then resumed.

    The waiter is the first host op of the issuing thread starting after the transfer ended whose
    idle gap (``gap_before_us``) covers the transfer's end, and which resumed in the latter half of
    that gap (a thread that only happened to be idle then is not waiting).
    """
    import numpy as np

    from ettools.graph import EdgeKind

    if not comm_rows:
        return
    gap = r.attrs.get("gap_before_us")
    gaps = np.full(r.n, np.nan)
    if gap is not None:
        gaps[gap.rows] = gap.values
    hs = r.host_sorted  # grouped by thread, start order inside
    keys = r.res[hs]
    cut = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    bounds = zip(np.concatenate(([0], cut)).tolist(), np.concatenate((cut, [len(hs)])).tolist())
    per_thread = {int(keys[a]): hs[a:b] for a, b in bounds}
    dst, src = [], []
    for c, o in zip(comm_rows, issuers):
        rows = per_thread[int(r.res[o])]
        k = int(np.searchsorted(r.start[rows], r.end[c] - _TOL_US))
        if k >= len(rows):
            continue
        h = int(rows[k])
        gp = gaps[h]
        if np.isnan(gp) or r.start[h] <= r.end[o]:
            continue
        g0 = r.start[h] - gp
        if g0 <= r.end[c] + _TOL_US and r.start[h] - r.end[c] <= 0.5 * gp + _TOL_US:
            dst.append(h)
            src.append(c)
    if dst:
        r.add_edges(np.array(dst, np.int64), np.array(src, np.int64), EdgeKind.SYNC_GUESSED)
    r.meta["gloo_waits_guessed"] = len(dst)
