"""A bounded fuzz run in the suite: 300 seeded mutants of the real traces (a different slice of
cases each day would hide regressions: the slice is fixed), no tracebacks, hangs or leftovers."""

from __future__ import annotations

import logging

from harness import SEEDS, fuzz


def test_fuzz_bounded():
    assert any(s.exists() for s in SEEDS)
    logging.disable(logging.WARNING)
    try:
        counts, details = fuzz(300, seed=1)
    finally:
        logging.disable(logging.NOTSET)
    assert sum(counts.values()) == 300
    bad = {c: details.get(c) for c in ("traceback", "hang", "leftover", "harness") if counts.get(c)}
    assert not bad, bad
    assert counts["clean"] > 10 and counts["ok"] > 10  # the mutants reach both outcomes
