"""What ``ettools info`` loads (issue 27, item 4), and the table renderer that spares it tabulate.

Each laziness test runs a fresh interpreter and asserts which modules (or threads) are there after
it; none times anything (the CPU cost is measured by ``tests/bench/bench_kineto.py --info``).
:func:`ettools.text_table.simple_table` is compared with ``tabulate`` itself, byte for byte.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tabulate import tabulate

from ettools.text_table import simple_table

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "single" / "rank0.kineto.json.gz"


def _fresh(code: str) -> list[str]:
    """The last line of what ``code`` prints in a fresh interpreter, split on spaces."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env=env)
    return out.stdout.splitlines()[-1].split()


def _loaded(names: tuple[str, ...]) -> str:
    return f"import sys; print('loaded:', *sorted(m for m in {names!r} if m in sys.modules))"


RUN_INFO = ("import io, contextlib\n"
            "from ettools.cli import main\n"
            "try:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        main({args!r})\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n")


def test_the_command_line_and_info_help_import_no_numpy():
    """numpy (through ettools.io's shape scan) and tempfile (its atomic writers) wait for a command
    that reads or writes a trace."""
    lazy = ("numpy", "tempfile", "ettools.json_scan", "ettools.output_files", "tabulate")
    assert _fresh("import ettools.cli\n" + _loaded(lazy)) == ["loaded:"]
    assert _fresh(RUN_INFO.format(args=["info", "--help"]) + _loaded(lazy)) == ["loaded:"]


def test_info_text_imports_no_tabulate_nor_writers():
    lazy = ("tabulate", "importlib.metadata", "tempfile", "ettools.output_files", "tqdm")
    assert _fresh(RUN_INFO.format(args=["info", str(SAMPLE)]) + _loaded(lazy)) == ["loaded:"]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads counted in /proc")
def test_info_starts_no_blas_threads_and_leaves_the_environment_alone():
    """numpy imported by info has OpenBLAS at one thread (no pool beside the one thread of work);
    the variable that sized it is gone again, so child processes see the user's environment."""
    probe = "import os; print(len(os.listdir('/proc/self/task')), 'OPENBLAS_NUM_THREADS' in os.environ)"
    assert _fresh(RUN_INFO.format(args=["info", "-q", str(SAMPLE)]) + probe) == ["1", "False"]


def test_io_reexports_are_the_modules_names():
    import ettools.io as eio
    from ettools import json_scan, output_files

    for name in eio._JSON_SCAN:
        assert getattr(eio, name) is getattr(json_scan, name)
    for name in eio._OUTPUT_FILES:
        assert getattr(eio, name) is getattr(output_files, name)
    from ettools.io import OutputSet, scan_shape  # the from-import form goes through __getattr__ too

    assert (OutputSet, scan_shape) == (output_files.OutputSet, json_scan.scan_shape)
    with pytest.raises(AttributeError):
        eio.no_such_name  # noqa: B018


# cells like the ones info prints, and the ones that steer tabulate's type guessing
TEXT_CELLS = ["", "-", "0", "7", "-3", "+4", " 5 ", "1_000", "1,234", "12,34", "1,234.5", "465.171",
              "12345.678", "0.000123", "1e5", "1E-3", ".5", "5.", "inf", "-inf", "nan", "NaN", "Infinity",
              "True", "False", "1.1 GiB", "512 B", "ALL_REDUCE", "x", "a b", "  pad", "0x10", "1.5.2"]


def _cell(rng: random.Random) -> int | str:
    r = rng.random()
    if r < 0.4:
        return rng.choice([0, 1, -1, 7, 999, 1000, 123456789, -98765, 10**15])
    if r < 0.55:  # a span as info writes it
        return f"{rng.uniform(0, 10 ** rng.randint(0, 7)):.3f}"
    return rng.choice(TEXT_CELLS)


