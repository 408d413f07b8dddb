"""What ettools keeps in a Chakra file's ``GlobalMetadata``: the source's metadata as read, the
synthesizer's attributes (:data:`SYNTH_META_ATTRS`) and the measured-trace attributes (steps, stream
gap, launch queue, rank clock) — written by the writer and taken back into ``RankGraph.meta`` by the
reader.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.graph import EdgeKind, RankGraph
from ettools.schema import et_def_pb2 as pb

from .attributes import attr_message, attr_value
from .times import included_stream_gap

DEFAULT_VERSION = "0.0.4"


def metadata_to_dict(gm: Any) -> dict[str, Any]:
    """``GlobalMetadata`` as ``{"version": str, "attr": [(name, kind, value), ...]}``."""
    return {"version": gm.version, "attr": [(a.name, *attr_value(a)) for a in gm.attr]}


def metadata_message(meta: dict[str, Any] | None, strict: bool) -> Any:
    """The ``GlobalMetadata`` to write: the source's (version and attributes) when known."""
    gm = pb.GlobalMetadata()
    if meta:
        gm.version = meta.get("version", "") or ("" if not strict else DEFAULT_VERSION)
        for name, kind, value in meta.get("attr", ()):
            gm.attr.append(attr_message(name, kind, value))
    else:
        gm.version = DEFAULT_VERSION
    if gm.ByteSize() == 0:  # a zero-length frame would read as end of stream
        gm.version = DEFAULT_VERSION
    return gm


# GlobalMetadata attributes ettools writes and reads back into ``RankGraph.meta`` (name -> meta key):
# whether the node durations are estimates (a synthesizer's) and for which device, the synthesizer's
# peak memory of the rank, which ranks a partial write holds ("0-63,100") and the rank's FLOPs per
# iteration under the model-FLOPs convention (the MFU numerator; a double: it can pass 2^63).
SYNTH_META_ATTRS: dict[str, tuple[str, str]] = {
    "ettools_durations": ("durations", "string_val"),
    "ettools_estimated_for": ("estimated_for", "string_val"),
    "ettools_peak_memory_bytes": ("peak_memory_bytes", "int64_val"),
    "ettools_ranks_written": ("ranks_written", "string_val"),
    "ettools_model_flops": ("model_flops", "double_val"),
    "ettools_emulated_gpu": ("emulated_gpu", "string_val"),
}


