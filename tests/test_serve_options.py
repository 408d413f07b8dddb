"""Bad ``ettools serve`` options exit 2 at once with one line naming the option (they used to hang,
grow memory or raise a traceback)."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from ettools.cli import main


@pytest.mark.parametrize("args,named", [
    (["--max-seqs", "0"], "--max-seqs"),                                   # zero: used to hang
    (["--token-budget", "-1", "--scheduler", "chunked"], "--token-budget"),  # negative: used to hang
    (["--gpus", "1000000000"], "--gpus"),                                   # absurdly large: memory grew
    (["--duration", "-5"], "--duration"),                                   # negative: NaN traceback
    (["--rate", "inf"], "--rate"),                                          # infinite: OverflowError
    (["--duration", "inf"], "--duration"),
    (["--ep", "0"], "--ep"),                                                # zero: ZeroDivisionError
    (["--block-tokens", "0"], "--block-tokens"),
    (["--kv-fraction", "0"], "--kv-fraction"),
    (["--acceptance", "1.5"], "--acceptance"),
    (["--rate", "1000000", "--duration", "10000000"], "requests expected"),  # sizes the arrival array
])
def test_bad_serve_option_exits_2_with_one_line(args, named):
    t0 = time.perf_counter()
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--rate", "1", *args])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and named in lines[0], r.output
    assert time.perf_counter() - t0 < 5.0
