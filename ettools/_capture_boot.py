"""Bootstrap that ``ettools capture`` copies into a temporary folder as ``sitecustomize.py``.

Every Python process started under ``ettools capture`` (the script, a launcher such as
``torchrun`` and the workers it starts: they inherit ``PYTHONPATH``) imports this file at start-up.
It imports nothing heavy: a meta-path hook waits for ``import torch`` to finish and only then
installs the step detector. Standard library only, and no import of ettools, because the
traced interpreter may be another environment than the one ettools runs in.

Steps are optimizer steps of the first optimizer that steps in the process (1-based). The
profiler (with ``record_shapes``, optional ``profile_memory`` and the Execution Trace observer)
starts when step ``first - 1`` returns (for ``first == 1``: when the first optimizer has been
constructed) and stops when step ``last`` returns, so the window holds whole iterations:
zero_grad, forward, backward and the optimizer step. Each recorded step is wrapped in a
``ProfilerStep#N`` span, N being the optimizer step number. The boundary is taken when
``Optimizer.step`` has *returned*, outside its ``Optimizer.step#...`` record-function span (the
public global post-step hook runs inside that span, so stopping there would lose it); where
that wrapper is missing the global post-step hook is used instead.

Configuration comes from the environment (set by :func:`ettools.capture.run_capture`):
``ETTOOLS_CAPTURE_OUT`` (output folder), ``ETTOOLS_CAPTURE_STEPS`` (``"first-last"``),
``ETTOOLS_CAPTURE_MEMORY`` (``"1"``/``"0"``) and ``ETTOOLS_CAPTURE_STATE`` (a private folder for
raw files and one small status JSON per process, read back by ``run_capture``).
"""

from __future__ import annotations

import atexit
import functools
import gzip
import json
import os
import shutil
import sys
import tempfile

_ENV_OUT = "ETTOOLS_CAPTURE_OUT"
_ENV_STEPS = "ETTOOLS_CAPTURE_STEPS"
_ENV_MEMORY = "ETTOOLS_CAPTURE_MEMORY"
_ENV_STATE = "ETTOOLS_CAPTURE_STATE"


