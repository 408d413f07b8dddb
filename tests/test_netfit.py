"""Network fit (``ettools calibrate --network``): samples from real captures, recovery of known
costs, the replay using it, the file and its errors."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.formats import load_trace
from ettools.graph import CollectiveType, GraphBuilder, NodeType, ProcessGroup, new_trace
from ettools.replay import CommFit, fit_network, load_network, replay_trace
from ettools.replay.netfit import comm_samples, ring_shape
from ettools.scaler import scale_trace

ALPHA, BETA = 40.0, 0.02  # µs per step, µs per byte: the costs the synthetic trace is built with


def _trace_with_costs(extra_wait_us: float = 250.0):
    """Two ranks running ALL_GATHER and REDUCE_SCATTER at four sizes and a send/recv per size; each
    op lasts exactly ``ALPHA·steps + BETA·volume`` on the rank that arrived last and ``extra_wait_us``
    longer on the other (which waited)."""
    trace, strings = new_trace("synthetic", world_size=2)
    trace.meta.add_group(ProcessGroup("g", (0, 1)))
    builders = {r: GraphBuilder(r, strings) for r in (0, 1)}
    t = 0.0
    for k, nbytes in enumerate((1024, 8192, 65536, 262144)):
        for ct, kind in ((CollectiveType.ALL_GATHER, "ALL_GATHER"), (CollectiveType.REDUCE_SCATTER, "REDUCE_SCATTER")):
            s, v = ring_shape(kind, 2, nbytes)
            d = ALPHA * s + BETA * v
            for r, b in builders.items():
                waited = extra_wait_us if (r + k) % 2 else 0.0
                b.add_node(f"{kind.lower()}_{k}", NodeType.COMM_COLL_NODE, start=t - waited, dur=d + waited,
                           comm_type=int(ct), comm_bytes=nbytes, comm_group="g")
            t += 1000.0
        d = ALPHA + BETA * nbytes
        builders[0].add_node(f"send_{k}", NodeType.COMM_SEND_NODE, start=t, dur=d + extra_wait_us,
                             comm_peer=1, comm_tag=k, comm_bytes=nbytes)
        builders[1].add_node(f"recv_{k}", NodeType.COMM_RECV_NODE, start=t, dur=d, comm_peer=0,
                             comm_tag=k, comm_bytes=nbytes)
        t += 1000.0
    for r, b in builders.items():
        trace.graphs[r] = b.build()
    return trace


def test_fit_recovers_the_costs_the_trace_was_built_with():
    fit = fit_network(_trace_with_costs())
    assert fit.samples == 12  # 8 collectives + 4 send/recv pairs
    for kind in ("ALL_GATHER", "REDUCE_SCATTER", "SEND_RECV"):
        p = fit.by_kind[kind]
        assert p["n"] == 4
        assert p["alpha_us"] == pytest.approx(ALPHA, rel=1e-6)
        assert p["beta_us_per_byte"] == pytest.approx(BETA, rel=1e-6)
    # the shape carries to a group size the trace did not have: ring all-gather on 8 ranks
    assert fit.collective_time(int(CollectiveType.ALL_GATHER), 4096, tuple(range(8))) == pytest.approx(
        1000.0 * (ALPHA * 7 + BETA * 7 * 4096))
    assert fit.send_time(3, 5, 100) == pytest.approx(1000.0 * (ALPHA + BETA * 100))
    assert fit.send_time(3, 3, 100) == 0.0


def test_kind_without_size_variety_predicts_its_mean():
    trace = _trace_with_costs()
    s = comm_samples(trace)
    # keep only the 64 KiB all-gathers (one size): its own fit must give back their mean cost
    keep = [i for i, (k, v) in enumerate(zip(s.kinds, s.volume)) if k != "ALL_GATHER" or v == 65536]
    for f in ("kinds", "steps", "volume", "time_us"):
        setattr(s, f, [getattr(s, f)[i] for i in keep])
    fit = CommFit.from_samples(s)
    assert fit.by_kind["ALL_GATHER"]["n"] == 1
    assert fit.predict_us("ALL_GATHER", 2, 65536) == pytest.approx(ALPHA + BETA * 65536, rel=1e-6)


def _gloo_spans(path, rank: int) -> list[float]:
    """Durations of one rank's gloo collective spans in time order, read with plain json."""
    ev = json.loads(gzip.open(path / f"rank{rank}.kineto.json.gz").read())["traceEvents"]
    names = ("gloo:all_gather", "gloo:all_reduce", "gloo:all_to_all", "gloo:reduce_scatter")
    spans = sorted((e["ts"], e["dur"]) for e in ev if e.get("ph") == "X" and e.get("name") in names)
    return [d for _, d in spans]


