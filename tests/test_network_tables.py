"""Shipped network fits use a measured table's cross-machine rows only where they can be the preset's
scale-out fabric (replay/data/make_network_fits.py): Vidur's A100 tables cross machines at a third of
the DGX A100's HDR line rate, so an A100 group across machines takes the preset's links; H100's reach
most of a DGX H100's NDR line rate and stay fitted.

The rates are recomputed here from the raw CSVs, independently of the fitting code.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ettools.graph import CollectiveType
from ettools.replay import compute as cm
from ettools.replay.netfit import CommFit, shipped_network_fit
from ettools.replay.network import _link_network, default_network

ROOT = Path(__file__).resolve().parents[1]
VIDUR = ROOT.parent / "shared" / "data" / "vidur_profiling" / "network"
PRESETS = json.loads((ROOT / "replay" / "hardware" / "presets.json").read_text())


def _largest_cross_machine_send_recv(folder: str) -> float:
    """GB/s of the largest send/recv between two machines in a Vidur table (size in bytes, ms)."""
    rows = [r for r in csv.DictReader((VIDUR / folder / "send_recv.csv").open()) if r["devices_per_node"] == "1"]
    r = max(rows, key=lambda r: float(r["size"]))
    return float(r["size"]) / (float(r["time_stats.send_recv.median"]) * 1e-3) / 1e9


@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared/data/vidur_profiling not present")
def test_cross_machine_rows_kept_only_where_they_can_be_the_presets_fabric():
    a100 = _largest_cross_machine_send_recv("a100_dgx")
    h100 = _largest_cross_machine_send_recv("h100_dgx")
    a_line, h_line = (PRESETS[k]["network"]["scale_out_gbps"] for k in ("A100", "H100"))
    assert a100 < 0.5 * a_line < h_line * 0.5 < h100  # 7.8 of 25 GB/s; 35.9 of 50 GB/s
    fa, fh = shipped_network_fit("A100"), shipped_network_fit("H100")
    assert not fa.by_kind_inter and all(k.split()[-1] == "1" for k in fa.curves)
    assert "rows within one machine only" in fa.fitted_on and f"{a100:.1f} GB/s" in fa.fitted_on
    assert "SEND_RECV" in fh.by_kind_inter and any(k.split()[-1] == "2" for k in fh.curves)


def test_an_a100_group_across_machines_takes_the_presets_links():
    hw = cm.load_hardware("A100", 32)
    net = default_network(32, hw)
    links = _link_network(32, hw)
    assert isinstance(net, CommFit)
    members = tuple(range(0, 32, 8))  # one GPU on each of 4 machines
    ar = int(CollectiveType.ALL_REDUCE)
    assert net.collective_time(ar, 1 << 30, members) == pytest.approx(links.collective_time(ar, 1 << 30, members))
    assert net.send_time(0, 8, 1 << 26) == pytest.approx(links.send_time(0, 8, 1 << 26))
    # within a machine the measured tables answer, not the links
    inside = tuple(range(8))
    assert net.collective_time(ar, 1 << 26, inside) != pytest.approx(links.collective_time(ar, 1 << 26, inside))
