"""Anchors the benchmarks measure in the same run as their figures (issue 27: a writer against
``dd``, a reader against ``orjson``).

``dd_seconds`` times ``dd`` writing the same number of bytes into the same folder (one file from
``/dev/zero``, 8 MiB blocks, no sync — the writers do not sync either: both land in the page
cache), so ``writer MB/s ÷ dd MB/s`` compares the writer with what this disk and kernel allow in
the same minute, whatever load the machine has.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

BLOCK = 8 << 20


def dd_seconds(folder: Path, nbytes: int) -> float:
    """Wall seconds of ``dd`` writing ``nbytes`` (rounded up to 8 MiB blocks) into ``folder``
    (the file is removed afterwards); NaN where ``dd`` is missing."""
    dd = shutil.which("dd")
    if dd is None or nbytes <= 0:
        return float("nan")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "dd_anchor.bin"
    count = max(1, -(-int(nbytes) // BLOCK))
    t0 = time.perf_counter()
    subprocess.run([dd, "if=/dev/zero", f"of={out}", f"bs={BLOCK}", f"count={count}", "status=none"], check=True)
    seconds = time.perf_counter() - t0
    out.unlink(missing_ok=True)
    return seconds * nbytes / (count * BLOCK)
