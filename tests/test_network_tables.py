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
    return float(r["size"]) / (float(r["time_stats.send_recv.min"]) * 1e-3) / 1e9  # the fits' statistic


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


@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared/data/vidur_profiling not present")
def test_shipped_fits_time_a_size_by_its_fastest_repetition():
    """Vidur's DGX H100 2-GPU all-reduce rows below 128 KB are bimodal (a fast mode and one ~30 µs
    above it); the shipped fit follows the fast repetitions, not the medians. Both modes are
    recomputed here from the raw CSV."""
    import statistics

    rows = [r for r in csv.DictReader((VIDUR / "h100_dgx" / "all_reduce.csv").open())
            if r["num_workers"] == "2" and r["devices_per_node"] == "2" and int(r["size"]) < 128 * 1024]
    fast = statistics.median(float(r["time_stats.all_reduce.min"]) * 1e3 for r in rows)
    typical = statistics.median(float(r["time_stats.all_reduce.median"]) * 1e3 for r in rows)
    assert typical > 3 * fast  # the two modes (µs): ~8 and ~35
    fit = shipped_network_fit("H100")
    ar = int(CollectiveType.ALL_REDUCE)
    for nbytes in (16 * 1024, 32 * 1024):
        t = fit.collective_time(ar, nbytes, (0, 1)) / 1e3  # ns -> µs
        assert abs(t - fast) < abs(t - typical), (nbytes, t, fast, typical)
    assert "fastest repetition" in fit.fitted_on


@pytest.mark.skipif(not VIDUR.is_dir(), reason="../shared/data/vidur_profiling not present")
def test_calibrate_tables_statistic_option(tmp_path):
    """``calibrate --network TABLES --statistic min`` fits each size's fastest repetition (the
    shipped fits' choice); the default stays the median; the option alone is refused (exit 2)."""
    from click.testing import CliRunner

    from ettools.cli import main

    ar = int(CollectiveType.ALL_REDUCE)
    times = {}
    for stat in ("min", None):
        out = tmp_path / f"{stat}.json"
        args = ["calibrate", "--network", str(VIDUR / "h100_dgx"), "-o", str(out), "-q"]
        res = CliRunner().invoke(main, args + (["--statistic", stat] if stat else []))
        assert res.exit_code == 0, res.output
        fit = CommFit.from_dict(json.loads(out.read_text()), out)
        assert f"the {stat or 'median'} of its repetitions" in fit.fitted_on
        times[stat] = fit.collective_time(ar, 32 * 1024, (0, 1))
    assert times["min"] < times[None]
    res = CliRunner().invoke(main, ["calibrate", str(VIDUR / "h100_dgx"), "--statistic", "min", "-o",
                                    str(tmp_path / "x.json"), "-q"])
    assert res.exit_code == 2 and "--statistic" in res.output and not (tmp_path / "x.json").exists()