@pytest.mark.parametrize("scenario", ["tp_sp", "fsdp", "moe_ep"])
def test_samples_of_real_captures_are_the_shorter_member_span(sample_traces, scenario):
    path = sample_traces / scenario
    s = comm_samples(load_trace([path]).trace)
    d0, d1 = _gloo_spans(path, 0), _gloo_spans(path, 1)
    assert len(d0) == len(d1) == len(s)
    # the k-th collective of each rank is one instance; its transfer is the shorter of the two spans
    assert s.time_us == pytest.approx([min(a, b) for a, b in zip(d0, d1)])


def test_pipeline_capture_gives_send_recv_samples(sample_traces):
    s = comm_samples(load_trace([sample_traces / "pp_1f1b"]).trace)
    assert set(s.kinds) == {"SEND_RECV"}
    assert len(s) == 8  # 4 activations forward, 4 gradients back (2 stages, 4 micro-batches)
    assert all(v == 16384 for v in s.volume)


def test_replay_times_collectives_with_the_fit(sample_traces):
    single = load_trace([sample_traces / "single"]).trace
    rw = scale_trace(single, tp=2, sp=True)
    fit = fit_network(_trace_with_costs())
    res = replay_trace(rw, network=fit.to_dict())
    prog = res.built.program
    assert len(prog.instances) > 0
    # every instance lasts what the fit predicts for its type and bytes
    g = res.built.preps[0].graph
    rows = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    want = sorted(fit.collective_time(int(g.comm_type[r]), int(g.comm_bytes[r]), (0, 1)) / 1000.0 for r in rows)
    assert sorted(prog.inst_dur.tolist()) == pytest.approx(want)
    # slower collectives: a longer step
    slow = CommFit(fit.alpha_us * 10, fit.beta_us_per_byte * 10, fit.samples, dict(fit.by_kind))
    for p in slow.by_kind.values():
        p["alpha_us"] *= 10
        p["beta_us_per_byte"] *= 10
    assert replay_trace(rw, network=slow.to_dict()).step_time_us > res.step_time_us


def test_fit_file_round_trip_and_determinism(tmp_path, sample_traces):
    fit = fit_network(load_trace([sample_traces / "fsdp"]).trace)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    fit.save(a)
    fit_network(load_trace([sample_traces / "fsdp"]).trace).save(b)
    assert a.read_bytes() == b.read_bytes()
    back = load_network(a)
    assert isinstance(back, CommFit)
    for ct in (CollectiveType.ALL_GATHER, CollectiveType.REDUCE_SCATTER, CollectiveType.ALL_REDUCE):
        assert back.collective_time(int(ct), 50000, (0, 1)) == pytest.approx(fit.collective_time(int(ct), 50000, (0, 1)))


