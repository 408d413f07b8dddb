"""A seeded, deterministic fuzzer of every ettools subcommand's OPTIONS (issue 26, item 6).

The options are enumerated from the click command objects of :mod:`ettools.cli` (a new option is
fuzzed without a change here). Each case takes one cheap, valid invocation of a subcommand (small
copied inputs, small models) and replaces one option (~75 %), two (~20 %) or a known contradictory
pair (~5 %) with values drawn by the option's type: zero, negative, -1, inf, -inf, nan, huge
(1e30, 2^64, 10^30, 5,000 digits), wrong type, empty, malformed ranges, lists and ``KEY=VALUE``
forms, paths that are missing, empty, a folder, under a file or a device.

Every case runs in its own folder (the working directory during the run, so relative paths land
there too) holding copies of its inputs: an output option pointed at an input damages a copy.
Outcome classes, as in :mod:`harness` plus:

- ``oom``: exit 2 "out of memory": a number reached an allocation instead of a range check;
- ``exit1-undocumented``: exit 1 other than the documented gates (replay deadlock, validate
  --tolerance);
- ``launch``: ``capture`` parsed its options and would start the program: stopped there (the
  fuzzer never launches one), not a defect.

Bad: traceback, hang, leftover, oom, exit1-undocumented, exit2-lines, harness.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import tempfile
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner
from harness import BAD_CLASSES, exit_class  # noqa: F401 (BAD_CLASSES: the classes, for callers)

from ettools.cli import main

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces"
KINETO = REPO / "sample_traces/single/rank0.kineto.json.gz"
ET = REPO / "sample_traces/single/rank0.et.json.gz"
GPU_KINETO = REPO / "sample_traces/gpu_h100/tiny/rank0.kineto.json.gz"
TRIOSIM = SHARED / "triosim/vgg13_h100_bs128"


NUM_BAD = ["0", "-1", "-7", "-0", "inf", "-inf", "nan", "NaN", "1e30", "-1e30", "1e308", "1e-320", str(2**64),
           str(2**63), str(10**30), "9" * 5000, "abc", "", " ", "1.5", "0.5", "0x10", "1_0", "\u0661\u0662", "2**64"]
NUM_OK = ["1", "2", "3", "4", "8", "16", "100"]
# ranges and lists (--steps, --ranks, --stages, search axes, token distributions)
FORMS = ["1-", "-1", "3-1", "0-0", "1-1", "0-99999999", "2-9999999", "1,,2", ",", "1-2-3", "a-b", "1e3", "1,2",
         "0,1,2,3", "99999999", "1-" + str(2**64), str(10**30) + "-" + str(10**31), "exp:", "exp:-1", "exp:nan",
         "exp:inf", "exp:0", "exp:1e30", "exp:8", "4-8", "none", "0,1", "1/2", "tp=0", "tp=", "tp=1e30",
         "tp=-1", "tp=99999999", "prefill=2", "prefill=nan", "prefill=0", "tp=1,2 pp=0", "tp=1 prefill=", "calibrated:",
         "calibrated:/nonexistent.json", "calibrated:{case}/garbage.txt", "roofline", "measured", "x" * 300,
         "\x00", "\x1b[31m", "a\nb"]
STR_OK = ["H100", "A100", "MI300X", "bf16", "fp8", "fp32", "fp64", "int4", "gpt3-1.3b", "llama3-8b", "abc",
          "{case}/garbage.txt", "{case}/empty", "{case}/nonexistent.json"]
KEYS = ["L", "H", "V", "NH", "F", "HD", "S", "B", "E", "X", "", "device", "host", "host_gap", "comm", "tp",
        "pp", "dp", "zero", "micro_batch", "schedule", "hidden", "batch"]
PATHS = ["", ".", "{case}/nonexistent/x", "missing.json", "/dev/null", "{case}/garbage.txt", "{case}/empty",
         "{case}/dir", "{case}/garbage.txt/x", "{case}/new/deep/out.json", "new.md", "new.html", "new.png",
         "{in}", "{in_dir}", "{case}/sub"]


def _base(cmd: str, kineto: bool = True) -> tuple[list[str], list[tuple[str, str | None]], list[str], str | None]:
    """A cheap valid invocation: (positional inputs, options, tail, input to copy: file or folder).
    ``kineto``: convert, validate and calibrate read a small Kineto trace (its --steps and --et
    mean something), else the TrioSim one (4-10× cheaper to read)."""
    if cmd in ("info", "replay"):
        return ["{in}"], [], [], "single"
    if cmd in ("convert", "validate", "calibrate") and not kineto:
        out = {"convert": [("-o", "{case}/out")], "calibrate": [("-o", "{case}/out/fit.json")]}.get(cmd, [])
        return ["{in_dir}", "{in_dir}"] if cmd == "validate" else ["{in_dir}"], out, [], "triosim"
    if cmd == "convert":
        return ["{in}"], [("-o", "{case}/out")], [], "single"
    if cmd == "validate":
        return ["{in}", "{in}"], [], [], "single"
    if cmd == "calibrate":
        return ["{in}"], [("-o", "{case}/out/fit.json")], [], "gpu"
    if cmd == "scale":
        return ["{in_dir}"], [("--dp", "2"), ("-o", "{case}/out")], [], "triosim"
    if cmd == "synth":
        return [], [("--model", "gpt3-1.3b"), ("--dim", "L=1"), ("--seq", "128"), ("-o", "{case}/out")], [], None
    if cmd == "serve":
        return [], [("--model", "gpt3-1.3b"), ("--dim", "L=2"), ("--rate", "2"), ("--duration", "1"),
                    ("--prompt-tokens", "16"), ("--output-tokens", "4"), ("--timing", "roofline")], [], None
    if cmd == "search":
        return [], [("--model", "gpt3-1.3b"), ("--dim", "L=2"), ("--gpus", "1"), ("--batch", "1"), ("--seq", "128"),
                    ("--no-cache", None), ("--workers", "1"), ("--timing", "roofline"), ("--zero", "0"),
                    ("--recompute", "0"), ("--micro-batch", "1")], [], None
    if cmd == "capture":
        return [], [("-o", "{case}/out")], ["--", "true"], None
    raise KeyError(cmd)  # a new subcommand: give it a cheap valid invocation here


# known contradictions, besides the random pairs (which meet many of them by chance)
CONTRA: dict[str, list[list[tuple[str, str | None]]]] = {
    "synth": [[("--fsdp", None), ("--zero", "1")], [("--sp", None), ("--tp", "1")], [("--vpp", "2")],
              [("--phase", "decode"), ("--context", "0")], [("--phase", "prefill"), ("--gemm-dtype", "fp8")],
              [("--pp", "2"), ("--schedule", "zb-h1"), ("--zero", "3")], [("--ep", "4"), ("--dp", "2")],
              [("--batch", "2"), ("--micro-batch", "4")], [("--ranks", "1"), ("--dp", "1")]],
    "scale": [[("--schedule", "gpipe")], [("--stages", "1,1")], [("--pp-split", "ops")], [("--sp", None)],
              [("--pp", "2"), ("--stages", "5,5,5")], [("--tp", "3")], [("--world", "1"), ("--dp", "4")]],
    "replay": [[("--congestion", None), ("--symmetric", None)], [("--collectives", "{case}/garbage.txt")],
               [("--timing", "calibrated:{case}/empty")]],
    "serve": [[("--rate", "1"), ("--interval", "1")], [("--prefill-gpus", "2"), ("--gpus", "1")],
              [("--tp", "2"), ("--gpus", "1")], [("--kv-tokens", "1"), ("--kv-fraction", "0.5")],
              [("--search", None), ("--space", "tp=3")], [("--max-model-len", "1"), ("--prompt-tokens", "4")],
              [("--cost", "{case}/garbage.txt"), ("--timing", "measured")]],
    "search": [[("--objective", "memory")], [("--time-bound", "1"), ("--objective", "tokens")],
               [("--gpus", "3"), ("--tp", "2")], [("--fix", "tp=2"), ("--tp", "1")], [("--strategy", "random")],
               [("--trials", "1"), ("--strategy", "exhaustive")], [("--top", "1000")]],
    "capture": [[("--world", "2")], [("--gpu-memory", "1")], [("--host", "measured")], [("--jobs", "2")],
                [("--emulate", "H100"), ("--steps", "3-2")]],
    "calibrate": [[("--network", None), ("--op-model", None)], [("--serving", None), ("--network", None)],
                  [("--report", None)], [("--predict", "{case}/garbage.txt")]],
    "validate": [[("--tolerance", "0"), ("--measure", "step_time")], [("--unit", "device"), ("--op-class", "GeMM")]],
    "convert": [[("--et", "{in}")], [("--to", "triosim"), ("--allow-defects", None)]],
    "info": [[("--et", "{in}")], [("--steps", "0")]],
}


# valid choices that start outside machinery, as capture's launch does: a Ray cluster (~10 s, its
# daemons and session folders outlive the case). Their option is still fuzzed with every other value.
EXPENSIVE = {"--backend": {"ray"}}


def fuzzable(cmd: click.Command) -> list[click.Option]:
    """The options of ``cmd`` that take part: all but ``--quiet`` (no value to fuzz)."""
    return [p for p in cmd.params if isinstance(p, click.Option) and p.name != "quiet"]


def values_for(p: click.Option) -> list[str | None]:
    """Values for one option, by its type (None: a flag given bare)."""
    t = p.type
    if p.is_flag and not p.count:
        return [None]
    if isinstance(t, click.Choice):
        skip = EXPENSIVE.get(p.opts[-1], set())
        return ["abc", "", "0", "-1", "nan", str(2**64)] + [str(c) for c in t.choices if c not in skip]
    if isinstance(t, (click.types.IntParamType, click.types.FloatParamType)):
        return NUM_BAD + NUM_OK
    if isinstance(t, click.Path):
        return PATHS
    if p.multiple:  # every multiple string option is a KEY=VALUE list (--dim, --what-if, --fix)
        return [f"{k}={v}" for k in KEYS for v in NUM_BAD[:16] + NUM_OK[:3] + ["1:2", "0:4", "4:0", "a:b", "2=3"]] \
            + ["L", "=4", "", "L==4", "L=4=5"]
    return NUM_BAD + NUM_OK + FORMS + STR_OK


def _flag_tokens(p: click.Option, rng: random.Random) -> list[str]:
    names = p.opts + p.secondary_opts
    return [rng.choice([n for n in names if n.startswith("--")] or names)]


def make_args(i: int, seed: int, commands: list[str] | None = None) -> tuple[str, list[str], str | None]:
    """Case ``i`` of ``seed``: (subcommand, argument list with ``{case}``/``{in}``/``{in_dir}``
    placeholders, input kind to copy). Pure: same arguments, same case."""
    rng = random.Random(seed * 1_000_003 + i + 7_919)
    names = commands or sorted(main.commands)
    name = names[rng.randrange(len(names))]
    cmd = main.commands[name]
    pos, base, tail, kind = _base(name, kineto=rng.random() < 0.25)
    opts = fuzzable(cmd)
    r = rng.random()
    chosen: list[tuple[click.Option, list[str]]] = []
    if r < 0.05 and CONTRA.get(name):
        by_name = {o: p for p in opts for o in p.opts + p.secondary_opts}
        for opt, value in rng.choice(CONTRA[name]):
            chosen.append((by_name[opt], [opt] if value is None else [opt, value]))
    else:
        for p in rng.sample(opts, min(len(opts), 2 if r < 0.25 else 1)):
            v = rng.choice(values_for(p))
            chosen.append((p, _flag_tokens(p, rng) if v is None else [rng.choice(p.opts), v]))
    # a fuzzed single-valued option replaces the base's own; a multiple one (--dim) is added after it
    replaced = {o for p, _ in chosen if not p.multiple for o in p.opts + p.secondary_opts}
    args = [name, *pos]
    for opt, value in base:
        if opt not in replaced:
            args += [opt] if value is None else [opt, value]
    for _, toks in chosen:
        args += toks
    return name, [*args, "-q", *tail], kind


def _copy_inputs(kind: str | None, case: Path) -> tuple[Path, Path]:
    src = case / "in"
    src.mkdir()
    if kind == "single":
        for f in (KINETO, ET):
            shutil.copyfile(f, src / f.name)
        return src / KINETO.name, src
    if kind == "gpu":
        shutil.copyfile(GPU_KINETO, src / GPU_KINETO.name)
        return src / GPU_KINETO.name, src
    if kind == "triosim":
        for f in sorted(TRIOSIM.iterdir()):
            shutil.copyfile(f, src / f.name)
        return src / "trace.csv", src
    (src / "none.json").write_text("{}")
    return src / "none.json", src


class _Hang(BaseException):
    pass


class _Launch(BaseException):
    """``capture`` got past its options to starting the program: the fuzzer stops it there."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def _launch(*args: Any, **kwargs: Any) -> int:
    raise _Launch()


