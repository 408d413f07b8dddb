"""Peak memory of ``info``, ``convert --to chakra`` and ``replay`` per byte of uncompressed input
(issue 26: ≤ 4×), on the largest shared traces.

Run: ``python tests/bench/bench_memory.py [--kineto N] [--et N] [FILE...]``. Without files, the
shared traces folder (``../shared/traces``) is enumerated and each JSON file's format sniffed from
its content: the ``--kineto`` (3) largest Kineto traces and the ``--et`` (1) largest PyTorch ETs,
by uncompressed size, so new traces are met. Each command runs in its own child process, whose
peak RSS is read inside it from ``/proc/self/status`` ``VmHWM`` (per address space: unlike
``ru_maxrss`` it does not inherit a parent's mark). Printed: the peak, the ratio peak/input (the
bound), and beside it, for reference only, the ratio after subtracting the peak of a child that
only starts Python and imports ``ettools.cli`` (the interpreter and libraries, which a small input
cannot amortize). Exit status 0; the verdict column says whether each is ≤ 4×. ``--readme`` prints the
memory row of ``converters/README.md``'s Speed table (block ``<!-- bench:memory -->``) between
``<!-- readme:begin -->`` and ``<!-- readme:end -->``.
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"
BOUND = 4.0
MB = 1 << 20

# one CLI run, its own peak read from VmHWM after it ends (exit status kept)
_PEAK = """
import re, sys
code = 0
if sys.argv[1:]:
    from ettools.cli import main
    try:
        main(sys.argv[1:], prog_name="ettools")
    except SystemExit as e:
        code = e.code
else:
    import ettools.cli  # noqa: F401  (the baseline: interpreter and imports only)
