"""``ettools capture --emulate GPU``: capture an unmodified program as if it ran on GPUs.

The program runs here, under the emulated device (:mod:`ettools.converters.emulate`): a
``sitecustomize`` on ``PYTHONPATH`` sets emulation up in every Python process it starts. A
``torchrun`` command is not run as such: its script is run once per rank (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` set; ``--jobs`` at a time), since no rendezvous
is needed. Any other command runs once; processes it forks or spawns are emulated too.

Each process's record is then timed on the emulated GPU — device ops by shape on its op model,
collectives on the network of the preset (:mod:`ettools.replay.modelled`), the host's counted
Python events and top-level ops priced by a host-cost table (the shipped
``replay/data/host_costs.json`` or one measured from ``--host-from`` traces,
:mod:`ettools.converters.emulate.host_fit`) — and written as ``rank<N>.kineto.json.gz``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ettools.capture import missing_script, read_state
from ettools.progress import progress

if TYPE_CHECKING:
    from ettools.replay.devices import Hardware

MAX_EMULATED_WORLD = 1 << 20


class EmulateError(Exception):
    """A capture that could not be made (one line; ``exit_code`` for the CLI)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _torchrun(command: Sequence[str]) -> tuple[list[str], int, int] | None:
    """``(script command, processes per node, nodes)`` of a ``torchrun`` command, else None."""
    cmd = list(command)
    if not cmd:
        return None
    head = os.path.basename(cmd[0])
    if head == "torchrun":
        rest = cmd[1:]
    elif len(cmd) > 2 and cmd[1] == "-m" and cmd[2] in ("torch.distributed.run", "torch.distributed.launch"):
        rest = cmd[3:]
    else:
        return None
    nproc, nnodes = 1, 1
    module = False
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        opt, _, val = rest[i].partition("=")
        if opt in ("-m", "--module"):  # torchrun -m pkg.mod: the rest is the module and its arguments
            module = True
            i += 1
            break
        takes = opt in ("--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank",
                        "--master-addr", "--master_addr", "--master-port", "--master_port", "--rdzv-backend",
                        "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id",
                        "--max-restarts", "--max_restarts", "--log-dir", "--log_dir", "--redirects", "--tee")
        if takes and not val:
            i += 1
            val = rest[i] if i < len(rest) else ""
        if opt in ("--nproc-per-node", "--nproc_per_node"):
            nproc = int(val) if val.isdigit() else 1
        elif opt == "--nnodes":
            nnodes = int(val.split(":")[-1]) if val.split(":")[-1].isdigit() else 1
        i += 1
    script = rest[i:]
    if not script:
        return None
    return [sys.executable, *(["-m"] if module else []), *script], nproc, nnodes


