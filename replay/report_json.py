"""A replay's report for programs: the ``--json`` object, and the replayed timeline as Chrome
trace JSON (mixed into :class:`.report.ReplayResult`, whose measures they read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ettools.graph import Trace
from ettools.io import atomic_write


class ReplayJson:
    """The machine-readable outputs of :class:`.report.ReplayResult` (a mixin: every measure it
    writes is the result's own)."""

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object (see the issue's contract; extra keys are documented here)."""
        ranks = self.ranks
        out: dict[str, Any] = {"step_time_us": self.step_time_us}
        m = self.measured_step_time_us
        if m is not None and (self.retimed or self.rewritten or self.modelled):
            # the measured step is the source GPU's, or the source plan's, or an emulated capture's
            # modelled one: no error against it here
            out["source_measured_step_time_us" if not self.modelled else "source_modelled_step_time_us"] = m
            if self.rewritten:
                out["durations"] = "rewritten"
            elif self.modelled:
                out["durations"] = "modelled"
                out["emulated_gpu"] = self.modelled
        elif m is not None:
            out["measured_step_time_us"] = m
            out["error_pct"] = 100.0 * (self.step_time_us - m) / m if m else None
        if self.options.get("retiming"):
            out["retiming"] = self.options["retiming"]
        eff = self.what_if_effect()
        if eff is not None:
            out["what_if"] = eff
        d = self.device_bound_step_us()
        if d is not None:
            # the same steps between device-activity boundaries (see _device_bound_steps): measured
            # (on the source GPU, when re-timed) and replayed
            out["measured_device_bound_step_time_us"] = d
            out["device_bound_step_time_us"] = self.device_bound_step_us(replayed=True)
        out.update({
            "timing": self.options.get("timing"),
            "time_by_source_us": self.time_by_source_us,
            "kernel_gap": self.kernel_gap,
            # compute time contention with transfers added (modelled ops only; over every rank)
            "contention_us": self.contention_totals()[0],
            "span_us": self.span_us,
            "hardware": self.hardware.label,
            "hardware_detected": self.hardware.detected,
            "network": self.options.get("network_source"),
            "network_fitted_on": self.options.get("network_fitted_on"),
            "symmetric": bool(self.options.get("symmetric")),
            "simulated_ranks": len(self.built.sim_ranks),
            # rank files built from a file of the same structure digest and their own header
            "ranks_from_headers": int(self.trace.meta.extra.get("ranks_from_headers", 0) or 0),
            "nodes_simulated": int(self.built.program.n),
            "comm_instances": len(self.built.program.instances),
            "comm_local": int(self.built.local_comm),
            "kept_measured": self.measured_kept(),
            "rank_skew_us": self.rank_skew_us,
            "align_ranks": bool(self.options.get("align_ranks")),
            "rank_clock": self.trace.meta.extra.get("rank_clock"),
            "seconds": {k: round(v, 4) for k, v in self.timings.items()},
            "ranks": {str(r): rr.to_dict() for r, rr in ranks.items()},
            "critical_path": self.critical_path(),
        })
        return out

    def json_bytes(self) -> bytes:
        """:meth:`to_json` serialized (deterministic key order, NaN as null)."""
        return orjson.dumps(_clean(self.to_json()), option=orjson.OPT_INDENT_2)

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`to_json` atomically."""
        path = Path(path)
        with atomic_write(path) as f:
            f.write(self.json_bytes())
        return path

    def write_timeline(self, path: str | Path) -> Path:
        """Per-rank replayed timeline as Chrome trace JSON (Perfetto), one process per simulated rank."""
        from ettools.converters.chrome import write_chrome

        graphs = {}
        for r in self.built.sim_ranks:
            g = self.built.preps[r].graph
            st, en = self.replayed_times(r)
            graphs[r] = g.replace(start=st, dur=en - st)
        tr = Trace(self.trace.meta, graphs, self.trace.strings)
        return write_chrome(tr, Path(path), flows=True)

def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        return _clean(x.item())
    return x
