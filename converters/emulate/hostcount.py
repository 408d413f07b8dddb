"""What the program's host does between two recorded ops, counted the way the PyTorch profiler
sees it, so that an emulated capture can charge host time by a host-cost table
(:mod:`.host_fit`) instead of by this machine's clock:

* **Python events**: every Python function call and builtin call the program makes (the events
  ``with_stack`` profiling records as ``python_function``; the profiler's tracer uses the same
  ``sys.setprofile`` hook). Calls made by the emulator itself — the recorder, the fake tensor
  machinery under it, the hooks it installs — are not the program's and are not counted: every
  call inside a frame of this package is skipped until that frame returns.
* **Top-level ops**: torch API calls made from Python (``torch.matmul``, ``x + y``,
  ``F.layer_norm``), counted by a torch-function mode. Each starts one top-level ``cpu_op`` of a
  real trace; the aten ops it dispatches (``aten::t`` + ``aten::addmm`` for a ``linear``) are its
  children, so the first recorded op after a new torch call is marked as starting a top-level op.
  The autograd engine calls no Python: each backward op is taken as its own top-level op.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# frames of the emulator (this package, the ettools boot code) and of torch's torch-function
# dispatch, which runs only because the counting mode below is active: not the program's calls
_OWN = (str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2] / "ettools"),
        str(Path(torch.overrides.__file__).resolve()))
_CALL_IMPL = torch.nn.Module._call_impl.__code__


class HostCounter:
    """Running counts of the program's Python events and top-level torch calls."""

    def __init__(self, on_enter: tuple = (), on_exit: tuple = ()) -> None:
        # module calls are followed here, not by global module hooks: a global hook sends every
        # module call down ``Module._call_impl``'s slow path, ~7 more Python events per call
        self.on_enter = on_enter  # called with each module as its ``_call_impl`` starts
        self.on_exit = on_exit  # called with each module as its ``_call_impl`` returns
        self.events = 0
        self.tops = 0
        self._inside = 0  # depth of emulator frames on the stack
        self._seen_events = 0
        self._seen_tops = 0

    def profile(self, frame: Any, event: str, _arg: Any) -> None:
        """The ``sys.setprofile`` callback."""
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(_OWN):
                self._inside += 1
            elif not self._inside:
                self.events += 1
            if code is _CALL_IMPL and self.on_enter:
                module = frame.f_locals.get("self")
                for f in self.on_enter:
                    f(module, ())
        elif event == "return":
            code = frame.f_code
            if self._inside and code.co_filename.startswith(_OWN):
                self._inside -= 1
            if code is _CALL_IMPL and self.on_exit:
                module = frame.f_locals.get("self")
                for f in self.on_exit:
                    f(module, (), None)
        elif event == "c_call" and not self._inside:
            self.events += 1

    def take(self) -> tuple[int, int]:
        """``(Python events since the last take, 1 if a torch call began since then else 0)``."""
        events, self._seen_events = self.events - self._seen_events, self.events
        top = int(self.tops != self._seen_tops)
        self._seen_tops = self.tops
        return events, top

    def start(self) -> None:
        """Count from now on in this thread and in threads started later."""
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)
        _TopLevel(self).__enter__()
        self._seen_events, self._seen_tops = self.events, self.tops


class _TopLevel(TorchFunctionMode):
    """Counts torch calls made from Python; torch pops the mode while it runs, so calls nested
    inside a Python-implemented torch function are not counted again."""

    def __init__(self, counter: HostCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.counter.tops += 1
        return func(*args, **(kwargs or {}))
