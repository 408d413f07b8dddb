"""Shared fixtures: where the real traces are, and the sample captures; the ``slow`` marker.

``python -m pytest -m "not slow"`` is the fast subset (under 2 minutes with two workers on the
project's 2-core machine, against about 7 for everything): it leaves out the test files below, which
took the most time in a ``--durations`` run of the whole suite, and the heaviest tests of the other
files (``SLOW_TESTS``), and still tests every package and every file not left out as a whole.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLE_TRACES = REPO / "sample_traces"
TESTS = Path(__file__).resolve().parent
FILE_SECONDS = TESTS / "file_seconds.json"  # written by ``pytest --write-file-seconds``

# test files (relative to tests/) marked ``slow``: the slowest of the suite, about nine tenths of its
# time: real and emulated captures, op-model fits, fuzzing, replays and conversions of every shared
# trace, the README's own commands, plan searches. Every package stays covered by the other files.
SLOW_FILES = frozenset({
    "test_hardening_readme.py", "fuzz/test_fuzz_bounded.py", "test_emulate.py", "test_compute_transfer.py",
    "test_capture.py", "test_compute_model.py", "test_compute_fidelity.py",
    "test_emulate_dtensor.py", "test_replay_retime.py", "test_search.py", "test_replay_selfreplay.py",
    "test_chakra_fidelity.py", "test_serve_search.py", "test_scale_gpu.py", "test_prescan_equivalence.py",
    "test_schema_compat.py", "test_replay_silent.py", "test_hardening_memory.py", "test_kineto_chunked.py",
    "test_scale_captures.py", "test_chakra_patched.py", "test_kineto_load_paths.py", "test_gpu_captures.py",
    "test_train_published.py", "test_cli.py", "test_classify.py", "test_replay_blocking.py",
    "test_attention_model.py", "test_kineto_forms.py", "test_pytorch_et_chunked.py", "test_synth_captures.py",
    "test_hardening_papercuts.py", "test_netfit.py", "test_replay_skew.py", "test_astrasim_real.py",
    "test_hardening_options.py", "test_synth_pipeline_finish.py",
})

# single slow tests of files whose other tests are quick (the quick ones keep their package and their
# file in the fast subset: test_emulate_host's --host-from refusal is the fast subset's emulated-capture
# test): the heaviest of a --durations run of the fast subset — loads of the largest shared traces
# (param_resnet's ET and Kineto), real gloo measurements, report rendering, GPT-3 synthesis, signals
# during large writes. A parametrized test is named by its function (all its cases) or by one case's
# full name, ``name[id]``.
SLOW_TESTS = frozenset({
    "test_emulate_host.py::test_python_events_and_top_level_ops_counted_as_the_profiler_records_them",
    "test_emulate_host.py::test_host_measured_on_other_models_predicts_a_host_bound_step",
    "test_validate.py::test_markdown_and_html_reports",
    "test_validate.py::test_self_validation_is_exact_on_shared_traces",
    "test_collbench.py::test_measured_gloo_tables_and_fit",
    # every test of the module fixture ``linked`` (four shared ET + Kineto pairs, param_resnet's among them)
    "test_link.py::test_linking_rate_and_host_matches",
    "test_link.py::test_kernel_parents_are_their_enclosing_ops",
    "test_link.py::test_param_linear_picks_the_iteration_the_et_recorded",
    "test_link.py::test_times_come_from_the_matched_kineto_op",
    "test_link.py::test_output_graph_is_sound",
    "test_link.py::test_param_resnet_pair_is_flagged_as_two_runs",
    "test_link.py::test_alignment_survives_missing_and_extra_ops",
    "test_link.py::test_report_string_and_dict",
    "test_chakra.py::test_json_round_trip_equals_binary_round_trip",
    "test_synth.py::test_table6_gpt3_5b_tp8_sp",
    "test_synth.py::test_every_preset_synthesizes_and_passes_the_checks",
    "test_replay_compute.py::test_calibrated_half_split_param_resnet",
    "test_replay_compute.py::test_calibrated_across_traces",
    "test_hardening_output.py::test_signal_during_a_large_write_leaves_nothing",
    "test_scale_units.py::test_rescale_a_pipeline_capture_keeps_pairs_matched",
    "test_serve.py::test_littles_law_in_steady_state",
    "test_serve_fit.py::test_cross_engine_prediction_error_is_reported",
    "test_replay_memory.py::test_sample_capture_memory_vs_measured",
    "test_replay_compute.py::test_fit_file_round_trip_and_calibrated_replay",
    "test_kineto.py::test_node_counts_per_category[et_kineto/param_resnet/kineto.json.gz]",
    "test_kineto.py::test_node_counts_per_category[et_kineto/param_linear/kineto.json.gz]",
    "test_serve_fit.py::test_fit_reproduces_its_own_iterations",
    "test_validate.py::test_device_unit_counts_every_kernel_copy_and_set_once",
    "test_serve_host.py::test_littles_law_holds_with_host_overhead",
    "test_serve.py::test_small_kv_cache_preempts_and_ttft_grows",
    "test_search_signals.py::test_sigterm_stops_search_and_its_workers[process-group]",
    "test_collate_checks.py::test_many_ranks_is_fast",
    "test_kineto.py::test_steps_selection",
    "test_kineto.py::test_graph_invariants[et_kineto/param_resnet/kineto.json.gz]",
    "test_kineto.py::test_graph_invariants[et_kineto/param_linear/kineto.json.gz]",
    "test_pytorch_et.py::test_truncated_gzip",
    # each reads every source with ast; test_core_imports_no_stage stays in the fast subset
    "test_import_graph.py::test_no_import_circles",
    "test_import_graph.py::test_the_graph_is_read",
    "test_hardware_type.py::test_no_signature_takes_the_hardware_as_a_dict",
    "test_validate.py::test_step_time_of_a_step_sliced_for_chakra_is_its_span",
    "test_kineto.py::test_node_counts_per_category[kineto/hta_fwdbwd_1rank]",
    "test_kineto.py::test_every_launched_op_has_launch_edge[et_kineto/param_resnet/kineto.json.gz]",
    "test_kineto.py::test_every_launched_op_has_launch_edge[et_kineto/param_linear/kineto.json.gz]",
    "test_serve.py::test_real_serving_iterations_recognised[sglang_qwen3_8b_mi300x/prefill_extend_bs15.json.gz]",
    *(f"{test}[{case}]" for test, cases in {
        # the multi-rank sample captures (PP, MoE EP, TP+SP) of tests run over every sample: the
        # single-process, DDP and FSDP cases stay in the fast subset
        "test_pytorch_et.py::test_sample_capture_et_files": (
            "moe_ep/rank1.et.json.gz", "pp_gpipe/rank0.et.json.gz", "pp_1f1b/rank0.et.json.gz", "tp_sp/rank0.et.json.gz"),
        "test_validate.py::test_self_validation_is_exact_on_every_sample": ("tp_sp", "moe_ep", "pp_gpipe", "pp_1f1b"),
        "test_validate.py::test_counting_rule_counts_each_operator_once": ("tp_sp", "moe_ep", "pp_gpipe", "pp_1f1b"),
        "test_link.py::test_sample_captures_rf_id_and_sequence_agree": ("tp_sp", "moe_ep", "pp_gpipe", "pp_1f1b"),
        "test_samples.py::test_one_captured_step_per_rank": ("tp_sp", "moe_ep", "pp_1f1b"),
    }.items() for case in cases),
})


def _slow_deselected(markexpr: str) -> bool:
    """True when ``-m markexpr`` deselects every ``slow`` test whatever its other marks: false for
    every assignment of the expression's other names with ``slow`` true (``"not slow"``, ``"not slow
    and foo"``; not ``"not slow or foo"``)."""
    if not markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression

        expr = Expression.compile(markexpr)
    except Exception:  # an expression pytest itself will report; collect as usual
        return False
    names = sorted(set(re.findall(r"[^\s()=,]+", markexpr)) - {"and", "or", "not", "slow"})
    if len(names) > 10:
        return False
    for values in itertools.product((False, True), repeat=len(names)):
        on = {"slow", *(n for n, v in zip(names, values) if v)}
        if expr.evaluate(lambda name, on=on, **kwargs: name in on):
            return False
    return True


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m "not slow"`` the slow files are not even imported: some collect their cases by
    reading every shared trace (seconds of CPU per xdist worker), which would weigh on the subset."""
    try:
        rel = collection_path.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None
    if rel in SLOW_FILES and _slow_deselected(config.getoption("markexpr", "") or ""):
        return True
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--write-file-seconds``: after a run, write each test file's seconds (setup, call and
    teardown of its tests, summed) into ``tests/file_seconds.json``, the order the files run in
    (files the run left out keep their seconds)."""
    parser.addoption("--write-file-seconds", action="store_true",
                     help="write each test file's seconds to tests/file_seconds.json (run order of the files)")