def test_cli_calibrate_network_and_replay(tmp_path, sample_traces):
    out = tmp_path / "net.json"
    r = CliRunner().invoke(main, ["calibrate", "--network", str(sample_traces / "tp_sp"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    raw = json.loads(out.read_text())
    assert raw["format"] == "ettools-network-fit" and raw["samples"] == 23
    assert sum(p["n"] for p in raw["by_kind"].values()) == 23
    r = CliRunner().invoke(main, ["replay", str(sample_traces / "tp_sp"), "--network", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["network"] == str(out)
    # the replay says what the fit was made from, as the fit file records it
    assert json.loads(r.output)["network_fitted_on"] == raw["source"] == str(sample_traces / "tp_sp")
    text = CliRunner().invoke(main, ["replay", str(sample_traces / "tp_sp"), "--network", str(out)]).output
    assert f"network {out} (fitted on {sample_traces / 'tp_sp'})" in text


def test_cli_errors(tmp_path, sample_traces):
    out = tmp_path / "net.json"
    r = CliRunner().invoke(main, ["calibrate", "--network", str(sample_traces / "single"), "-o", str(out)])
    assert r.exit_code == 2
    assert "needs a multi-rank capture" in r.output and str(sample_traces / "single") in r.output
    assert not out.exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "ettools-network-fit", "global": {"alpha_us": 1.0}}))
    r = CliRunner().invoke(main, ["replay", str(sample_traces / "tp_sp"), "--network", str(bad)])
    assert r.exit_code == 2 and "malformed network fit" in r.output and str(bad) in r.output
    assert len(r.output.strip().splitlines()) == 1
    good = tmp_path / "good.json"
    fit_network(_trace_with_costs()).save(good)
    r = CliRunner().invoke(main, ["replay", str(sample_traces / "tp_sp"), "--network", str(good), "--congestion"])
    assert r.exit_code == 2 and "congestion" in r.output


@pytest.mark.parametrize("preset, table", [("A100_40GB", "a100_dgx"), ("H200", "h100_dgx")])
def test_preset_on_a_measured_fabric_borrows_its_tables(preset, table):
    """A preset with the same network and GPU generation as one with measured NCCL tables (A100
    40 GB on the DGX A100's NVSwitch, H200 on the H100's HGX board) times an 8-GPU 64 MiB-class
    all-reduce within 10 % of the measured median read from the raw CSV; V100 has none and keeps
    the link model."""
    import csv
    from pathlib import Path

    from ettools.replay.compute import load_hardware
    from ettools.replay.network import Network, default_network

    d = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vidur_profiling" / "network" / table
    if not d.is_dir():
        pytest.skip("no vidur network tables")
    net = default_network(16, load_hardware(preset))
    assert isinstance(net, CommFit)
    with open(d / "all_reduce.csv") as f:
        big = max((r for r in csv.DictReader(f) if r["num_workers"] == "8" and r["devices_per_node"] == "8"),
                  key=lambda r: int(r["size"]))
    t_us = net.collective_time(int(CollectiveType.ALL_REDUCE), int(big["size"]), tuple(range(8))) / 1e3
    assert abs(t_us / (1e3 * float(big["time_stats.all_reduce.median"])) - 1) < 0.10
    assert isinstance(default_network(16, load_hardware("V100")), Network)


def test_measured_table_curves_never_fall_with_size():
    """A collective over the same GPUs takes no less time for more bytes: every curve fitted on
    Vidur's measured tables is non-decreasing, although the raw medians dip (three bimodal samples
    per size) — read from the CSV here, not from the fit."""
    import csv
    from pathlib import Path

    from ettools.replay.netfit import _curve_us, fit_nccl_tables, read_nccl_tables

    root = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vidur_profiling" / "network"
    if not root.is_dir():
        pytest.skip("no vidur network tables")
    with open(root / "h100_dgx" / "all_reduce.csv") as f:
        rows = sorted(((int(r["size"]), float(r["time_stats.all_reduce.median"])) for r in csv.DictReader(f)
                       if r["num_workers"] == "2"), key=lambda x: x[0])
    med = np.array([t for _, t in rows])
    assert (np.diff(med) < 0).any()  # the raw medians do fall with size somewhere
    for sub in sorted(p.name for p in root.iterdir() if p.is_dir()):
        fit = fit_nccl_tables(read_nccl_tables(root / sub))
        assert fit.curves, sub
        for key, c in fit.curves.items():
            sizes = np.geomspace(1, 2 ** 31, 200)
            t = np.array([_curve_us(c, s) for s in sizes])
            assert (np.diff(t) >= -1e-9).all(), (sub, key)


def test_curve_fit_keeps_a_rising_curve_and_flattens_a_dip():
    from ettools.replay.netfit import _curve_us, fit_curve

    sizes = 2.0 ** np.arange(10, 20)
    rising = 5.0 + sizes / 1e4
    c = fit_curve(sizes, rising)
    assert all(abs(_curve_us(c, s) / t - 1) < 1e-3 for s, t in zip(sizes, rising))
    dip = rising.copy()
    dip[5] = rising[5] / 4  # one size measured four times faster than its smaller neighbour
    c = fit_curve(sizes, dip)
    t = np.array([_curve_us(c, s) for s in sizes])
    assert (np.diff(t) >= -1e-9).all() and t[5] >= t[4] - 1e-9
