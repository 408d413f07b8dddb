"""``ettools capture``: run an unmodified PyTorch script under the profiler and the ET observer.

The command runs as a child process with a bootstrap ``sitecustomize.py`` first on
``PYTHONPATH`` (see :mod:`ettools._capture_boot`). Every Python process it starts inherits the
variable, so launchers work unchanged: ``torchrun`` workers, ``multiprocessing`` children (fork or
spawn). In each process the bootstrap waits for ``import torch``, counts optimizer steps, and
records steps ``first..last`` (1-based) with the PyTorch profiler (shapes, optional memory) and
the Execution Trace observer. Each process that recorded a step writes
``rank<N>.kineto.json.gz`` and ``rank<N>.et.json.gz`` to the output folder (N: the
``torch.distributed`` rank when initialized, else ``$RANK``, else 0), gzipped with mtime 0 and
renamed into place. ``ProfilerStep#N`` spans carry the optimizer step number N.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ettools import _capture_boot

TORCH_HINT = (
    "torch is not installed: pip install torch==2.13.0 (or the extra: pip install 'ettools[capture]')"
)
_OUR_FILES = re.compile(r"^rank\d+\.(kineto|et)\.json\.gz$")


class CaptureError(Exception):
    """A capture that could not be made; ``exit_code`` is what the CLI should exit with."""

    def __init__(self, message: str, exit_code: int = 2, result: CaptureResult | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.result = result  # the run's outcome (output, process statuses) when it ran


@dataclass
class CaptureResult:
    """What one capture run produced."""

    returncode: int
    files: list[Path] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    steps_seen: int = 0
    captured_steps: list[int] = field(default_factory=list)
    processes: list[dict] = field(default_factory=list)
    stdout: bytes | None = None
    stderr: bytes | None = None


def read_state(folder: Path, pattern: str) -> list[dict]:
    """The JSON files the capture's processes left in ``folder`` (matching ``pattern``), in name
    order; a file a killed process left half-written is skipped."""
    out = []
    for p in sorted(folder.glob(pattern)):
        try:
            out.append(orjson.loads(p.read_bytes()))
        except (OSError, orjson.JSONDecodeError):
            continue
    return out


def parse_steps(text: str) -> tuple[int, int]:
    """Parse ``"N"`` or ``"N-M"`` (1-based optimizer steps) into ``(first, last)``."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not m:
        raise ValueError(f"steps must be N or N-M, got {text!r}")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else first
    _check_steps((first, last))
    return first, last


def _check_steps(steps: tuple[int, int]) -> None:
    first, last = steps
    if first < 1 or last < first:
        raise ValueError(f"steps must satisfy 1 <= first <= last, got {first}-{last}")


def missing_script(command: Sequence[str], cwd: str | os.PathLike | None = None) -> str | None:
    """The script a command runs (its first argument ending in ``.py``: ``python train.py``,
    ``torchrun ... train.py``) when no such file exists, else None: checked before anything runs,
    so a typo is one line, not a launcher's traceback from every rank."""
    script = next((a for a in command[1:] if a.endswith(".py") and not a.startswith("-")), None)
    if script is None:
        return None
    path = Path(script) if cwd is None or Path(script).is_absolute() else Path(cwd) / script
    return None if path.is_file() else script