_SPENT: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add a test phase's seconds to its file's (on the controller under xdist, where every report
    arrives)."""
    path = report.nodeid.split("::")[0]
    rel = path[len("tests/"):] if path.startswith("tests/") else path
    _SPENT[rel] = _SPENT.get(rel, 0.0) + float(report.duration)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write ``file_seconds.json`` when asked (by the controller only, sorted keys, 0.1 s)."""
    config = session.config
    if config.getoption("write_file_seconds", False) and not hasattr(config, "workerinput") and _SPENT:
        merged = {**_file_seconds(), **{k: round(v, 1) for k, v in _SPENT.items()}}
        FILE_SECONDS.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def _file_seconds() -> dict[str, float]:
    """Seconds each test file took in one full run (``tests/file_seconds.json``; empty if absent)."""
    try:
        return {str(k): float(v) for k, v in json.loads(FILE_SECONDS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a file in ``SLOW_FILES``, and each test (or test case) in ``SLOW_TESTS``,
    ``slow`` (``-m "not slow"`` leaves them out); then order the files heaviest first.

    ``--dist loadfile`` hands whole files to the workers in collection order (the addopts turn off
    xdist's own order, most tests first, which put the few-test, minutes-long files last and left
    one worker running them alone). Heaviest first (the longest-processing-time rule) keeps both
    workers busy to the end. A file not in ``file_seconds.json`` (new since it was written) counts as
    the heaviest, so it can never be the one left running alone; the order within a file is kept."""
    seconds = _file_seconds()
    unknown = max(seconds.values(), default=0.0) + 1.0
    weight: dict[str, float] = {}
    for item in items:
        try:
            rel = item.path.resolve().relative_to(TESTS).as_posix()
        except ValueError:
            continue
        weight[item.nodeid] = seconds.get(rel, unknown)
        if (rel in SLOW_FILES or f"{rel}::{getattr(item, 'originalname', item.name)}" in SLOW_TESTS
                or f"{rel}::{item.name}" in SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda it: -weight.get(it.nodeid, unknown))  # stable: a file's own order kept


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces`` beside the checkout (CI has it there)."""
    if not SHARED_TRACES.is_dir():
        pytest.fail(f"real traces not found at {SHARED_TRACES}: put ../shared beside the checkout")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def sample_traces() -> Path:
    """The project's own captures in ``sample_traces/``."""
    return SAMPLE_TRACES


@pytest.fixture(scope="module")
def trio_dir(shared_traces: Path) -> Path:
    """TrioSim's own sample input: VGG-13, one iteration on an H100, batch 128."""
    return shared_traces / "triosim" / "vgg13_h100_bs128"


@pytest.fixture(scope="module")
def trio(trio_dir: Path):
    """The TrioSim sample, loaded once per module."""
    from ettools.formats import load_trace

    return load_trace([trio_dir]).trace


@pytest.fixture(scope="session")
def held_out_op_model(tmp_path_factory: pytest.TempPathFactory):
    """``fit(gpu, model)``: ``gpu``'s op model fitted (``cv=False``) on its shipped sources
    (``make_op_models.SOURCES`` under ``../shared``) without any file of ``model`` — the held-out
    fit the cross-GPU tests predict ``model`` with (test_compute_transfer, test_replay_retime).

    The same fit, seconds of CPU each, is wanted by several test files, which xdist may run on
    different workers: each is fitted once per run and pickled under the run's temporary folder
    (shared by the workers), the first worker to want it fitting it while another waits on its
    lock and then reads it."""
    import fcntl
    import os
    import pickle

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the workers' folders sit in the run's own
    folder = base / "held_out_op_models"
    folder.mkdir(exist_ok=True)
    memo: dict[tuple[str, str], object] = {}

    def fit(gpu: str, model: str):
        if (gpu, model) not in memo:
            path = folder / f"{gpu}-{model}.pkl"
            with open(folder / f"{gpu}-{model}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if path.exists():
                    memo[gpu, model] = pickle.loads(path.read_bytes())
                else:
                    from ettools.replay.calibrate import fit_op_model
                    from ettools.replay.data.make_op_models import SOURCES

                    files = sorted(f for pat in SOURCES[gpu] for f in SHARED_TRACES.parent.glob(pat)
                                   if model not in str(f))
                    memo[gpu, model] = fit_op_model(files, gpu, cv=False)[0]
                    tmp = path.with_suffix(".tmp")
                    tmp.write_bytes(pickle.dumps(memo[gpu, model]))
                    tmp.replace(path)
        return memo[gpu, model]

    return fit
