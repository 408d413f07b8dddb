"""A seeded, deterministic fuzzer of the ettools CLI on mutants of real traces.

Each case: pick a seed trace, mutate it (a JSON value swapped for an adversarial one, a key
dropped, an item duplicated, bytes truncated or flipped, gzip of garbage), run one command
(``info``, ``convert`` to Chakra or ASTRA-sim JSON, ``replay``, ``scale --dp 2``, ``validate`` of the
unmutated seed against the mutant) in-process and classify the outcome:

- ``ok``: exit 0;  ``clean``: exit 2 with one ``ettools: error:`` line;  ``exit1``: exit 1 (a
  deadlock or a gate, one line);
- ``traceback``: any other exception escaped (a crash);  ``hang``: over the time limit;
- ``exit2-lines``: exit 2 whose stderr is not one ``ettools: error:`` line;
- ``leftover``: a failed run left files in its output folder (or a staging folder anywhere);
- ``oom``: exit 2 "out of memory"; ``exit1-undocumented``: exit 1 other than a documented gate.

Same seed, same cases, same outcomes. Used by ``test_fuzz_bounded.py`` (a few hundred cases)
and ``run_long.py`` (as many as you like, counts per class).
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import random
import shutil
import signal
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner

from ettools.cli import main

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces"

# small seeds, each read in well under a second
SEEDS = [
    REPO / "sample_traces/single/rank0.kineto.json.gz",
    REPO / "sample_traces/single/rank0.et.json.gz",
    SHARED / "astrasim_json/small_workload.json",
    SHARED / "pytorch_et/chakra_2rank_nccl/rank0_et.json.gz",
    SHARED / "kineto/hta_fwdbwd_1rank",
    SHARED / "triosim/vgg13_h100_bs128",
]

DEEP = object()  # placeholder: a list nested 1,000-5,000 deep, spliced into the text
ADVERSARIAL: list[Any] = [None, True, -1, -(2**63), 2**64, 2**70, 10**23, 1e308, -1e-9, "", "\x00\x1b[31m",
                          "x" * 5000, [], {}, [1, [2]], {"a": {"b": 1}}, "NaN", 0, 3.5, DEEP]
MAX_EVENTS = 4000
BAD_CLASSES = ("traceback", "hang", "leftover", "oom", "exit1-undocumented", "exit2-lines", "harness")
COMMANDS = [("info",), ("convert", "--to", "chakra"), ("convert", "--to", "astrasim-json"), ("replay",),
            ("scale", "--dp", "2"), ("validate",)]


def _seed_files(seed: Path) -> list[Path]:
    if seed.is_dir():
        return sorted(p for p in seed.iterdir() if p.is_file())
    return [seed]


class _Seed:
    """One seed file read once: its bytes as on disk, uncompressed, and parsed (None if not JSON).

    Mutants are made in place on the parsed document and undone after dumping (a copy of a 15 MB
    trace per case would cost more than the run itself)."""

    def __init__(self, p: Path) -> None:
        self.name = p.name
        self.disk = p.read_bytes()
        self.gz = self.disk[:2] == b"\x1f\x8b"
        self.data = gzip.decompress(self.disk) if self.gz else self.disk
        try:
            self.doc = orjson.loads(self.data) if self.data.lstrip()[:1] in (b"{", b"[") else None
        except orjson.JSONDecodeError:
            self.doc = None
        ev = self.doc.get("traceEvents") if isinstance(self.doc, dict) else None
        if isinstance(ev, list) and len(ev) > MAX_EVENTS:
            # a big Kineto seed is cut to a time window holding its first MAX_EVENTS timed events
            # (metadata kept): every kind of event of its first steps, at ~1/20 of the cost per run
            ts = sorted(e["ts"] for e in ev if isinstance(e.get("ts"), (int, float)))
            end = ts[MAX_EVENTS - 1]
            self.doc["traceEvents"] = [e for e in ev if not isinstance(e.get("ts"), (int, float)) or e["ts"] <= end]
            self.data = orjson.dumps(self.doc)
            self.disk = gzip.compress(self.data, compresslevel=1, mtime=0) if self.gz else self.data


_CACHE: dict[Path, _Seed] = {}


def _seed(p: Path) -> _Seed:
    if p not in _CACHE:
        _CACHE[p] = _Seed(p)
    return _CACHE[p]


def _walk(obj: Any, rng: random.Random, depth: int = 0) -> tuple[Any, Any] | None:
    """A random (container, key) inside ``obj``, biased toward shallow-but-not-top positions."""
    cur = obj
    found = None
    for _ in range(6):
        if isinstance(cur, dict) and cur:
            k = rng.choice(list(cur))
        elif isinstance(cur, list) and cur:
            k = rng.randrange(len(cur))
        else:
            break
        found = (cur, k)
        cur = cur[k]
        if rng.random() < 0.3:
            break
    return found


def _dumps(doc: Any) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:  # integers beyond 64 bits: the standard encoder writes them
        return json.dumps(doc).encode()


def _mutate_doc(doc: Any, rng: random.Random) -> bytes:
    """Text of ``doc`` with 1-3 JSON-level mutations; ``doc`` is left as it was."""
    undo: list[Any] = []
    deep = None
    try:
        for _ in range(rng.randint(1, 3)):
            spot = _walk(doc, rng)
            if spot is None:
                break
            c, k = spot
            r = rng.random()
            if isinstance(c, dict):
                undo.append(("dict", c, list(c.items())))  # key order restored too
            else:
                undo.append(("list", c, list(c)))
            if r < 0.6:
                v = rng.choice(ADVERSARIAL)
                v = v if v is DEEP else copy.deepcopy(v)  # never a shared (then mutated) container
                if v is DEEP:
                    deep = rng.choice((1000, 5000))
                    v = "@@DEEP@@"
                c[k] = v
            elif r < 0.8 and isinstance(c, dict):
                del c[k]
            elif isinstance(c, list):
                c.insert(k, orjson.loads(_dumps(c[k])))  # a duplicate (same id, same event)
            else:
                c[k] = copy.deepcopy(rng.choice(ADVERSARIAL[:-1]))
        text = _dumps(doc)
    finally:
        for kind, c, saved in reversed(undo):
            if kind == "dict":
                c.clear()
                c.update(saved)
            else:
                c[:] = saved
    if deep:
        text = text.replace(b'"@@DEEP@@"', b"[" * deep + b"1" + b"]" * deep, 1)
    return text


def mutate(seed: _Seed, rng: random.Random) -> bytes:
    """One mutant of a seed file's (uncompressed) bytes."""
    op = rng.random()
    if seed.doc is not None and op < 0.8:
        return _mutate_doc(seed.doc, rng)
    b = bytearray(seed.data)
    if op < 0.88 and b:
        return bytes(b[: rng.randrange(len(b))])  # truncated
    if op < 0.96 and b:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    return b"\x00" * rng.choice((1, 100, 4096))  # NUL bytes


