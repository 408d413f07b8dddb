"""Bounded fuzz runs in the suite (a different slice of cases each day would hide regressions: the
slices are fixed): 200 seeded mutants of the real traces, and 200 option cases of every
subcommand; no tracebacks, hangs, leftovers, unchecked allocations or undocumented exit 1."""

from __future__ import annotations

import logging

from harness import BAD_CLASSES, SEEDS, fuzz
from options import fuzz_options

from ettools.cli import main


def test_fuzz_bounded():
    assert any(s.exists() for s in SEEDS)
    logging.disable(logging.WARNING)
    try:
        counts, details = fuzz(200, seed=1)
    finally:
        logging.disable(logging.NOTSET)
    assert sum(counts.values()) == 200
    bad = {c: details.get(c) for c in BAD_CLASSES if counts.get(c)}
    assert not bad, bad
    assert counts["clean"] > 10 and counts["ok"] > 10  # the mutants reach both outcomes


def test_fuzz_options_bounded():
    """200 option cases: every subcommand is drawn, and both refused and accepted values occur."""
    logging.disable(logging.WARNING)
    try:
        counts, details = fuzz_options(200, seed=1)
    finally:
        logging.disable(logging.NOTSET)
    assert sum(counts.values()) == 200
    bad = {c: details.get(c) for c in BAD_CLASSES if counts.get(c)}
    assert not bad, bad
    assert counts["clean"] > 50 and counts["ok"] > 20


def test_options_cases_cover_every_subcommand_and_option():
    """The cases are drawn from the click commands themselves: 3,000 cases name every subcommand
    and nearly every option (a new option is fuzzed without a change to the fuzzer)."""
    from options import fuzzable, make_args

    seen: set[tuple[str, str]] = set()
    names = set()
    for i in range(3000):
        name, args, _ = make_args(i, 1)
        names.add(name)
        seen.update((name, a) for a in args if a.startswith("--"))
    assert names == set(main.commands)
    every = {(n, o) for n, c in main.commands.items() for p in fuzzable(c) for o in p.opts if o.startswith("--")}
    assert len(every & seen) >= 0.95 * len(every), sorted(every - seen)
    assert [make_args(i, 1) for i in range(50)] == [make_args(i, 1) for i in range(50)]  # deterministic
