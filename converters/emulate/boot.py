"""Child-process side of ``ettools capture --emulate``: set up the emulated device, choose the
steps, write what was recorded.

:func:`activate` runs from the ``sitecustomize`` that ``ettools capture`` puts first on
``PYTHONPATH``, before the program imports torch. Configuration comes from ``ETTOOLS_EMULATE``
(JSON: the GPU preset, world size, steps, the state folder).

Which ops are the captured steps:

* a training program (it constructs an optimizer): steps are optimizer steps, as in a real
  capture — recording starts when step ``first - 1`` returns (``first == 1``: when the optimizer
  is constructed) and stops when step ``last`` returns; the process then writes its record and
  ends (the rest of the run would only repeat the same steps);
* a program that never steps an optimizer (inference): step ``n`` is the ``n``-th call of a root
  module (a module called outside any other module's forward), up to the next such call; the
  process ends when the call after step ``last`` begins.

``torch.compile`` is counted, not run: the fake device has no compiler, so compiled regions record
their eager PyTorch ops (a GPU run would fuse some into generated kernels) and the capture says so.

Each process writes ``raw.<pid>.json`` in the state folder: its rank, the recorded rows and
step boundaries, peak memory, values it could not answer, and the error that stopped it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import traceback
from typing import Any

_ENV = "ETTOOLS_EMULATE"


class _Session:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.first, self.last = cfg["steps"]
        self.opt_steps = 0
        self.optimizer: int | None = None
        self.steps: list[list[int]] = []  # [step number, first row, end row]
        self.roots: list[int] = []  # row index at each root-module call (inference steps)
        self.compiled = 0  # torch.compile calls (their regions run as eager ops: module doc)
        self.error: str | None = None
        self.done = False
        self.pid = os.getpid()

    def setup(self) -> None:
        from . import native

        native.load()
        import torch

        from . import device, dist, recorder

        local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) or 0)
        from ettools.replay.devices import Hardware

        # the hardware travels as its JSON form (Hardware.to_dict) in ETTOOLS_EMULATE
        mode, state, memory = device.install(Hardware.from_dict(self.cfg["gpu"]), local_rank=local)
        rec = recorder.Recorder(state, memory, dist.describe, dist.dispatched, dist.EmulatedGroup, mode)
        dist.install(int(os.environ.get("RANK", "0") or 0), int(self.cfg.get("world", 1)), rec.record_comm,
                     rec.record_wait)
        from . import objects

        objects.install(os.path.join(self.cfg["state"], "objects"), int(os.environ.get("RANK", "0") or 0))
        self.state, self.memory, self.torch = state, memory, torch
        state.on_error = memory.on_oom = self.finish
        device._RECORD_SYNC.append(self._sync)
        count = bool(self.cfg.get("count_host", True))  # for the host-cost table (not with --host measured)
        # the root hook runs before the recorder's module hook: an empty stack means a root call
        roots = self._hook_roots(torch, register=not count)
        pre, post = recorder.install_module_hooks(state, register=not count)
        recorder.install_phase_hooks(state)
        self._hook_optimizer(torch)
        self._count_compile(torch)
        state.recording = True
        mode.__enter__()
        rec.__enter__()
        if count:
            from .hostcount import HostCounter

            state.host = HostCounter(on_enter=(roots, pre), on_exit=(post,))
            state.host.start()
        atexit.register(self.at_exit)
        hook = sys.excepthook

        def excepthook(tp, value, tb):  # noqa: ANN001, ANN202
            self.note_error(value)
            hook(tp, value, tb)

        sys.excepthook = excepthook

    def _sync(self, kind: str) -> None:
        st = self.state
        if st.recording:
            st.add((kind, 0.0, [], [], [], "cuda", st.stream, st.phase, "", "sync", None, []))

    def _hook_roots(self, torch: Any, register: bool = True) -> Any:
        st = self.state

        def pre(module: Any, _args: Any) -> None:
            if not st.modules:  # the hooks of the recorder push after this one: empty means root
                self.roots.append(len(st.rows))
                if self.optimizer is None and len(self.roots) > self.last and not self.done:
                    # no optimizer: each root call is a step, and the one after the last asked for
                    # has begun. Stop the program here, as after the last optimizer step: a loop
                    # whose exit reads device values (generate's stop check, answered 0) never ends
                    self.finish()
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(0)

        if register:
            torch.nn.modules.module.register_module_forward_pre_hook(pre)
        return pre

    def _count_compile(self, torch: Any) -> None:
        original = torch.compile
        session = self

        def compile(*a: Any, **k: Any) -> Any:  # noqa: A001 - stands in for torch.compile
            session.compiled += 1
            return original(*a, **k)

        torch.compile = compile

    def _hook_optimizer(self, torch: Any) -> None:
        from .recorder import _optim_hooks

        opt_cls = torch.optim.Optimizer
        init = opt_cls.__init__
        session = self

        def __init__(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, N807
            init(self, *a, **k)
            if session.optimizer is None:
                session.optimizer = id(self)
                if session.first == 1:
                    session._open(1)

        opt_cls.__init__ = __init__

        def post(opt: Any, *_a: Any) -> None:
            if id(opt) != session.optimizer or session.done:
                return
            session.opt_steps += 1
            n = session.opt_steps
            if n == session.first - 1:
                session._open(n + 1)
            elif session.first <= n <= session.last:
                session.steps[-1][2] = len(session.state.rows)
                if n == session.last:
                    session.finish()
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(0)
                session._open(n + 1)

        _optim_hooks().register_optimizer_step_post_hook(post)

    def _open(self, n: int) -> None:
        if n == self.first:
            self.state.rows.clear()
            self.roots.clear()
        self.steps.append([n, len(self.state.rows), -1])

    def note_error(self, e: BaseException) -> None:
        if self.error is None:
            name = type(e).__name__
            self.error = f"{name}: {e}".splitlines()[0] if str(e) else name

    def _rank(self) -> int:
        try:
            import torch.distributed as d

            if d.is_available() and d.is_initialized():
                return int(d.get_rank())
        except Exception:  # noqa: BLE001 - a broken group still has an env rank
            pass
        return int(os.environ.get("RANK", "0") or 0)

    def _world(self) -> int:
        try:
            import torch.distributed as d

            if d.is_available() and d.is_initialized():
                return int(d.get_world_size())
        except Exception:  # noqa: BLE001
            pass
        return int(os.environ.get("WORLD_SIZE", self.cfg.get("world", 1)) or 1)

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        self.state.recording = False
        rows = self.state.rows
        steps = [s for s in self.steps if s[2] >= 0]
        kind = "optimizer"
        if self.optimizer is None and self.roots:
            kind = "root-forward"
            bounds = [*self.roots, len(rows)]
            steps = [[i + 1, bounds[i], bounds[i + 1]] for i in range(len(self.roots))
                     if self.first <= i + 1 <= self.last]
        out = {"pid": self.pid, "rank": self._rank(), "world": self._world(), "gpu": self.cfg["gpu"].get("preset"),
               "steps": steps, "step_kind": kind, "optimizer_steps": self.opt_steps, "root_calls": len(self.roots),
               "rows": rows if steps else [], "peak_memory": self.memory.peak, "capacity": self.memory.capacity,
               "placeholder_reads": self.state.placeholder_reads, "event_timings": self.state.event_timings,
               "compiled": self.compiled,
               "error": self.memory.oom or self.state.error or self.error, "oom": bool(self.memory.oom),
               "argv": sys.argv}
        self.pid = os.getpid()  # a forked child is its own process
        path = os.path.join(self.cfg["state"], f"raw.{self.pid}.json")
        tmp = path + ".part"
        with open(tmp, "w") as f:
            json.dump(out, f, separators=(",", ":"), default=str)
        os.replace(tmp, path)

    def at_exit(self) -> None:
        try:
            self.finish()
        except Exception:  # noqa: BLE001 - never mask the program's own exit
            traceback.print_exc()


def activate() -> None:
    """Set up emulation in this process when ``ETTOOLS_EMULATE`` asks for it."""
    raw = os.environ.get(_ENV)
    if not raw:
        return
    cfg = json.loads(raw)
    session = _Session(cfg)
    try:
        session.setup()
    except Exception as e:  # noqa: BLE001 - reported through the state folder, one line
        session.error = f"emulation could not start: {type(e).__name__}: {e}".splitlines()[0]
        path = os.path.join(cfg["state"], f"raw.{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"pid": os.getpid(), "error": session.error, "rows": [], "steps": []}, f)
        print(f"ettools capture: {session.error}", file=sys.stderr)
        os._exit(2)