def test_simple_table_is_tabulate_byte_for_byte():
    rng = random.Random(27)
    for _ in range(3000):
        ncols, nrows = rng.randint(1, 6), rng.randint(1, 5)
        headers = [rng.choice(["rank", "nodes", "span ms", "", "communication", "x"]) for _ in range(ncols)]
        # one kind per column most of the time (a real table's columns), mixed the rest
        kinds = [rng.choice(TEXT_CELLS + [0, 1000]) for _ in range(ncols)]
        rows = [[_cell(rng) if rng.random() < 0.4 else (kinds[j] if isinstance(kinds[j], str) else rng.randint(-10**7, 10**7))
                 for j in range(ncols)] for _ in range(nrows)]
        assert simple_table(rows, headers) == tabulate(rows, headers=headers, intfmt=","), (rows, headers)


def test_simple_table_on_info_tables_and_what_it_hands_to_tabulate():
    info_rows = [[0, 74931, 74871, 60, 0, 0, 0, 84638, "465.171"], [1, 5, 5, 0, 0, 0, 0, 4, "-"]]
    heads = ["rank", "nodes", "COMP", "COLL", "SEND", "RECV", "other", "edges", "span ms"]
    assert simple_table(info_rows, heads) == tabulate(info_rows, headers=heads, intfmt=",")
    # floats, None, bools, non-ASCII, escapes, ragged rows and empty tables: tabulate renders them
    for rows in ([[1.5, "a"]], [[None, 2]], [[True, 3]], [["é", 4]], [["\x1b[31m5\x1b[0m", 5]],
                 [["a\nb", 6]], [["\\x", 7]], [[1, 2, 3]], []):
        assert simple_table(rows, ["h1", "h2"]) == tabulate(rows, headers=["h1", "h2"], intfmt=",")


def test_info_on_kineto_traces_imports_no_numpy_ma():
    """numpy 2's np.unique, np.median and np.percentile each ask numpy.ma whether their input is
    masked, which imports it; the Kineto reader's own versions do not."""
    for trace in (SAMPLE, REPO / "sample_traces" / "ddp" / "rank1.kineto.json.gz"):  # both did import it
        assert _fresh(RUN_INFO.format(args=["info", "-q", str(trace)]) + _loaded(("numpy.ma",))) == ["loaded:"]


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


def test_kineto_unique_median_percentile_are_numpys():
    import numpy as np

    from ettools.converters.kineto_columns import median, percentile, unique

    rng = np.random.default_rng(27)
    # numpy's own interpolation warns on inf - inf (the result is NaN on both sides)
    with np.errstate(invalid="ignore"):
        _compare_with_numpy(np, rng, median, percentile, unique)


def _compare_with_numpy(np, rng, median, percentile, unique):  # noqa: ANN001
    for n in [0, 1, 2, 3, 4, 5, 10, 255, 256, 257, 258, 1001, 4096]:
        for trial in range(6):
            ints = rng.integers(-5, 50 if trial % 2 else 10**12, n)
            for dtype in (np.int32, np.int64, np.uint16, bool):
                got, want = unique(ints.astype(dtype)), np.unique(ints.astype(dtype))
                assert got.dtype == want.dtype and np.array_equal(got, want)
            floats = rng.normal(0, 10.0 ** rng.integers(-3, 9), n)
            if trial >= 3 and n:
                floats[rng.integers(0, n, max(1, n // 4))] = rng.choice([np.inf, -np.inf, 0.0, 1e-300])
            if trial == 5 and n:
                floats[rng.integers(0, n)] = np.nan
            rounded = np.round(floats, 1)  # many equal values
            for arr in (floats, rounded, ints):
                if n:
                    assert _same(median(arr), float(np.median(arr))), (n, trial)
                for q in (0, 1, 10, 25, 33, 50, 75, 90, 99.5, 100):
                    if n:
                        assert _same(percentile(arr, q), float(np.percentile(arr, q))), (n, trial, q)