@contextlib.contextmanager
def _no_launch() -> Iterator[None]:
    """Replace capture's two launchers by a stop (the options before them are what is fuzzed)."""
    import ettools.capture as cap
    import ettools.capture_emulate as emu

    saved = (cap.run_capture, emu.run_capture_emulated)
    cap.run_capture, emu.run_capture_emulated = _launch, _launch
    try:
        yield
    finally:
        cap.run_capture, emu.run_capture_emulated = saved


def _snapshot(case: Path) -> set[str]:
    return {str(p.relative_to(case)) for p in case.rglob("*")}


def run_options_case(name: str, args: list[str], kind: str | None, case: Path, limit_s: int = 15) -> tuple[str, str]:
    """Run one case in folder ``case`` (created here); returns (outcome class, detail)."""
    case.mkdir(parents=True)
    inp, in_dir = _copy_inputs(kind, case)
    (case / "garbage.txt").write_text("abc\n")
    (case / "empty").write_bytes(b"")
    (case / "dir").mkdir()
    subs = {"{case}": str(case), "{in_dir}": str(in_dir), "{in}": str(inp)}
    real = []
    for a in args:
        for k, v in subs.items():
            a = a.replace(k, v)
        real.append(a)
    shown = " ".join(repr(a) if (not a or " " in a or len(a) > 60) else a for a in real)
    if len(shown) > 600:
        shown = shown[:600] + "…"
    before = _snapshot(case)
    cwd = os.getcwd()
    old = signal.signal(signal.SIGALRM, _alarm)
    os.chdir(case)  # relative paths in option values land in the case folder
    signal.alarm(limit_s)
    try:
        with _no_launch():
            res = CliRunner().invoke(main, real, catch_exceptions=True)
    except _Hang:
        return "hang", shown
    except _Launch:
        return "launch", ""
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.chdir(cwd)
    exc = res.exception
    if isinstance(exc, _Hang):
        return "hang", shown
    if isinstance(exc, _Launch):
        return "launch", ""
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
        return "traceback", f"{shown}\n{tb}"
    after = _snapshot(case)
    stage = [p for p in after if ".ettools-stage-" in p]
    if stage or (res.exit_code != 0 and after - before):
        return "leftover", f"{shown}: {sorted(stage or after - before)[:3]}"
    return exit_class(res, shown)


def fuzz_options(n: int, seed: int = 0, start: int = 0, keep: int = 5,
                 commands: list[str] | None = None) -> tuple[Counter, dict[str, list[str]]]:
    """Run option cases ``start .. start+n-1`` of ``seed``; returns counts per class and a few
    details of each bad class."""
    counts: Counter = Counter()
    details: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ettools-optfuzz-") as tmp:
        for i in range(start, start + n):
            case = Path(tmp) / f"case{i}"
            try:
                name, args, kind = make_args(i, seed, commands)
                cls, detail = run_options_case(name, args, kind, case)
            except Exception as e:  # a harness bug, not the tool's: counted, and the run goes on
                cls, detail = "harness", f"case {i}: {type(e).__name__}: {e}"
            counts[cls] += 1
            if cls in BAD_CLASSES and len(details.setdefault(cls, [])) < keep:
                details[cls].append(f"case {i}: {detail}")
            with contextlib.suppress(OSError):
                shutil.rmtree(case)
    return counts, details