class _Capture:
    """Per-process state: step counter, the running profiler, what was written."""

    def __init__(self, out: str, first: int, last: int, memory: bool, state: str) -> None:
        self.out = out
        self.first = first
        self.last = last
        self.memory = memory
        self.state = state
        self.pid = os.getpid()
        self.torch = None
        self.torch_error: str | None = None
        self.torch_version: str | None = None
        self.optimizer_id: int | None = None  # the optimizer whose steps are counted
        self.steps = 0
        self.depth = 0  # nesting of Optimizer.step calls (wrapping optimizers)
        self.prof = None
        self.et = None
        self.span = None
        self.raw_et: str | None = None
        self.captured: list[int] = []
        self.files: list[str] = []
        self.error: str | None = None
        self.rank: int | None = None

    # ---- status -----------------------------------------------------------------------------
    def _refork(self) -> None:
        """After ``fork`` a child inherits the parent's counters: start from a clean slate."""
        if os.getpid() != self.pid:
            self.pid = os.getpid()
            self.captured, self.files, self.error, self.rank = [], [], None, None
            self.prof = self.et = self.span = None
            self.steps, self.optimizer_id = 0, None

    def write_status(self) -> None:
        """Write this process's status JSON (atomically; read by ``run_capture``)."""
        status = {
            "pid": os.getpid(),
            "rank": self.rank,
            "steps": self.steps,
            "captured": self.captured,
            "files": self.files,
            "torch_version": self.torch_version,
            "torch_error": self.torch_error,
            "error": self.error,
            "argv": sys.argv[:4],
        }
        try:
            fd, tmp = tempfile.mkstemp(prefix=".status.", dir=self.state)
            with os.fdopen(fd, "w") as f:
                json.dump(status, f)
            os.replace(tmp, os.path.join(self.state, f"status.{os.getpid()}.json"))
        except OSError:
            pass  # the state folder is gone: run_capture has finished already

    # ---- torch import -----------------------------------------------------------------------
    def on_torch_imported(self, torch) -> None:  # noqa: ANN001 - torch is optional
        """Install the step detector (called once ``import torch`` has completed)."""
        self.torch = torch
        self.torch_version = getattr(torch, "__version__", None)
        try:
            self._install_hooks()
        except Exception as e:  # never break the user's script
            self.error = f"could not install the step hooks: {e!r}"
        self.write_status()

    def _install_hooks(self) -> None:
        from torch.optim import optimizer as optmod

        cap = self
        Optimizer = optmod.Optimizer
        orig_init = Optimizer.__init__

        @functools.wraps(orig_init)
        def __init__(self, *args, **kwargs):  # noqa: N807
            orig_init(self, *args, **kwargs)
            cap._refork()
            if cap.first == 1 and cap.prof is None and not cap.captured and cap.steps == 0:
                cap._start()

        Optimizer.__init__ = __init__

        orig_profile_hook_step = getattr(Optimizer, "profile_hook_step", None)
        if orig_profile_hook_step is not None:

            def profile_hook_step(func):
                hooked = orig_profile_hook_step(func)

                def step(self, *args, **kwargs):
                    cap.depth += 1
                    try:
                        out = hooked(self, *args, **kwargs)
                    finally:
                        cap.depth -= 1
                    if cap.depth == 0:
                        cap.on_step(self)
                    return out

                return functools.wraps(func)(step)

            Optimizer.profile_hook_step = staticmethod(profile_hook_step)
        else:  # pragma: no cover - other torch versions
            optmod.register_optimizer_step_post_hook(lambda opt, args, kwargs: cap.on_step(opt))

    # ---- steps ------------------------------------------------------------------------------
    def on_step(self, optimizer) -> None:  # noqa: ANN001
        """Called when an (outermost) ``Optimizer.step`` has returned."""
        self._refork()
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        elif id(optimizer) != self.optimizer_id:
            return
        self.steps += 1
        n = self.steps
        try:
            if self.prof is not None:
                self.captured.append(n)
                if n >= self.last:
                    self._finish()
                else:
                    self._close_span()
                    self._open_span(n + 1)
            elif n == self.first - 1:
                self._start()
        except Exception as e:  # never break the user's script
            self.error = f"capture failed at step {n}: {e!r}"
            self.prof = None
        if n <= self.last + 1:
            self.write_status()

    def _open_span(self, n: int) -> None:
        self.span = self.torch.autograd.profiler.record_function(f"ProfilerStep#{n}")
        self.span.__enter__()

    def _close_span(self) -> None:
        if self.span is not None:
            self.span.__exit__(None, None, None)
            self.span = None

    def _start(self) -> None:
        torch = self.torch
        from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        fd, self.raw_et = tempfile.mkstemp(prefix=f"et.{os.getpid()}.", suffix=".json", dir=self.state)
        os.close(fd)
        self.et = ExecutionTraceObserver().register_callback(self.raw_et)
        self.prof = profile(
            activities=activities,
            record_shapes=True,
            profile_memory=self.memory,
            execution_trace_observer=self.et,
        )
        self.prof.start()
        self._open_span(self.steps + 1)

    def _finish(self, unfinished: int | None = None) -> None:
        """Stop the profiler, finalize the ET file and publish both files gzipped.

        ``unfinished``: the number of a step the script did not complete (it exited inside the
        window); its ``ProfilerStep`` span is removed from both files.
        """
        prof, et = self.prof, self.et
        self.prof = self.et = None
        self._close_span()
        prof.stop()
        et.unregister_callback()
        fd, raw_kineto = tempfile.mkstemp(prefix=f"kineto.{os.getpid()}.", suffix=".json", dir=self.state)
        os.close(fd)
        prof.export_chrome_trace(raw_kineto)
        if unfinished is not None:
            _drop_step(raw_kineto, self.raw_et, f"ProfilerStep#{unfinished}")
        rank = self._rank()
        self.rank = rank
        for raw, kind in ((raw_kineto, "kineto"), (self.raw_et, "et")):
            final = os.path.join(self.out, f"rank{rank}.{kind}.json.gz")
            _gzip_atomic(raw, final)
            os.remove(raw)
            self.files.append(final)

    def _rank(self) -> int:
        dist = getattr(self.torch, "distributed", None)
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except Exception:
            pass
        try:
            return int(os.environ.get("RANK", "0"))
        except ValueError:
            return 0

    def at_exit(self) -> None:
        """Script ended inside the window: publish what was recorded; always leave a status."""
        if os.getpid() != self.pid:
            return
        if self.prof is not None and self.captured:
            try:
                self._finish(unfinished=self.steps + 1)
            except Exception as e:
                self.error = f"capture failed at exit: {e!r}"
        elif self.prof is not None:
            try:  # started but no whole step recorded: drop it
                self._close_span()
                self.prof.stop()
                self.et.unregister_callback()
            except Exception:
                pass
            self.prof = None
        self.write_status()