def capture(
    command: Sequence[str],
    outdir: str | os.PathLike,
    steps: tuple[int, int] = (2, 2),
    memory: bool = True,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
) -> CaptureResult:
    """Run ``command`` with capture active on optimizer steps ``steps``; raise on failure.

    Returns a :class:`CaptureResult` when at least one process captured a step (also when the
    script then failed: ``returncode`` is the script's). Raises :class:`CaptureError` when
    nothing was captured: torch missing (exit code 2), the script failed (its exit code), or it
    ran fewer optimizer steps than asked for (exit code 2, message says how many it ran).
    ``env`` replaces ``os.environ`` as the base environment of the child; ``cwd``, ``stdout``
    and ``stderr`` go to :class:`subprocess.Popen` (with ``subprocess.PIPE`` the output is
    returned in the result).
    """
    if not command:
        raise CaptureError("no command given: ettools capture [OPTIONS] -- python train.py ...")
    _check_steps(steps)
    missing = missing_script(command, cwd)
    if missing is not None:
        raise CaptureError(f"the command's script {missing} does not exist: nothing was run")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in outdir.iterdir() if _OUR_FILES.match(p.name)}

    with tempfile.TemporaryDirectory(prefix="ettools-capture-") as tmp:
        boot = Path(tmp) / "boot"
        state = Path(tmp) / "state"
        boot.mkdir()
        state.mkdir()
        shutil.copyfile(_capture_boot.__file__, boot / "sitecustomize.py")
        child_env = dict(os.environ if env is None else env)
        old_pp = child_env.get("PYTHONPATH")
        child_env["PYTHONPATH"] = str(boot) + (os.pathsep + old_pp if old_pp else "")
        child_env[_capture_boot._ENV_OUT] = str(outdir.resolve())
        child_env[_capture_boot._ENV_STEPS] = f"{steps[0]}-{steps[1]}"
        child_env[_capture_boot._ENV_MEMORY] = "1" if memory else "0"
        child_env[_capture_boot._ENV_STATE] = str(state)
        try:
            proc = subprocess.Popen(list(command), env=child_env, cwd=cwd, stdout=stdout, stderr=stderr)
        except FileNotFoundError:
            raise CaptureError(f"command not found: {command[0]}", 127) from None
        except PermissionError:
            raise CaptureError(f"command not executable: {command[0]}", 126) from None
        try:
            out, err = proc.communicate()
        except KeyboardInterrupt:
            out, err = proc.communicate()  # the child got the SIGINT too
        rc = proc.returncode
        statuses = read_state(state, "status.*.json")

    files = sorted({Path(f) for s in statuses for f in s.get("files") or []})
    files = [f for f in files if f.exists()]
    seen = max((s.get("steps") or 0 for s in statuses), default=0)
    result = CaptureResult(
        returncode=rc,
        files=files,
        ranks=sorted({s["rank"] for s in statuses if s.get("files")}),
        steps_seen=seen,
        captured_steps=sorted({n for s in statuses for n in s.get("captured") or []}),
        processes=statuses,
        stdout=out,
        stderr=err,
    )
    if files:
        written = {f.name for f in files}
        for name in before - written:  # a previous capture's ranks that this run did not write
            (outdir / name).unlink(missing_ok=True)
        return result

    errors = [s["error"] for s in statuses if s.get("error")]
    if any(s.get("torch_error") == "missing" for s in statuses):
        raise CaptureError(TORCH_HINT, 2, result)
    broken = [s["torch_error"] for s in statuses if s.get("torch_error")]
    if broken:
        raise CaptureError(f"torch failed to import: {broken[0].removeprefix('broken: ')}", 2, result)
    if errors:
        raise CaptureError(f"capture failed: {errors[0]}", rc or 2, result)
    asked = f"step {steps[0]}" if steps[0] == steps[1] else f"steps {steps[0]}-{steps[1]}"
    if not any(s.get("torch_version") for s in statuses):
        what = "the script never imported torch"
    else:
        n = len([s for s in statuses if s.get("torch_version")])
        what = f"the script ran {seen} optimizer step{'s' if seen != 1 else ''}" + (
            f" (most in any of {n} processes)" if n > 1 else ""
        )
    if rc != 0:
        raise CaptureError(f"script exited with code {rc} before {asked} was captured: {what}", rc, result)
    raise CaptureError(f"no step captured: asked for {asked}, {what}", 2, result)


def run_capture(
    command: list[str],
    outdir: Path,
    steps: tuple[int, int] = (2, 2),
    memory: bool = True,
    quiet: bool = False,
) -> int:
    """Run ``command`` under capture; return the exit code for the CLI.

    The script's own exit code is passed through. Problems are printed as one line on stderr
    (``ettools capture: ...``) with exit code 2 (or the script's when it failed). Unless
    ``quiet``, a summary line names the files written.
    """
    try:
        res = capture(command, outdir, steps=steps, memory=memory)
    except (CaptureError, ValueError) as e:
        print(f"ettools capture: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    for proc in res.processes:
        if proc.get("error"):
            print(f"ettools capture: warning: process {proc['pid']}: {proc['error']}", file=sys.stderr)
    want = list(range(steps[0], steps[1] + 1))
    if res.captured_steps != want:
        print(
            f"ettools capture: warning: captured steps {res.captured_steps}, asked for {want} "
            "(the script ended inside the window)",
            file=sys.stderr,
        )
    if not quiet:
        stepdesc = "-".join(str(n) for n in sorted({res.captured_steps[0], res.captured_steps[-1]}))
        ranks = ",".join(str(r) for r in res.ranks)
        print(
            f"ettools capture: step {stepdesc} from {len(res.ranks)} rank(s) ({ranks}): "
            f"{len(res.files)} files in {outdir}",
            file=sys.stderr,
        )
    if res.returncode != 0:
        print(f"ettools capture: the script exited with code {res.returncode}", file=sys.stderr)
    return res.returncode
