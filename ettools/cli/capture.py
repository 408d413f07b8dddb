"""``ettools capture``: run an unmodified PyTorch program with the profiler on chosen steps
(or emulate a GPU with ``--emulate``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ettools.cli.common import parse_range
from ettools.cli_options import FiniteRange, handle_errors, quiet_option
from ettools.progress import is_quiet


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-o", "--output", "outdir", type=click.Path(path_type=Path), default=Path("capture"),
              show_default=True, help="Directory for rank<N>.kineto.json.gz and rank<N>.et.json.gz.")
@click.option("--steps", default="2", show_default=True,
              help="Optimizer steps to record: N or N-M, counted from 1 as the script calls optimizer.step(); "
                   "the trace's ProfilerStep#N carry these numbers (what --steps of the other commands takes). A program "
                   "that steps no optimizer counts calls of its top-level module instead (with --emulate it is stopped "
                   "when the call after M begins).")
@click.option("--memory/--no-memory", default=True, show_default=True, help="Record memory events.")
@click.option("--emulate", "emulate", default=None, metavar="GPU",
              help="Do not run on a device: emulate GPU (a hardware preset: H100, A100, MI300X, ...) on this machine, "
                   "record every device op and time it on GPU's models (see README, emulated capture).")
@click.option("--world", type=click.IntRange(1, 1 << 20), default=None,
              help="With --emulate: world size; the command runs once per rank as torchrun would launch it "
                   "(default: torchrun's processes, else 1).")
@click.option("--host", "host", type=click.Choice(["modelled", "measured"]), default="modelled", show_default=True,
              help="With --emulate: host time between ops from the host-cost table of real GPU hosts, or as the "
                   "program spends it on this machine.")
@click.option("--host-from", "host_from", multiple=True, type=click.Path(path_type=Path, exists=True, dir_okay=False),
              metavar="TRACE", help="With --emulate: measure the host-cost table from these real Kineto traces (any "
                                    "program profiled with record_shapes and with_stack on the host to predict) "
                                    "instead of the shipped one. Repeatable.")
@click.option("--gpu-memory", type=FiniteRange(0.001, 1 << 20), default=None, metavar="GIB",
              help="With --emulate: device memory in GiB instead of the preset's.")
@click.option("--jobs", type=click.IntRange(1, 256), default=2, show_default=True,
              help="With --emulate: ranks emulated at once (torchrun commands).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@quiet_option
@handle_errors
def capture(outdir: Path, steps: str, memory: bool, emulate: str | None, world: int | None, host: str,
            host_from: tuple[Path, ...], gpu_memory: float | None, jobs: int, command: tuple[str, ...]) -> None:
    """Run COMMAND (an unmodified PyTorch script or launcher) with the profiler on chosen steps.

    Example: ettools capture -o out --steps 3 -- python train.py --epochs 1

    With --emulate GPU no device is needed: ettools capture --emulate H100 -o out -- torchrun
    --nproc-per-node 8 train.py records each rank's ops on fake tensors and writes Kineto traces whose
    device times are modelled for GPU.
    """
    first, last = parse_range(steps, "--steps")
    if emulate is None:
        for name, value in (("--world", world), ("--gpu-memory", gpu_memory), ("--host-from", host_from or None)):
            if value is not None:
                raise click.UsageError(f"{name} needs --emulate GPU")
        from ettools.capture import run_capture

        sys.exit(run_capture(list(command), outdir, steps=(first, last), memory=memory))
    from ettools.capture_emulate import run_capture_emulated
    from ettools.replay.compute import presets

    if not any(k.lower() == emulate.lower() for k in presets() if not k.startswith("_")):
        raise click.BadParameter(f"unknown GPU {emulate!r} (known: "
                                 f"{', '.join(k for k in presets() if not k.startswith('_'))})", param_hint="--emulate")
    costs = None
    if host_from:
        from ettools.converters.emulate.host_fit import HostFitError, fit_host_costs

        try:
            costs = fit_host_costs(list(host_from))
        except HostFitError as e:
            raise click.BadParameter(str(e), param_hint="--host-from") from None
    sys.exit(run_capture_emulated(list(command), outdir, emulate, world, (first, last), host=host, jobs=jobs,
                                  gpu_memory=gpu_memory, quiet=is_quiet(), host_costs=costs))