def synth_metadata(meta: dict[str, Any], version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """A ``chakra_metadata`` dict carrying the :data:`SYNTH_META_ATTRS` present in ``meta``."""
    attrs = []
    for name, (key, kind) in SYNTH_META_ATTRS.items():
        v = meta.get(key)
        if v is not None:
            attrs.append((name, kind, int(v) if kind == "int64_val" else float(v) if kind == "double_val" else str(v)))
    return {"version": version, "attr": attrs}


def _apply_synth_metadata(g: RankGraph) -> None:
    """Copy the :data:`SYNTH_META_ATTRS` of the file's GlobalMetadata into ``g.meta``."""
    md = g.meta.get("chakra_metadata") or {}
    for name, _kind, value in md.get("attr", ()):
        spec = SYNTH_META_ATTRS.get(name)
        if spec is not None and value is not None:
            g.meta[spec[0]] = value


# GlobalMetadata attributes (an ettools extension; ASTRA-sim ignores GlobalMetadata attributes):
STEP_NAMES_ATTR = "ettools_step_names"  # string_list: ProfilerStep names, in order
STEP_START_ATTR = "ettools_step_start_us"  # double_list: their starts, on the file's start_time clock
STEP_END_ATTR = "ettools_step_end_us"  # double_list: their ends
STREAM_GAP_ATTR = "ettools_stream_gap_us"  # double_val: per-op device gap left out of duration_micros
LAUNCH_NAMES_ATTR = "ettools_launch_typical_names"  # string_list: launch calls (runtime call names)
LAUNCH_US_ATTR = "ettools_launch_typical_us"  # double_list: their median unblocked duration
LAUNCH_DEPTH_ATTR = "ettools_launch_queue_depth"  # int64_val: the launch queue depth the trace showed
RANK_CLOCK_ATTR = "ettools_rank_clock"  # string_val: start_time_micros of all ranks on one clock ("common",
# "collectives") or each rank's own ("none"), as the Kineto reader placed them (rank skew)
# A rank file that is a stamped copy (:mod:`ettools.converters.symbolic.write`): the digest of what it
# shares with every file of its structure (all but its group keys, and its peers relative to its own
# rank), and its group key per slot, in the order the structure's slots were numbered. Two files
# with one digest differ only in those keys and by a shift of their peers: a reader may build one
# from the other and this header (:func:`.reader.read_chakra` with ``trust_structure``).
STRUCTURE_ATTR = "ettools_structure"  # string_val: hex digest
SLOT_GROUPS_ATTR = "ettools_slot_groups"  # string_val: group keys, comma-separated, fixed width
STRUCTURE_META = "structure"  # RankGraph.meta keys of the two, read back
SLOT_GROUPS_META = "slot_groups"
ETTOOLS_META_ATTRS = frozenset({STEP_NAMES_ATTR, STEP_START_ATTR, STEP_END_ATTR, STREAM_GAP_ATTR,
                                LAUNCH_NAMES_ATTR, LAUNCH_US_ATTR, LAUNCH_DEPTH_ATTR, RANK_CLOCK_ATTR,
                                STRUCTURE_ATTR, SLOT_GROUPS_ATTR})
STREAM_GAP_META = "chakra_stream_gap_us"  # RankGraph.meta key of the gap read back
LAUNCH_TYPICAL_META = "launch_typical_us"  # RankGraph.meta: {launch call name: µs} (replay's launch queue)


def restore_launch_edges(g: RankGraph) -> RankGraph:
    """In a file ettools wrote from a measured trace (its GlobalMetadata has the launch attributes),
    a data dependency of a device node on a host node is the launch: give it back its kind."""
    if LAUNCH_TYPICAL_META not in g.meta or not len(g.dep_id):
        return g
    src, dst, kind = g.edge_rows()
    ok = src >= 0
    launch = ok & (kind == EdgeKind.DATA)
    launch[ok] &= (g.is_cpu_op[src[ok]] == 1) & (g.is_cpu_op[dst[ok]] == 0)
    if not launch.any():
        return g
    # edge_rows lists edges in stored (owner-major) order, the order of dep_kind
    out = g.replace()
    out.dep_kind = np.where(launch, np.uint8(EdgeKind.LAUNCH), g.dep_kind).astype(g.dep_kind.dtype)
    return out


def ettools_metadata_attrs(g: RankGraph) -> list[tuple[str, str, Any]]:
    """The ettools GlobalMetadata attributes of a rank: its ProfilerSteps and its stream gap."""
    out: list[tuple[str, str, Any]] = []
    steps = g.meta.get("steps") or []
    if steps:
        out.append((STEP_NAMES_ATTR, "string_list", [str(s[0]) for s in steps]))
        out.append((STEP_START_ATTR, "double_list", [float(s[1]) for s in steps]))
        out.append((STEP_END_ATTR, "double_list", [float(s[2]) for s in steps]))
    gap = included_stream_gap(g) or float(g.meta.get(STREAM_GAP_META) or 0.0)
    if gap > 0:
        out.append((STREAM_GAP_ATTR, "double_val", gap))
    typical = g.meta.get(LAUNCH_TYPICAL_META)
    if isinstance(typical, dict):
        names = sorted(typical)
        out.append((LAUNCH_NAMES_ATTR, "string_list", names))
        out.append((LAUNCH_US_ATTR, "double_list", [float(typical[k]) for k in names]))
        depth = g.meta.get("launch_queue_depth")
        if depth:
            out.append((LAUNCH_DEPTH_ATTR, "int64_val", int(depth)))
        clock = g.meta.get("rank_clock")
        if clock:
            out.append((RANK_CLOCK_ATTR, "string_val", str(clock)))
    # a rewrite's durations (a synthesizer's "estimated" travels in its own metadata)
    kept = {a[0] for a in (metadata_for(g) or {}).get("attr", ())}
    if str(g.meta.get("durations", "")) in ("rewritten", "modelled") and "ettools_durations" not in kept:
        out.append(("ettools_durations", "string_val", str(g.meta["durations"])))
    if g.meta.get("emulated_gpu") and "ettools_emulated_gpu" not in kept:
        out.append(("ettools_emulated_gpu", "string_val", str(g.meta["emulated_gpu"])))
    return out


def take_ettools_metadata(md: dict[str, Any]) -> dict[str, Any]:
    """Reader side of :func:`ettools_metadata_attrs`: removes the ettools attributes from a read
    GlobalMetadata dict (so a rewrite does not repeat them) and returns the rank meta entries
    they stand for (``steps``, :data:`STREAM_GAP_META`). Malformed ones are left in place."""
    attrs = md.get("attr") or []
    by_name = {name: (kind, value) for name, kind, value in attrs if name in ETTOOLS_META_ATTRS}
    if not by_name:
        return {}
    out: dict[str, Any] = {}
    used: set[str] = set()
    names, starts, ends = (by_name.get(a) for a in (STEP_NAMES_ATTR, STEP_START_ATTR, STEP_END_ATTR))
    if (names and starts and ends and names[0] == "string_list" and starts[0] == ends[0] == "double_list"
            and len(names[1]) == len(starts[1]) == len(ends[1])):
        # on the file's whole-µs clock: a step holds the nodes whose start_time_micros falls in it
        # (its first slice starts at the step's start, which rounds like the step's own start)
        out["steps"] = [(str(nm), float(np.rint(s)), float(np.rint(e)))
                        for nm, s, e in zip(names[1], starts[1], ends[1])]
        used |= {STEP_NAMES_ATTR, STEP_START_ATTR, STEP_END_ATTR}
    gap = by_name.get(STREAM_GAP_ATTR)
    if gap and gap[0] == "double_val" and np.isfinite(gap[1]) and gap[1] > 0:
        out[STREAM_GAP_META] = float(gap[1])
        used.add(STREAM_GAP_ATTR)
    lnames, lus = by_name.get(LAUNCH_NAMES_ATTR), by_name.get(LAUNCH_US_ATTR)
    if (lnames and lus and lnames[0] == "string_list" and lus[0] == "double_list"
            and len(lnames[1]) == len(lus[1])):
        out[LAUNCH_TYPICAL_META] = {str(k): float(v) for k, v in zip(lnames[1], lus[1])}
        used |= {LAUNCH_NAMES_ATTR, LAUNCH_US_ATTR}
        depth = by_name.get(LAUNCH_DEPTH_ATTR)
        if depth and depth[0] == "int64_val" and depth[1] > 0:
            out["launch_queue_depth"] = int(depth[1])
            used.add(LAUNCH_DEPTH_ATTR)
        clock = by_name.get(RANK_CLOCK_ATTR)
        if clock and clock[0] == "string_val":
            out["rank_clock"] = str(clock[1])
            used.add(RANK_CLOCK_ATTR)
    digest, slots = by_name.get(STRUCTURE_ATTR), by_name.get(SLOT_GROUPS_ATTR)
    if digest and slots and digest[0] == slots[0] == "string_val":
        # taken out, never written back: a rewrite of this graph is no longer the digest's structure
        out[STRUCTURE_META] = str(digest[1])
        out[SLOT_GROUPS_META] = str(slots[1]).split(",") if slots[1] else []
        used |= {STRUCTURE_ATTR, SLOT_GROUPS_ATTR}
    md["attr"] = [a for a in attrs if a[0] not in used]
    return out


def metadata_for(g: RankGraph) -> dict[str, Any] | None:
    """The Chakra GlobalMetadata kept on a rank graph, if it was read from Chakra."""
    return g.meta.get("chakra_metadata")
