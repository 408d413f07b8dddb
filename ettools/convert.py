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


# formats whose files are dependency graphs a simulator runs (ASTRA-sim): a cycle never finishes
GRAPH_OUTPUTS = ("chakra", "chakra-json", "astrasim-json")


def repair_for_output(loaded: Loaded, to: str, allow_defects: bool = False) -> Trace:
    """The trace to write as ``to``: dangling and self-dependencies dropped, cycles refused.

    Only for a source whose dependencies are written in the file (Chakra, Chakra JSON, ASTRA-sim
    JSON, PyTorch ET) and an output that is a dependency graph (:data:`GRAPH_OUTPUTS`); other
    pairs get ``loaded.trace`` as it is. What was dropped is said in ``loaded.notes`` (one line per
    kind, with its count, replacing the reader's note of that kind). A cycle through 2+ nodes has no
    sound repair: :class:`TraceError` naming the first, unless ``allow_defects``, which keeps the
    cycles and says that ASTRA-sim will not finish the output.
    """
    from ettools.formats import _EXPLICIT_DEPS
    from ettools.repair import find_cycles, repair_trace

    if to not in GRAPH_OUTPUTS or loaded.format not in _EXPLICIT_DEPS:
        return loaded.trace
    trace, rep = repair_trace(loaded.trace)
    cycles = find_cycles(trace)
    if cycles and not allow_defects:
        more = f" (and {len(cycles) - 1:,} more cycles)" if len(cycles) > 1 else ""
        raise TraceError(loaded.files[0] if loaded.files else Path(loaded.format),
                         f"cannot write {to}: {cycles[0]}{more}; ASTRA-sim would wait on it forever, so "
                         "the output would not run (a cycle has no sound repair; --allow-defects writes it)")
    for kind in ("dangling_dependencies", "self_dependencies", "dependency_cycles"):
        loaded.withdraw_defect(kind)
    if rep.dangling:
        loaded.notes.append(f"dropped {rep.dangling:,} dangling dependencies (node ids not in the trace)")
    if rep.self_deps:
        loaded.notes.append(f"dropped {rep.self_deps:,} self-dependencies (a node depending on itself)")
    if cycles:
        loaded.notes.append(f"kept {len(cycles):,} dependency cycle(s) of 2+ nodes (--allow-defects): ASTRA-sim "
                            f"will not finish this trace; first: {cycles[0]}")
    return trace


def convert_trace(loaded: Loaded, outdir: Path, to: str, name: str = "trace",
                  allow_defects: bool = False) -> list[Path]:
    """Write ``loaded.trace`` to ``outdir`` in format ``to``; returns the files written.

    A Chakra source written back to Chakra is copied faithfully, less what
    :func:`repair_for_output` repairs (dangling and self-dependencies); a dependency cycle is
    refused before anything is written unless ``allow_defects``. Anything ettools built itself goes
    through the strict writers, which never emit METADATA/INVALID nodes, dangling dependencies or
    comm nodes without their attributes.
    """
    trace = repair_for_output(loaded, to, allow_defects)
    faithful = loaded.format in ("chakra", "chakra-json") and to in ("chakra", "chakra-json")
    try:
        if to in GRAPH_OUTPUTS and not faithful:
            trace = replayable_output(trace)  # a ValueError: a cycle kept by allow_defects
            trace, demoted = demote_incomplete_comm(trace)
            if demoted:
                loaded.withdraw_defect("untyped_comm")
                loaded.notes.append(
                    f"{demoted} collective(s) without comm_type/comm_size/group in the source were "
                    "written as COMP nodes (their duration kept, attribute orig_type)"
                )
        if to == "chakra":
            from ettools.converters.chakra.writer import write_chakra

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
