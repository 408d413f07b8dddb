"""Write a loaded trace in another format: the pipeline behind ``ettools convert``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ettools.errors import TraceError
from ettools.formats import Loaded
from ettools.graph import AttrColumn, NodeType, RankGraph, Trace


def demote_incomplete_comm(trace: Trace) -> tuple[Trace, int]:
    """Collectives a foreign file left without type, size or group become COMP nodes.

    A strict writer must not emit them (ASTRA-sim aborts on a collective without ``comm_type`` or
    ``comm_size``); replaying their recorded duration as compute keeps the timeline. The original
    type is kept in the attribute ``orig_type``. Returns the new trace and how many were demoted.
    """
    graphs = {}
    total = 0
    for r, g in trace.graphs.items():
        bad = (g.type == NodeType.COMM_COLL_NODE) & (
            (g.comm_type < 0) | (g.comm_bytes < 0) | (g.comm_group < 0)
        )
        if not bad.any():
            graphs[r] = g
            continue
        rows = np.flatnonzero(bad)
        h = g.replace(type=np.where(bad, np.uint8(NodeType.COMP_NODE), g.type))
        h.attrs["orig_type"] = AttrColumn("string_val", rows, ["COMM_COLL_NODE"] * len(rows))
        graphs[r] = h
        total += len(rows)
    return Trace(trace.meta, graphs, trace.strings), total


def replayable_output(trace: Trace) -> Trace:
    """The dependency graphs written to completion-semantics formats: those ``ettools replay`` runs.

    A rank with a measured host timeline (nesting, or a device-only trace's runtime calls) goes
    through the replay's own pass (:func:`ettools.replay.prepare.replayable_form`: host slices
    and idle gaps, waits, contradicted waits dropped, cross-thread waits guessed), so that a
    replay of the written file runs the graph a replay of the source runs. Ranks sharing every
    array are converted once; ranks differing only in group/peer columns get the first's result
    with their columns patched in. Other ranks are returned as they are.
    """
    from ettools.replay.prepare import _is_nested, _typical_launch_dur, replayable_form
    from ettools.replayable import replayable_trace

    cache: dict = {}

    def written_form(g: RankGraph) -> RankGraph:
        out, form = replayable_form(g, cache)
        if form == "kineto":
            # the replay's launch queue gives blocked launches the median unblocked duration
            # of their call, measured on the whole calls (which the output cuts at launch)
            out.meta["launch_typical_us"] = {g.strings[k]: v for k, v in _typical_launch_dur(g).items()}
            # the measured starts: the replay releases each rank at its first event (rank skew)
            out.meta["rank_clock"] = trace.meta.extra.get("rank_clock") or "none"
        return out

    return replayable_trace(trace, convert=written_form, needs=_is_nested)


def convert_trace(loaded: Loaded, outdir: Path, to: str, name: str = "trace") -> list[Path]:
    """Write ``loaded.trace`` to ``outdir`` in format ``to``; returns the files written.

    A Chakra source written back to Chakra is copied faithfully (its defects kept); anything
    ettools built itself goes through the strict writers, which never emit METADATA/INVALID
    nodes, dangling dependencies or comm nodes without their attributes.
    """
    trace = loaded.trace
    faithful = loaded.format in ("chakra", "chakra-json") and to in ("chakra", "chakra-json")
    if to in ("chakra", "chakra-json", "astrasim-json") and not faithful:
        trace = replayable_output(trace)
        trace, demoted = demote_incomplete_comm(trace)
        if demoted:
            loaded.notes.append(
                f"{demoted} collective(s) without comm_type/comm_size/group in the source were "
                "written as COMP nodes (their duration kept, attribute orig_type)"
            )
    cycles = loaded.problems.get("dependency_cycles", 0)
    if cycles and to == "astrasim-json":
        # a simulator given a cycle waits forever: never write one for it
        raise TraceError(loaded.files[0] if loaded.files else outdir,
                         f"cannot write {to}: the trace holds {cycles} dependency cycle(s) "
                         "(ettools info names the first)")
    try:
        if to == "chakra":
            from ettools.converters.chakra import write_chakra

            return write_chakra(trace, outdir, name, strict=not faithful)
        if to == "chakra-json":
            from ettools.converters.chakra_json import write_chakra_json

            return write_chakra_json(trace, outdir, name, strict=not faithful)
        if to == "astrasim-json":
            from ettools.converters.astrasim_json import write_astrasim_json

            return write_astrasim_json(trace, outdir, name)
        if to == "chrome":
            from ettools.converters.chrome import write_chrome

            return [write_chrome(trace, outdir / f"{name}.chrome.json")]
        if to == "triosim":
            from ettools.converters.triosim import write_triosim

            ranks = trace.ranks
            return write_triosim(trace, outdir, rank=int(np.min(ranks)) if ranks else 0)
    except ValueError as e:
        raise TraceError(loaded.files[0] if loaded.files else outdir, f"cannot write {to}: {e}") from None
    raise ValueError(f"unknown output format {to!r}")