hwm = re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)
print("PEAK", int(hwm) * 1024, code, file=sys.stderr)
"""


def peak_of(args: list[str], timeout: float = 600) -> tuple[int, int]:
    """(peak RSS in bytes, exit status) of ``ettools ARGS`` in a child process."""
    res = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, timeout=timeout)
    last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    m = re.fullmatch(r"PEAK (\d+) (\S+)", last)
    if not m:
        raise RuntimeError(f"ettools {' '.join(args)}: no peak reported:\n{res.stderr[-2000:]}")
    code = m.group(2)
    return int(m.group(1)), int(code) if code.lstrip("-").isdigit() else 1


def uncompressed_size(path: Path) -> int:
    """Bytes of JSON text in ``path`` (gunzipped, streamed: the whole text is never held)."""
    with path.open("rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return path.stat().st_size
    n = 0
    with gzip.open(path, "rb") as g:
        while chunk := g.read(1 << 22):
            n += len(chunk)
    return n


def shared_inputs(n_kineto: int, n_et: int) -> list[tuple[str, Path, int]]:
    """(format, path, uncompressed bytes) of the largest Kineto and PyTorch ET files under the shared
    traces folder, sniffed from their content."""
    from ettools.errors import TraceError
    from ettools.formats import sniff

    found: dict[str, list[tuple[int, Path]]] = {"kineto": [], "pytorch-et": []}
    for p in sorted(SHARED.rglob("*")):
        if not p.is_file() or not p.name.endswith((".json", ".json.gz")):
            continue
        try:
            fmt = sniff(p)
        except (TraceError, OSError, zlib.error, EOFError):
            continue
        if fmt in found:
            found[fmt].append((uncompressed_size(p), p))
    out = []
    for fmt, n in (("kineto", n_kineto), ("pytorch-et", n_et)):
        for size, p in sorted(found[fmt], key=lambda x: (-x[0], str(x[1])))[:n]:
            out.append((fmt, p, size))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--kineto", type=int, default=3, help="largest shared Kineto traces measured")
    ap.add_argument("--et", type=int, default=1, help="largest shared PyTorch ETs measured")
    ap.add_argument("--readme", action="store_true", help="print the README block")
    args = ap.parse_args(argv)
    if not Path("/proc/self/status").exists():
        print("peak RSS is read from /proc/self/status: not available here")
        return 0
    if args.files:
        from ettools.formats import sniff

        inputs = [(sniff(p), p, uncompressed_size(p)) for p in args.files]
    else:
        inputs = shared_inputs(args.kineto, args.et)
        if not inputs:
            print(f"no traces under {SHARED}")
            return 0
    base, _ = peak_of([])
    print(f"baseline (python + import ettools.cli): {base / MB:.1f} MB; bound: peak ≤ {BOUND:g}x the input")
    print(f"{'input':72s} {'fmt':10s} {'input MB':>8s} {'command':8s} {'peak MB':>8s} {'x input':>7s} "
          f"{'x (peak-base)':>13s}  ≤{BOUND:g}x")
    worst = 0.0
    ratios: dict[tuple[str, str], list[float]] = {}  # (format, command) -> ratios
    ets: list[tuple[str, int, float, float]] = []  # PyTorch ETs: (name, bytes, worst ratio, base share)
    for fmt, path, size in inputs:
        name = str(path.relative_to(SHARED)) if path.is_relative_to(SHARED) else str(path)
        for cmd in ("info", "convert", "replay"):
            with tempfile.TemporaryDirectory() as td:
                cli = {"info": ["info", str(path)], "replay": ["replay", str(path)],
                       "convert": ["convert", "-q", "--to", "chakra", "-o", td, str(path)]}[cmd]
                peak, code = peak_of(cli)
            ratio = peak / size
            worst = max(worst, ratio)
            ratios.setdefault((fmt, cmd), []).append(ratio)
            note = "" if code in (0, 1) else f"  (exit {code})"  # replay exits 1 on a deadlocked graph
            print(f"{name:72s} {fmt:10s} {size / MB:8.1f} {cmd:8s} {peak / MB:8.1f} {ratio:7.2f} "
                  f"{(peak - base) / size:13.2f}  {'yes' if ratio <= BOUND else 'NO'}{note}", flush=True)
        if fmt == "pytorch-et":
            ets.append((path.parent.name, size, max(ratios[(fmt, c)][-1] for c in ("info", "convert", "replay")),
                        base))
    print(f"worst: {worst:.2f}x the input")
    if args.readme:
        def span(fmt: str, cmd: str) -> str:
            v = ratios.get((fmt, cmd), [])
            return f"{min(v):.1f}–{max(v):.1f}×" if len(v) > 1 else f"{v[0]:.1f}×" if v else "-"
        n_k = len({p for f, p, _ in inputs if f == "kineto"})
        kin = [r for (f, _c), v in ratios.items() if f == "kineto" for r in v]
        et_txt = "; ".join(f"PyTorch ET `{nm}` ({sz / MB:.1f} MiB) {r:.1f}×" for nm, sz, r, _b in ets)
        met = "met on the Kineto traces" if kin and max(kin) <= BOUND else "not met on every Kineto trace"
        over = [nm for nm, _sz, r, _b in ets if r > BOUND]
        et_note = "" if not ets else "; met on the ET files" if not over else f"; not on `{over[0]}`"
        print("<!-- readme:begin -->")
        print("| what | figure | target / anchor |\n| --- | --- | --- |")
        print(f"| Peak memory (RSS) per byte of uncompressed JSON, `bench_memory.py` (the {n_k} largest shared "
              f"Kineto traces and the largest PyTorch ET, found by size; one run) | Kineto `info` "
              f"{span('kineto', 'info')}, `replay` {span('kineto', 'replay')}, `convert --to chakra` "
              f"{span('kineto', 'convert')}{'; ' + et_txt if et_txt else ''} (a process that only starts "
              f"Python and imports `ettools.cli`: {base / MB:.1f} MB) | ≤ {BOUND:g}×: {met}{et_note} |")
        print("<!-- readme:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
