"""Regenerate the shipped network fits ``replay/data/network/<preset>.json`` from Vidur's measured
NCCL tables (``shared/data/vidur_profiling/network/<gpu>_dgx``: all-reduce and send/recv on DGX
A100/H100). Run: python replay/data/make_network_fits.py [VIDUR_NETWORK_DIR]

Each size is timed by its fastest repetition (``read_nccl_tables(statistic="min")``): the tables'
medians carry their harness's launch skew between ranks, a second mode ~30 µs above the first at
every size on the DGX H100 2-GPU rows, which the replay adds itself (each rank arrives when its own
work is done). A table describes the fabric it was measured on. Vidur's tables state their machines (DGX A100,
DGX H100: NVSwitch inside) but not what connected the machines of their multi-machine runs. Those
rows are fitted only when they can be the preset's scale-out fabric: the largest cross-machine
message reaches at least half the line rate the preset states per GPU (:data:`MIN_LINE_FRACTION`:
NCCL moves large messages at 70–90 % of line rate on a healthy fabric). Otherwise only the rows
within one machine are fitted, a group across machines takes the preset's scale-out links, and the
fit's ``source`` says so with the measured figure.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from ettools.replay.netfit import SEND_RECV, fit_nccl_tables, read_nccl_tables, ring_shape

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parents[1].parent / "shared" / "data" / "vidur_profiling" / "network"
TABLES = {"A100": "a100_dgx", "H100": "h100_dgx"}
PRESETS = HERE.parent / "hardware" / "presets.json"
MIN_LINE_FRACTION = 0.5


def cross_machine_rate(tab) -> tuple[float, str] | None:
    """GB/s per GPU of the tables' largest message across machines (a send/recv, else an all-reduce
    with one GPU per machine, as bus bandwidth) and what it was; None without such rows."""
    for kind, sel in ((SEND_RECV, (tab.kind == SEND_RECV) & (tab.nodes > 1)),
                      ("ALL_REDUCE", (tab.kind == "ALL_REDUCE") & (tab.nodes > 1) & (tab.n == tab.nodes))):
        if sel.any():
            i = np.flatnonzero(sel)[np.argmax(tab.nbytes[sel])]
            _steps, vol = ring_shape(kind, int(tab.n[i]), float(tab.nbytes[i]))
            what = "send/recv" if kind == SEND_RECV else f"{int(tab.n[i])}-GPU all-reduce"
            return vol / (tab.t_us[i] * 1e-6) / 1e9, f"{what} of {tab.nbytes[i] / 2**20:.0f} MiB"
    return None


def main(root: Path = DEFAULT) -> None:
    """Fit and write one file per preset."""
    presets = json.loads(PRESETS.read_text())
    for preset, sub in TABLES.items():
        tab = read_nccl_tables(root / sub, statistic="min")
        source = (f"vidur_profiling/network/{sub} (all_reduce.csv, send_recv.csv; microsoft/vidur, MIT; each size's "
                  "fastest repetition)")
        keep = None
        line = float(presets[preset]["network"]["scale_out_gbps"])
        rate = cross_machine_rate(tab)
        if rate is not None and rate[0] < MIN_LINE_FRACTION * line:
            keep = tab.nodes == 1
            source += (f"; rows within one machine only: across machines the tables' {rate[1]} moves "
                       f"{rate[0]:.1f} GB/s per GPU, {100 * rate[0] / line:.0f} % of the {line:g} GB/s per GPU the "
                       f"preset's scale-out states (the tables do not state their fabric): groups across machines "
                       f"take the preset's links")
        elif rate is not None:
            source += (f"; across machines the tables' {rate[1]} moves {rate[0]:.1f} GB/s per GPU, "
                       f"{100 * rate[0] / line:.0f} % of the preset's {line:g} GB/s scale-out: fitted")
        fit = fit_nccl_tables(tab, source=source, keep=keep)
        out = fit.save(HERE / "network" / f"{preset}.json")
        print(out, len(fit.curves), "curves;", source)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
