"""Writing a trace as Chakra files: one ``.et`` per rank and ``comm_group.json``, all or none,
in ASTRA-sim's forms when strict (:func:`write_chakra`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ettools.converters import chakra_wire as w
from ettools.graph import CollectiveType, Trace
from ettools.io import OutputSet
from ettools.progress import progress

from .astrasim import (
    ASTRASIM_LOWERING,
    astrasim_collective_form,
    astrasim_end_form,
    astrasim_host_form,
    astrasim_release_form,
    astrasim_warnings,
)
from .encoder import encode_rank
from .encodings import _StringField
from .paths import COMM_GROUP_FILE, comm_group_json, group_keys
from .shared import _SharedEncodings
from .strict import WriteStats

log = logging.getLogger(__name__)

def write_chakra(
    trace: Trace,
    outdir: Path,
    name: str = "trace",
    strict: bool = True,
    ranks: list[int] | None = None,
    report: dict[str, int] | None = None,
) -> list[Path]:
    """Write ``outdir/<name>.<rank>.et`` per rank and ``outdir/comm_group.json``; returns the paths.

    All files appear or none (temporaries renamed at the end). ``strict`` (the default, for
    everything ettools builds) applies the guarantees in the package docstring and raises
    ``ValueError`` naming the rank and node that breaks them; ``strict=False`` writes a Chakra
    source faithfully. ``ranks`` limits the ranks written. ``report``, if given, receives the
    counts of :class:`WriteStats`.
    """
    outdir = Path(outdir)
    keys = group_keys(trace.meta, strict)
    stats = WriteStats()
    selected = trace.ranks if ranks is None else sorted(ranks)
    missing = [r for r in selected if r not in trace.graphs]
    if missing:
        raise ValueError(f"ranks not in the trace: {missing}")
    if strict:
        trace = astrasim_release_form(astrasim_host_form(trace, selected), selected)
        trace = astrasim_end_form(trace, selected)
        trace, lowered = astrasim_collective_form(trace, selected)
        if lowered:
            log.info("Chakra writer: collectives ASTRA-sim does not simulate written as the ones ettools "
                     "times them as: %s", ", ".join(f"{k} -> {CollectiveType(ASTRASIM_LOWERING[int(CollectiveType[k])]).name}"
                                                    f" ({v} node(s))" for k, v in sorted(lowered.items())))
        for line in astrasim_warnings(trace, selected):
            log.warning("%s", line)
    with OutputSet(clear_stale=ranks is None) as out:  # a partial write keeps the other ranks
        name_field = _StringField(trace.strings, w.tag(2, w.WT_LEN))
        # Ranks stamped out from one graph (shared arrays) encode to the same bytes: encode once.
        shared = _SharedEncodings(trace, selected, keys, strict)
        for r in progress(selected, "writing Chakra", total=len(selected), unit="rank"):
            g = trace.graphs[r]
            nf = name_field if g.strings is trace.strings else None  # the shared cache fits one table
            data = shared.lookup(g, stats)
            if data is None and shared.wanted(g):
                data = shared.encode(g, keys, stats, nf)
            if data is not None:  # written by the set's thread while the next rank is prepared
                out.submit(outdir / f"{name}.{r}.et", data, release=shared.recycle)
                continue
            with out.open(outdir / f"{name}.{r}.et", compress=False) as f:
                for part in encode_rank(g, trace.meta, keys, strict, stats, nf):
                    f.write(part)
        out.write_file(outdir / COMM_GROUP_FILE, comm_group_json(trace.meta, keys))
    paths = out.paths
    _log_stats(stats)
    if report is not None:
        report.update(stats.as_dict())
    return paths


def _log_stats(stats: WriteStats) -> None:
    changed = {k: v for k, v in stats.as_dict().items() if k != "nodes" and v}
    if changed:
        log.info("Chakra writer: %s", ", ".join(f"{k}={v}" for k, v in changed.items()))