def make_case(i: int, seed_value: int, work: Path) -> tuple[Path, tuple[str, ...]]:
    """Case ``i``: a mutated copy of one seed under ``work`` and the command to run on it
    (``validate`` carries the unmutated seed as its reference)."""
    rng = random.Random(seed_value * 1_000_003 + i)
    seeds = [s for s in SEEDS if s.exists()]
    seed = seeds[rng.randrange(len(seeds))]
    files = _seed_files(seed)
    case = work / f"case{i}"
    case.mkdir(parents=True)
    victim = rng.randrange(len(files))
    for j, f in enumerate(files):
        sd = _seed(f)
        data = sd.disk
        if j == victim:
            data = mutate(sd, rng)
            if sd.gz and rng.random() < 0.9:
                data = gzip.compress(data, compresslevel=1, mtime=0)
        (case / f.name).write_bytes(data)
    target = case if seed.is_dir() else case / files[0].name
    command = COMMANDS[rng.randrange(len(COMMANDS))]
    if command == ("validate",):
        command = ("validate", str(seed))
    return target, command


class _Hang(BaseException):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def run_case(target: Path, command: tuple[str, ...], out: Path, limit_s: int = 30) -> tuple[str, str]:
    """Run one command; returns (outcome class, detail)."""
    if command[0] == "validate":
        args = ["validate", *command[1:], str(target), "-q"]  # reference first, the mutant second
    else:
        args = [command[0], str(target), *command[1:], "-q"]
    if command[0] in ("convert", "scale"):
        args += ["-o", str(out)]
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    try:
        res = CliRunner().invoke(main, args, catch_exceptions=True)
    except _Hang:
        return "hang", " ".join(args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    exc = res.exception
    if isinstance(exc, _Hang):
        return "hang", " ".join(args)
    if exc is not None and not isinstance(exc, SystemExit):
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
        return "traceback", f"{' '.join(args)}\n{tb}"
    leftovers = [p for p in target.parent.rglob(".ettools-stage-*")]
    if res.exit_code != 0 and out.exists() and any(out.iterdir()):
        leftovers += list(out.iterdir())
    if leftovers:
        return "leftover", f"{' '.join(args)}: {leftovers[:3]}"
    return exit_class(res, " ".join(args))


# exit 1 is a documented gate only here: a replay's deadlock, validate over its --tolerance
GATES = ("ettools: replay: deadlock", "ettools: validate:")


def exit_class(res: Any, shown: str) -> tuple[str, str]:
    """Class of a run that raised nothing: ``ok``; ``clean`` (exit 2, one ``ettools: error:``
    line; ``oom`` when that line is "out of memory": a number reached an allocation unchecked);
    ``exit1`` (a documented gate, :data:`GATES`) or ``exit1-undocumented``; ``exit2-lines``: exit 2
    whose stderr is not that one line; any other exit code: ``traceback``."""
    if res.exit_code == 0:
        return "ok", ""
    lines = res.stderr.strip().splitlines()
    one = len(lines) == 1 and lines[0].startswith("ettools: error:") and len(lines[0]) < 400
    if res.exit_code == 2 and one:
        return ("oom" if lines[0].endswith("out of memory") else "clean"), f"{shown}: {lines[0]}"
    if res.exit_code == 1 and lines and lines[-1].startswith(GATES):
        return "exit1", lines[-1]
    if res.exit_code == 1:
        return "exit1-undocumented", f"{shown}: {res.stderr[-300:]!r}"
    if res.exit_code == 2:
        return "exit2-lines", f"{shown}: {res.stderr[-500:]!r}"
    return "traceback", f"{shown}: exit {res.exit_code}, stderr {res.stderr[-500:]!r}"


def fuzz(n: int, seed: int = 0, start: int = 0, keep: int = 5) -> tuple[Counter, dict[str, list[str]]]:
    """Run cases ``start .. start+n-1`` of ``seed``; returns counts per class and a few details each."""
    counts: Counter = Counter()
    details: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ettools-fuzz-") as tmp:
        work = Path(tmp)
        for i in range(start, start + n):
            try:
                target, command = make_case(i, seed, work)
            except Exception as e:  # a harness bug, not the tool's: counted, and the run goes on
                cls, detail = "harness", f"make_case: {type(e).__name__}: {e}"
            else:
                cls, detail = run_case(target, command, work / f"out{i}")
            counts[cls] += 1
            if cls in BAD_CLASSES and len(details.setdefault(cls, [])) < keep:
                details[cls].append(f"case {i}: {detail}")
            with contextlib.suppress(OSError):
                shutil.rmtree(work / f"case{i}")
                shutil.rmtree(work / f"out{i}")
    return counts, details
