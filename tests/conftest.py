"""Shared fixtures: where the real traces are, and the sample captures; the ``slow`` marker.

``python -m pytest -m "not slow"`` is the fast subset (under 2 minutes with two workers on the
project's 2-core machine, against about 7 for everything): it leaves out the test files below, which
took the most time in a ``--durations`` run of the whole suite, and still tests every package.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLE_TRACES = REPO / "sample_traces"
TESTS = Path(__file__).resolve().parent

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

# single slow tests of files whose other tests are quick (the quick ones keep their package in the
# fast subset: test_emulate_host's --host-from refusal is the fast subset's emulated-capture test)
SLOW_TESTS = frozenset({
    "test_emulate_host.py::test_python_events_and_top_level_ops_counted_as_the_profiler_records_them",
    "test_emulate_host.py::test_host_measured_on_other_models_predicts_a_host_bound_step",
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
    reading every shared trace (half a minute per xdist worker), which would dominate the subset."""
    try:
        rel = collection_path.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None
    if rel in SLOW_FILES and _slow_deselected(config.getoption("markexpr", "") or ""):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of a file in ``SLOW_FILES``, and each test in ``SLOW_TESTS``, ``slow``
    (``-m "not slow"`` leaves them out)."""
    for item in items:
        try:
            rel = item.path.resolve().relative_to(TESTS).as_posix()
        except ValueError:
            continue
        if rel in SLOW_FILES or f"{rel}::{getattr(item, 'originalname', item.name)}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


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