def run_emulated(command: Sequence[str], gpu: Hardware, world: int | None, steps: tuple[int, int],
                 jobs: int = 2, env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 quiet: bool = False, dedup: bool = True, count_host: bool = True
                 ) -> tuple[list[dict[str, Any]], int]:
    """Run ``command`` under emulation; ``(raw records of the processes, exit status)``;
    ``count_host``: count the program's Python events and top-level calls for the host-cost table
    (off when host time is measured: counting slows the program down)."""
    from ettools.converters.emulate import native

    if not command:
        raise EmulateError("no command given: ettools capture --emulate GPU [OPTIONS] -- python train.py ...")
    tr = _torchrun(command)
    if tr is None and world is not None and world > 1:
        # --world N with a plain command: launched once per rank, as torchrun would launch it
        tr = (list(command), min(world, int(gpu.network["gpus_per_node"])), 1)
    if tr is not None:
        script, nproc, nnodes = tr
        world = world or nproc * nnodes
        if world > MAX_EMULATED_WORLD:  # sizes the rank list and the files written
            raise EmulateError(f"torchrun asks for {nproc} x {nnodes} = {world:,} ranks: at most "
                               f"{MAX_EMULATED_WORLD:,} can be emulated")
        per_node = nproc if world == nproc * nnodes else int(gpu.network["gpus_per_node"])
    missing = missing_script(command, cwd)  # after the option checks: those are the user's first error
    if missing is not None:
        raise EmulateError(f"the command's script {missing} does not exist: nothing was run")
    if tr is not None:
        runs = [(script, {"RANK": str(r), "LOCAL_RANK": str(r % per_node), "WORLD_SIZE": str(world),
                          "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(r // per_node),
                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}) for r in range(world)]
    else:
        world = 1
        runs = [(list(command), {})]
    try:
        native.library_path()  # build once here, not in every rank
    except native.EmulationUnavailable as e:
        raise EmulateError(str(e)) from None
    with tempfile.TemporaryDirectory(prefix="ettools-emulate-") as tmp:
        boot = Path(tmp) / "boot"
        state = Path(tmp) / "state"
        boot.mkdir()
        state.mkdir()
        (boot / "sitecustomize.py").write_text(
            "from ettools.converters.emulate.boot import activate\nactivate()\n")
        base = dict(os.environ if env is None else env)
        old = base.get("PYTHONPATH")
        base["PYTHONPATH"] = str(boot) + (os.pathsep + old if old else "")
        base["ETTOOLS_EMULATE"] = json.dumps({"gpu": gpu.to_dict(), "world": world, "steps": list(steps), "state": str(state),
                                             "count_host": count_host})
        status = 0
        probe = _probe_ranks(len(runs)) if dedup and tr is not None else list(range(len(runs)))
        demand = _Demand(state / "objects", runs)
        status = _run_all([runs[i] for i in probe], base, cwd, jobs, quiet, len(runs), demand)
        raws = _read_raws(state)
        rest = [i for i in range(len(runs)) if i not in probe and i not in demand.started]
        if rest and any(r.get("error") for r in raws):
            rest = []  # a probed rank failed (out of memory, an unanswerable call): the others would too
        if rest:
            same = _uniform(raws, world)
            if same is not None:
                raws += [{**same, "rank": r, "reconstructed_from": same["rank"]} for r in rest]
                if not quiet:
                    print(f"ettools capture: dedup: {len(probe)} of {len(runs)} ranks emulated "
                          f"({', '.join(map(str, probe))}), identical op streams with every collective over the "
                          f"whole world: the other {len(rest)} reconstructed from rank {same['rank']}", file=sys.stderr)
            else:
                if not quiet:
                    print(f"ettools capture: dedup: ranks {', '.join(map(str, probe))} differ (or use sub-groups): "
                          f"emulating all {len(runs)}", file=sys.stderr)
                status = status or _run_all([runs[i] for i in rest], base, cwd, jobs, quiet, len(runs), demand)
                raws = _read_raws(state)
    return raws, status


class _Demand:
    """Ranks a running rank waits for (a Python object from them: :mod:`ettools.converters.emulate.
    objects` writes ``need.<rank>`` in ``folder``), and every rank started so far."""

    def __init__(self, folder: Path, runs: list[tuple[list[str], dict[str, str]]]) -> None:
        self.folder = folder
        self.runs = runs
        self.started: set[int] = set()

    def wanted(self) -> list[int]:
        """Ranks asked for and not started yet, in rank order."""
        if not self.folder.is_dir():
            return []
        asked = {int(p.name.split(".", 1)[1]) for p in self.folder.glob("need.*") if p.name.split(".", 1)[1].isdigit()}
        return sorted(r for r in asked if 0 <= r < len(self.runs) and r not in self.started)


