"""Shared fixtures: where the real traces are, and the sample captures."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLE_TRACES = REPO / "sample_traces"


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
