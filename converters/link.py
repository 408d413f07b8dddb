"""Link a PyTorch Execution Trace (host ops, tensors, data flow) with a Kineto trace of the same
run (times, device ops), and report how much got linked.

:func:`link_et_kineto` returns one trace: the ET's nodes and edges, each ET op timed by the
Kineto op it matched (``start``/``dur``; NaN when unmatched), plus the device ops (kernels,
memcpys, memsets) launched from matched ops, each with a ``LAUNCH`` edge to its ET op and an
``ORDER`` edge to the previous kept device op of its stream.

Matching host ops
-----------------
* ``rf_id``: ET attribute ``rf_id`` == Kineto ``Record function id`` (attr ``rf_id``), with equal
  names. Used when the Kineto trace carries record-function ids.
* ``sequence`` (fallback, e.g. the PARAM pairs in ``shared/traces/et_kineto``): per host thread,
  the ET ops in id order (= start order) are aligned with the Kineto ``cpu_op`` /
  ``user_annotation`` events in start order. First *anchors*: ``(name, autograd sequence
  number)`` pairs unique on both sides (ET ``seq_id``, Kineto ``Sequence number``), kept only
  where they form an increasing chain in both sequences (longest increasing subsequence). This
  finds the right iteration when the Kineto trace holds many and the ET one. Between anchors
  (and before the first / after the last, aligned outward from the anchor) a greedy diff on
  names matches equal names and skips, on a mismatch, the side whose next match is nearer
  (next occurrences found by binary search over per-name position lists). Work is
  O((n + m) log m); nothing searches backwards per kernel.
* ET threads are paired with Kineto threads by anchor votes, else by name-count overlap.

Attaching device ops
--------------------
A device op belongs to the ET op matched to the deepest matched Kineto host op enclosing its
launching runtime call (``LAUNCH`` edge, then the ``NEST`` chain). Only device ops *in the
window* count: launched while the matched host ops ran (from the first matched op's start to
the last one's end), because an ET usually covers one or a few of the iterations a Kineto
trace holds. ``LinkReport.linking_rate`` = attached / in-window device ops. Unattached device
ops are not in the output (counted in the report).

Communication: exactly one node per collective call stays a comm node. When Kineto shows the
transfer itself — an NCCL kernel (a Kineto ``COMM_*`` node or an ``ncclKernel``/``ncclDevKernel``
kernel) attached to an ET op, or a ``gloo:<op>`` span matched to an ET op — that node carries the
collective, and the ET comm node that issued it (``record_param_comms`` / ``c10d::*``: found by
Kineto's LAUNCH edge from the span to its ``c10d`` op, else the ET parent chain) becomes a
``COMP_NODE`` whose former comm fields are kept as attributes ``host_comm_type``,
``host_comm_bytes``, ``host_comm_group``. Fields the carrier lacks come from the ET node (on gloo
spans the ET's bytes/group/peer/tag win; on kernels Kineto's).

Other output attributes: ``kineto_ext_id`` on each matched ET op (its Kineto ``External id``);
on device ops the Kineto attributes (``cat``, ``correlation``, …; renamed ``kineto_<name>`` if
the ET has an attribute of that name), ``launch_api`` (the runtime call) and
``launch_offset_us`` (runtime call start − ET op start). ``RankGraph.meta["link"]`` and
``TraceMeta.extra["link"]`` hold the report. Kineto runtime calls, annotations the ET lacks and
SYNC edges are not carried over.

Where the parts live: this module matches host ops and attaches device ops (:func:`link_et_kineto`,
:class:`LinkReport`); :mod:`.link_align` aligns name sequences, :mod:`.link_output` builds the
linked graph, :mod:`.link_columns` holds the column helpers they share.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# MYERS_MAX_EDITS, align_sequences and NCCL_PREFIXES stay importable here (tests import align_sequences)
from ettools.converters.link_align import MYERS_MAX_EDITS, align_sequences  # noqa: F401
from ettools.converters.link_columns import _depth, _full_int, _full_str, _parents
from ettools.converters.link_output import NCCL_PREFIXES, _build_output  # noqa: F401
from ettools.graph import EdgeKind, RankGraph, StringTable, Trace, TraceMeta

HOST_CATS = ("cpu_op", "user_annotation", "operator", "Operator")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")


@dataclass
class LinkReport:
    """What the linker matched: host ops, device ops in the ET's window, method and time."""

    method: str = "none"  # "rf_id", "sequence" or "none" ("mixed" over ranks that differ)
    et_host_ops: int = 0
    host_ops_matched: int = 0
    kineto_host_ops: int = 0
    anchors: int = 0
    device_ops_total: int = 0
    device_ops_in_window: int = 0
    device_ops_attached: int = 0
    seconds: float = 0.0
    per_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def host_match_rate(self) -> float:
        """Matched ET host ops / ET host ops."""
        return self.host_ops_matched / self.et_host_ops if self.et_host_ops else 0.0

    @property
    def linking_rate(self) -> float:
        """Device ops attached to an ET host op / device ops launched in the ET's window
        (1.0 when there are none to attach, as in CPU-only traces)."""
        return self.device_ops_attached / self.device_ops_in_window if self.device_ops_in_window else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (rates included)."""
        d = asdict(self)
        d["per_rank"] = {str(k): v for k, v in self.per_rank.items()}
        d["host_match_rate"] = round(self.host_match_rate, 6)
        d["linking_rate"] = round(self.linking_rate, 6)
        return d

    def __str__(self) -> str:
        if self.device_ops_in_window:
            dev = (f"device ops {self.device_ops_attached}/{self.device_ops_in_window} in the ET window "
                   f"attached ({100 * self.linking_rate:.1f} %; {self.device_ops_total} device ops in Kineto)")
        else:
            dev = f"no device ops in the ET window ({self.device_ops_total} in Kineto)"
        return (f"{self.method}: host ops {self.host_ops_matched}/{self.et_host_ops} matched, {dev}, "
                f"{self.seconds:.3f} s")


def _only_kineto_steps(et: RankGraph, k: RankGraph) -> RankGraph:
    """``et`` without the ops of the ``ProfilerStep#N`` steps the Kineto trace does not hold.

    When the Kineto side was read with a step selection, the ET (which has no time base to
    select by) still holds every step; ops of the others would stay untimed and unlinked. An ET
    whose steps all appear in the Kineto trace, or that has none, is returned as it is.
    """
    kept = {str(s[0]) for s in k.meta.get("steps") or []}
    if not kept or not len(et):
        return et
    # step annotations by name id: one look at each distinct name, not at every row
    step_ids = [int(i) for i in np.unique(et.name) if i >= 0 and et.strings[int(i)].startswith("ProfilerStep#")]
    if not step_ids or all(et.strings[i] in kept for i in step_ids):
        return et
    parent = _parents(et, EdgeKind.NEST)
    # each row's outermost ancestor (itself for roots), by pointer jumping: O(log depth) passes
    root = np.where(parent >= 0, parent, np.arange(len(et)))
    for _ in range(64):
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    else:
        return et  # nesting with a cycle: leave the ET whole (the linker reports what it cannot match)
    kept_ids = [i for i in step_ids if et.strings[i] in kept]
    keep_root = np.isin(et.name, kept_ids)
    return et.select(keep_root[root])


# ---- linking one rank -------------------------------------------------------------------------
def _match_rf(et: RankGraph, k: RankGraph, k_host: np.ndarray, k_name: np.ndarray) -> np.ndarray | None:
    """ET row per Kineto row by record-function id (names must agree), or None if no rf ids."""
    k_rf = _full_int(k, "rf_id", 0)
    e_rf = _full_int(et, "rf_id", 0)
    k_has = k_host & (k_rf > 0)
    if not k_has.any() or not (e_rf > 0).any():
        return None
    e_rows = np.flatnonzero(e_rf > 0)
    order = np.argsort(e_rf[e_rows], kind="stable")
    sorted_rf = e_rf[e_rows][order]
    kr = np.flatnonzero(k_has)
    pos = np.searchsorted(sorted_rf, k_rf[kr])
    pos_c = np.minimum(pos, len(sorted_rf) - 1)
    hit = sorted_rf[pos_c] == k_rf[kr]
    et_rows = e_rows[order][pos_c]
    hit &= et.name[et_rows] == k_name[kr]
    out = np.full(len(k), -1, np.int64)
    out[kr[hit]] = et_rows[hit]
    # one Kineto op per ET op
    _, first = np.unique(out[kr[hit]], return_index=True)
    dup = np.ones(hit.sum(), bool)
    dup[first] = False
    out[kr[hit][dup]] = -1
    return out


def _match_sequence(
    et: RankGraph, k: RankGraph, k_host: np.ndarray, k_name: np.ndarray, k_order: np.ndarray
) -> tuple[np.ndarray, int, list[str]]:
    """ET row per Kineto row by per-thread sequence alignment."""
    warnings: list[str] = []
    e_seq = _full_int(et, "seq_id", -1)
    k_seq = _full_int(k, "seq", -1)
    # sequences per thread, in start order
    e_threads: dict[int, list[int]] = {}
    for r, res in enumerate(et.resource.tolist()):
        e_threads.setdefault(res, []).append(r)
    k_threads: dict[int, list[int]] = {}
    k_res = k.resource
    for r in k_order.tolist():
        if k_host[r]:
            k_threads.setdefault(int(k_res[r]), []).append(r)
    # score thread pairs: anchors first, then name overlap
    e_keys = {t: {(int(et.name[r]), int(e_seq[r])) for r in rows if e_seq[r] >= 0} for t, rows in e_threads.items()}
    k_keys = {t: {(int(k_name[r]), int(k_seq[r])) for r in rows if k_seq[r] >= 0} for t, rows in k_threads.items()}
    e_cnt = {t: np.bincount(et.name[rows], minlength=1) for t, rows in e_threads.items()}
    k_cnt = {t: np.bincount(k_name[rows], minlength=1) for t, rows in k_threads.items()}
    scores = []
    for te in e_threads:
        for tk in k_threads:
            a, b = e_cnt[te], k_cnt[tk]
            n = min(len(a), len(b))
            overlap = int(np.minimum(a[:n], b[:n]).sum())
            scores.append((len(e_keys[te] & k_keys[tk]), overlap, te, tk))
    scores.sort(reverse=True)
    used_e, used_k, pairs = set(), set(), []
    for sa, so, te, tk in scores:
        if te in used_e or tk in used_k or (sa == 0 and so == 0):
            continue
        used_e.add(te)
        used_k.add(tk)
        pairs.append((te, tk))
    out = np.full(len(k), -1, np.int64)
    anchors = 0
    for te, tk in pairs:
        er, kr = e_threads[te], k_threads[tk]
        a = et.name[er].tolist()
        b = k_name[kr].tolist()
        m, na = align_sequences(a, b, e_seq[er].tolist(), k_seq[kr].tolist())
        anchors += na
        for i, j in m:
            out[kr[j]] = er[i]
    # Leftovers: ops the ET puts on a thread that Kineto shows elsewhere (gloo runloop work is
    # tagged with the caller's thread in ET): unmatched ET ops, in id order, against the
    # unmatched Kineto host ops inside the matched time window, in start order (all threads).
    hit = np.flatnonzero(out >= 0)
    done = np.zeros(len(et), bool)
    done[out[hit]] = True
    rest_e = np.flatnonzero(~done).tolist()
    if rest_e and len(hit):
        w0 = np.nanmin(k.start[hit])
        w1 = np.nanmax(k.start[hit] + k.dur[hit])
        free = k_host & (out < 0) & (k.start >= w0) & (k.start <= w1)
        rest_k = k_order[free[k_order]].tolist()
        if rest_k:
            m, na = align_sequences(et.name[rest_e].tolist(), k_name[rest_k].tolist(),
                                    e_seq[rest_e].tolist(), k_seq[rest_k].tolist())
            anchors += na
            for i, j in m:
                out[rest_k[j]] = rest_e[i]
    return out, anchors, warnings


def _link_rank(et: RankGraph, k: RankGraph, strings: StringTable) -> tuple[RankGraph, dict[str, Any]]:
    """Link one rank; ``strings`` is the output table (a superset of the ET's)."""
    n_k = len(k)
    # Kineto names and categories in the output string table
    kmap = np.fromiter((strings.intern(k.strings[i]) for i in range(len(k.strings))), np.int32, len(k.strings))
    k_name = kmap[k.name] if n_k else np.zeros(0, np.int32)
    cat = _full_str(k, "cat")
    host_ids = [k.strings.lookup(c) for c in HOST_CATS]
    dev_ids = [k.strings.lookup(c) for c in DEVICE_CATS]
    k_host = np.isin(cat, [h for h in host_ids if h >= 0]) & (k.is_cpu_op != 0)
    k_dev = np.isin(cat, [d for d in dev_ids if d >= 0])
    if not k_dev.any():
        k_dev = k.is_cpu_op == 0
    parent = _parents(k, EdgeKind.NEST)
    launcher = _parents(k, EdgeKind.LAUNCH)
    depth = _depth(parent)
    k_order = np.lexsort((depth, -np.nan_to_num(k.dur), np.nan_to_num(k.start)))

    warnings: list[str] = []
    matched = _match_rf(et, k, k_host, k_name)
    method = "rf_id"
    anchors = 0
    if matched is None or not (matched >= 0).any():
        if matched is not None:
            warnings.append("record-function ids present but none matched: fell back to sequence alignment")
        matched, anchors, w = _match_sequence(et, k, k_host, k_name, k_order)
        warnings.extend(w)
        method = "sequence"
    k_matched = np.flatnonzero(matched >= 0)
    if len(k_matched) == 0:
        method = "none"
    if len(et) and len(k_matched) < 0.5 * len(et):
        warnings.append(
            f"only {len(k_matched)} of {len(et)} ET ops matched a Kineto op ({method}): "
            "the two traces may not come from the same run"
        )

    # owner: deepest matched host op enclosing each Kineto row (pointer jumping up the NEST chain)
    owner = matched.copy()
    anc = parent.copy()
    for _ in range(10_000):
        todo = (owner < 0) & (anc >= 0)
        if not todo.any():
            break
        owner[todo] = matched[anc[todo]]
        anc[todo] = parent[anc[todo]]

    dev_rows = np.flatnonzero(k_dev)
    launch = launcher[dev_rows]
    launch_start = np.where(launch >= 0, k.start[np.maximum(launch, 0)], k.start[dev_rows])
    dev_owner = np.where(launch >= 0, owner[np.maximum(launch, 0)], -1)
    if len(k_matched):
        w0 = float(np.nanmin(k.start[k_matched]))
        w1 = float(np.nanmax(k.start[k_matched] + k.dur[k_matched]))
    else:
        w0 = w1 = math.nan
    in_window = (launch_start >= w0) & (launch_start <= w1)
    attached = dev_owner >= 0
    in_window |= attached  # launched inside a matched op, so inside the window (NaN-safe)

    out = _build_output(et, k, strings, kmap, matched, dev_rows[attached], dev_owner[attached],
                        launch[attached], launcher)
    stats = {
        "method": method,
        "et_host_ops": len(et),
        "host_ops_matched": int(len(k_matched)),
        "kineto_host_ops": int(k_host.sum()),
        "anchors": anchors,
        "device_ops_total": int(len(dev_rows)),
        "device_ops_in_window": int(in_window.sum()),
        "device_ops_attached": int(attached.sum()),
        "window_us": [w0, w1],
        "warnings": warnings,
    }
    return out, stats


def link_et_kineto(et: Trace, kineto: Trace) -> tuple[Trace, LinkReport]:
    """Link an ET trace with a Kineto trace of the same run (see the module docstring).

    Ranks are paired by number (a single rank on each side is paired whatever its number);
    an ET rank with no Kineto rank is kept unlinked.
    """
    t0 = time.perf_counter()
    strings = StringTable(et.strings[i] for i in range(len(et.strings)))
    meta = TraceMeta(
        world_size=max(et.meta.world_size, kineto.meta.world_size),
        process_groups=dict(et.meta.process_groups),
        device_properties=list(kineto.meta.device_properties or et.meta.device_properties),
        source="pytorch_et+kineto",
        extra={**kineto.meta.extra, **et.meta.extra},
    )
    report = LinkReport()
    warnings: list[str] = []
    for grp in kineto.meta.process_groups.values():
        try:
            meta.add_group(grp)
        except ValueError as e:
            warnings.append(f"Kineto process group ignored: {e}")
    pairs: dict[int, int | None] = {}
    if len(et.graphs) == 1 and len(kineto.graphs) == 1:
        pairs[et.ranks[0]] = kineto.ranks[0]
    else:
        for r in et.ranks:
            pairs[r] = r if r in kineto.graphs else None
    graphs: dict[int, RankGraph] = {}
    methods = set()
    for r, kr in pairs.items():
        eg = et.graphs[r]
        if kr is None:
            warnings.append(f"rank {r}: no Kineto trace, left unlinked")
            graphs[r] = RankGraph(eg.rank, strings, dict(eg.columns), eg.dep_ptr, eg.dep_id, eg.dep_kind,
                                  dict(eg.attrs), eg.tensors, eg.in_ptr, eg.in_tensor, eg.out_ptr,
                                  eg.out_tensor, dict(eg.meta))
            report.et_host_ops += len(eg)
            continue
        g, stats = _link_rank(_only_kineto_steps(eg, kineto.graphs[kr]), kineto.graphs[kr], strings)
        # what the Kineto side measured (steps, [memory] events, launch latency, …) stays with
        # the rank: the linked graph keeps Kineto's time base
        for key, value in kineto.graphs[kr].meta.items():
            g.meta.setdefault(key, value)
        g.meta["link"] = stats
        graphs[r] = g
        report.per_rank[r] = stats
        methods.add(stats["method"])
        for key in ("et_host_ops", "host_ops_matched", "kineto_host_ops", "anchors", "device_ops_total",
                    "device_ops_in_window", "device_ops_attached"):
            setattr(report, key, getattr(report, key) + stats[key])
        warnings.extend(f"rank {r}: {w}" for w in stats["warnings"])
    report.method = methods.pop() if len(methods) == 1 else ("mixed" if methods else "none")
    report.warnings = warnings
    report.seconds = time.perf_counter() - t0
    meta.extra["link"] = report.to_dict()
    return Trace(meta, graphs, strings), report


def read_linked(
    et_path: str | Path | list[Path], kineto_path: str | Path | list[Path], steps: Any = None
) -> tuple[Trace, LinkReport]:
    """Read an ET file (or rank files / directory) and a Kineto trace and link them.

    ``steps`` is passed to the Kineto reader. ``LinkReport.seconds`` covers only the linking.
    """
    from ettools.converters.kineto import read_kineto
    from ettools.converters.pytorch_et import read_pytorch_et

    et = read_pytorch_et(et_path)
    kineto = read_kineto(kineto_path, steps=steps) if steps is not None else read_kineto(kineto_path)
    return link_et_kineto(et, kineto)