def _run_all(runs: list[tuple[list[str], dict[str, str]]], base: dict[str, str], cwd: Any, jobs: int, quiet: bool,
             total: int, demand: _Demand | None = None) -> int:
    """Run ``runs`` ``jobs`` at a time; the first non-zero exit status (0 when all succeeded). A
    rank that ``demand`` says another one waits for starts at once, beyond ``jobs`` (else both wait).
    A rank that fails ends the others (said on stderr): one may be waiting for it forever."""
    status = 0
    pending = list(runs)
    active: list[subprocess.Popen] = []
    ranks_of: dict[int, str] = {}
    done = 0
    batch = len(runs)  # grows by the ranks started on demand

    def start(cmd: list[str], extra: dict[str, str]) -> None:
        try:
            proc = subprocess.Popen(cmd, env={**base, **extra}, cwd=cwd,
                                    stdout=subprocess.DEVNULL if quiet else None, start_new_session=True)
        except FileNotFoundError:
            raise EmulateError(f"command not found: {cmd[0]}", 127) from None
        active.append(proc)
        ranks_of[proc.pid] = extra.get("RANK", "0")
        if demand is not None:
            demand.started.add(int(extra.get("RANK", "0")))

    try:
        while pending or active:
            if demand is not None:
                pending = [run for run in pending if int(run[1].get("RANK", "0")) not in demand.started]
            while pending and len(active) < max(1, jobs):
                start(*pending.pop(0))
            if not active:
                continue
            # every rank is watched (each stays in ``active`` while running: a signal here ends it too)
            while not (ended := [p for p in active if p.poll() is not None]):
                for r in demand.wanted() if demand is not None else ():
                    start(*demand.runs[r])
                    batch += 1
                time.sleep(0.02)
            for proc in ended:
                active.remove(proc)
                done += 1
                status = status or proc.returncode
                if not quiet and total > 1:
                    print(f"ettools capture: emulated rank {ranks_of[proc.pid]} ({done} of {batch} in this batch, "
                          f"world {total})", file=sys.stderr)
            failed = next((p for p in ended if p.returncode), None)
            if failed is not None:  # as torchrun does: one rank failed, the job ends (its peers may wait on it)
                if active:  # what the rank recorded (out of memory, an unanswerable op) is said by the caller
                    print(f"ettools capture: emulated rank {ranks_of[failed.pid]} exited with status "
                          f"{failed.returncode}: the other {len(active)} running rank(s) ended, as torchrun ends "
                          "a job", file=sys.stderr)
                raise _RankFailed(status)
    except _RankFailed:
        _end(active)
        return status
    except BaseException:  # Ctrl-C, SIGTERM (the CLI raises on it), an error: end every rank's process tree
        _end(active)
        raise
    return status


class _RankFailed(Exception):
    """An emulated rank exited with an error: the others are ended."""


def _end(active: list[subprocess.Popen]) -> None:
    """End every process tree in ``active``: SIGTERM, then SIGKILL after 2 s."""
    for p in active:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            continue
    for p in active:
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _read_raws(state: Path) -> list[dict[str, Any]]:
    return read_state(state, "raw.*.json")


def _probe_ranks(world: int) -> list[int]:
    """The ranks emulated first when deduplicating: the first two and the last."""
    return sorted({0, min(1, world - 1), world - 1})


def _structure(raw: dict[str, Any]) -> bytes:
    """A rank's op stream with every rank number left out: names, operands, kinds, collective
    types, sizes and group sizes, in order."""
    rows = raw.get("rows") or []
    keyed = [(r[0], r[2], r[3], r[9], (r[10]["coll"], r[10]["in_nelems"], r[10]["out_nelems"], len(r[10]["ranks"]))
              if r[10] and "coll" in r[10] else None) for r in rows]
    return orjson.dumps([raw.get("steps"), keyed])


def _uniform(raws: list[dict[str, Any]], world: int) -> dict[str, Any] | None:
    """A probed rank's record when every probed rank recorded the same op stream and every
    collective spans the whole world with no send/recv (then the other ranks' streams are the
    same with their own rank), else None."""
    rec = [r for r in raws if r.get("steps")]
    if len(rec) < 2 or any(r.get("error") for r in raws):
        return None
    first = _structure(rec[0])
    if any(_structure(r) != first for r in rec[1:]):
        return None
    for row in rec[0]["rows"]:
        c = row[10]
        if c and "coll" in c and (c["coll"] in ("send", "recv") or len(c["ranks"]) != world):
            return None
    return next((r for r in rec if int(r.get("rank", 0)) == 1), rec[-1])


_COST_KEYS = ("top_op_us", "launch_op_us", "python_event_us", "launch_call_us", "sync_us")


def _host_words(costs: dict[str, Any] | None) -> str:
    """How the host time was modelled, for the summary line."""
    src = f"measured from {len(costs.get('traces') or [])} --host-from trace(s)" if costs else "the shipped table"
    return (f"modelled from the program's Python events and top-level ops ({src}: real hosts as profiled with "
            "record_shapes and with_stack)")