def _drop_step(kineto_path: str, et_path: str, name: str) -> None:
    """Remove the span ``name`` from a Kineto file and its node from an ET file (children of
    the ET node move up to its parent)."""
    with open(kineto_path, encoding="utf-8") as f:
        kineto = json.load(f)
    kineto["traceEvents"] = [e for e in kineto.get("traceEvents", []) if e.get("name") != name]
    with open(kineto_path, "w", encoding="utf-8") as f:
        json.dump(kineto, f)
    with open(et_path, encoding="utf-8") as f:
        et = json.load(f)
    parents = {n["id"]: n.get("ctrl_deps") for n in et.get("nodes", []) if n.get("name") == name}
    if parents:
        nodes = [n for n in et["nodes"] if n["id"] not in parents]
        for n in nodes:
            if n.get("ctrl_deps") in parents:
                n["ctrl_deps"] = parents[n["ctrl_deps"]]
        et["nodes"] = nodes
        with open(et_path, "w", encoding="utf-8") as f:
            json.dump(et, f)


def _gzip_atomic(src: str, final: str) -> None:
    """gzip ``src`` into ``final`` deterministically (mtime 0, no name): temp file + rename."""
    folder = os.path.dirname(final) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(final)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as raw, open(src, "rb") as fin:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                shutil.copyfileobj(fin, gz, 1 << 20)
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class _TorchImportHook:
    """Meta-path finder that runs a callback once ``import torch`` has completed."""

    def __init__(self, cap: _Capture) -> None:
        self.cap = cap

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001
        if name != "torch":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            self.cap.torch_error = "missing"
            self.cap.write_status()
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        cap = self.cap

        def exec_and_hook(module):  # noqa: ANN001
            try:
                exec_module(module)
            except ImportError as e:
                cap.torch_error = "missing" if getattr(e, "name", None) == "torch" else f"broken: {e}"
                cap.write_status()
                raise
            cap.on_torch_imported(module)

        try:
            loader.exec_module = exec_and_hook
        except AttributeError:  # pragma: no cover - read-only loader
            return None
        return spec


def _chain_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` this file shadows, if the environment has one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _activate() -> None:
    out, state = os.environ.get(_ENV_OUT), os.environ.get(_ENV_STATE)
    if not out or not state or not os.path.isdir(state):
        return
    try:
        first, _, last = os.environ.get(_ENV_STEPS, "2-2").partition("-")
        first_i, last_i = int(first), int(last or first)
    except ValueError:
        first_i = last_i = 2
    cap = _Capture(out, first_i, last_i, os.environ.get(_ENV_MEMORY, "1") == "1", state)
    if "torch" in sys.modules:  # pragma: no cover - imported by another sitecustomize
        cap.on_torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchImportHook(cap))
    atexit.register(cap.at_exit)


if __name__ == "sitecustomize":
    try:
        _activate()
    finally:
        _chain_next_sitecustomize()