def time_and_write(raws: list[dict[str, Any]], gpu: Hardware, outdir: Path, host: str = "modelled",
                   costs: dict[str, Any] | None = None) -> tuple[list[Path], dict[str, Any]]:
    """Time every recorded process on ``gpu`` and write its Kineto trace; ``(files, summary)``;
    ``costs``: the host-cost table (default: the shipped ``replay/data/host_costs.json``)."""
    from importlib import resources

    import numpy as np

    from ettools.converters.emulate.kineto_out import layout
    from ettools.converters.kineto_comm import collective_kind
    from ettools.replay.modelled import FLOOR, collective_times, device_op_times

    if costs is None:
        costs = json.loads(resources.files("ettools.replay").joinpath("data/host_costs.json").read_text())
    recorded = [r for r in raws if r.get("steps")]
    world = max((int(r.get("world", 1)) for r in recorded), default=1)
    outdir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    summary: dict[str, Any] = {"ranks": [], "device_ops": 0, "device_us": 0.0, "floor_us": 0.0, "floor_ops": {},
                               "placeholder_reads": 0, "event_timings": 0, "compiled": 0, "peak_memory": 0,
                               "capacity": int(gpu.memory_bytes)}
    seen: set[int] = set()
    timed: dict[int, Any] = {}
    for raw in progress(sorted(recorded, key=lambda r: int(r.get("rank", 0))), "writing ranks", unit="rank"):
        rank = int(raw.get("rank", 0))
        if rank in seen:
            continue
        seen.add(rank)
        raw["gpu_spec"] = gpu.to_dict()
        rows = raw["rows"]
        in_steps = sorted({i for _, a, b in raw["steps"] for i in range(a, b)})
        kern = [i for i in in_steps if rows[i][9] == "kernel" and rows[i][5] == "cuda"]
        if id(rows) not in timed:  # ranks reconstructed by dedup share their rows: time them once
            timed[id(rows)] = device_op_times([(rows[i][0], rows[i][2], rows[i][3], rows[i][4]) for i in kern], gpu)
        t, how = timed[id(rows)]
        kernel_us = dict(zip(kern, t.tolist()))
        comms = [i for i in in_steps if rows[i][9] == "comm" and rows[i][10]]
        described = []
        for i in comms:
            c = dict(rows[i][10])
            kind = collective_kind(c["coll"])
            c["comm_type"] = int(kind[1]) if kind is not None else None
            c["self"] = rank
            described.append(c)
        comm_us = dict(zip(comms, collective_times(described, gpu, world).tolist()))
        trace = layout(raw, kernel_us, comm_us, costs, host=host)
        trace["ettools"]["host_costs"] = {k: costs[k] for k in _COST_KEYS if k in costs}
        trace["ettools"]["host_costs"]["traces"] = list(costs.get("traces") or [])
        path = outdir / f"rank{rank}.kineto.json.gz"
        part = path.with_name(path.name + ".part")
        with open(part, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
            gz.write(orjson.dumps(trace))
        os.replace(part, path)
        files.append(path)
        summary["ranks"].append(rank)
        summary["device_ops"] += len(kern)
        summary["device_us"] += float(np.sum(t))
        for i, h in zip(kern, how):
            if h == FLOOR:
                summary["floor_us"] += kernel_us[i]
                summary["floor_ops"][rows[i][0]] = summary["floor_ops"].get(rows[i][0], 0) + 1
        summary["placeholder_reads"] += int(raw.get("placeholder_reads") or 0)
        summary["event_timings"] += int(raw.get("event_timings") or 0)
        summary["compiled"] = max(summary["compiled"], int(raw.get("compiled") or 0))
        summary["peak_memory"] = max(summary["peak_memory"], int(raw.get("peak_memory") or 0))
    return files, summary


def run_capture_emulated(command: list[str], outdir: Path, gpu_name: str, world: int | None,
                         steps: tuple[int, int], host: str = "modelled", jobs: int = 2,
                         gpu_memory: float | None = None, quiet: bool = False,
                         host_costs: dict[str, Any] | None = None) -> int:
    """The CLI's emulated capture; returns its exit code (problems: one line on stderr)."""
    from ettools.replay.compute import load_hardware

    gpu = load_hardware(gpu_name)
    if gpu_memory is not None:
        gpu = gpu.replace(memory_bytes=int(gpu_memory * (1 << 30)))
    try:
        raws, status = run_emulated(command, gpu, world, steps, jobs=jobs, quiet=quiet,
                                    count_host=host == "modelled")
    except EmulateError as e:
        print(f"ettools capture: {e}", file=sys.stderr)
        return e.exit_code
    errors = [r["error"] for r in raws if r.get("error")]
    ooms = [r for r in raws if r.get("oom")]
    if ooms:
        ranks = sorted({int(r.get("rank", 0)) for r in ooms})
        print(f"ettools capture: OUT OF MEMORY on emulated rank(s) {ranks[:8]}{'…' if len(ranks) > 8 else ''}: "
              f"{ooms[0]['error']}", file=sys.stderr)
        return 1
    if not any(r.get("steps") for r in raws):
        if errors:
            print(f"ettools capture: {errors[0]}", file=sys.stderr)
            return status or 2
        if status:  # the program failed: that is the cause, not how it stepped
            print(f"ettools capture: the emulated program exited with status {status} before a step was captured",
                  file=sys.stderr)
            return status
        opt = max((int(r.get("optimizer_steps") or 0) for r in raws), default=0)
        calls = max((int(r.get("root_calls") or 0) for r in raws), default=0)
        what = (f"the program ran {opt} optimizer step{'s' if opt != 1 else ''}" if opt else
                f"the program stepped no optimizer and called a top-level module {calls} time(s) "
                "(each call is a step then)")
        print(f"ettools capture: no step captured: asked for steps {steps[0]}-{steps[1]}, {what}", file=sys.stderr)
        return status or 2
    tmp = Path(tempfile.mkdtemp(prefix=".ettools-emulate-", dir=outdir.parent if outdir.parent.exists() else None))
    try:
        files, summary = time_and_write(raws, gpu, tmp, host=host, costs=host_costs)
        outdir.mkdir(parents=True, exist_ok=True)
        for old in outdir.glob("rank*.kineto.json.gz"):
            old.unlink()
        for f in files:
            os.replace(f, outdir / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for e in errors:  # what stopped a failed program; a warning when the program went on
        print(f"ettools capture: {'' if status else 'warning: '}{e}", file=sys.stderr)
    if not quiet:
        gib = 1 << 30
        floor = summary["floor_us"] / summary["device_us"] * 100 if summary["device_us"] else 0.0
        print(f"ettools capture: emulated {gpu.name}: {len(summary['ranks'])} rank(s) written to {outdir}; "
              f"{summary['device_ops']:,} device ops, times modelled on {gpu.preset} "
              f"({100 - floor:.1f} % of device time by shape, {floor:.1f} % at the launch floor); host time "
              f"{'measured on this machine' if host == 'measured' else _host_words(host_costs)}; peak memory "
              f"{summary['peak_memory'] / gib:.2f} of {summary['capacity'] / gib:.0f} GiB", file=sys.stderr)
        if summary["floor_ops"]:
            top = sorted(summary["floor_ops"].items(), key=lambda kv: -kv[1])[:6]
            print("ettools capture: at the launch floor (no shape model): "
                  + ", ".join(f"{k} ×{v}" for k, v in top), file=sys.stderr)
        if summary["placeholder_reads"]:
            print(f"ettools capture: warning: {summary['placeholder_reads']} value(s) read from device tensors "
                  "(.item(), comparisons) were answered with 0: control flow that depends on them is not faithful",
                  file=sys.stderr)
        if summary["event_timings"]:
            print(f"ettools capture: warning: {summary['event_timings']} CUDA event timing(s) (Event.elapsed_time) "
                  "were answered NaN: no kernel runs here; `ettools replay` of the capture gives the modelled times",
                  file=sys.stderr)
        if summary["compiled"]:
            print(f"ettools capture: warning: the program called torch.compile {summary['compiled']} time(s): the "
                  "compiled regions were recorded as their eager PyTorch ops (a GPU run fuses some of them into "
                  "generated kernels, which are not modelled)", file=sys.stderr)
    if status:  # as a real capture: the steps are written, the program's failure is the exit status
        print(f"ettools capture: the emulated program exited with status {status} after its captured steps",
              file=sys.stderr)
    return status
