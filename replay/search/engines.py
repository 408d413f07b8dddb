"""Where trials run: a local process pool (default) or Ray tasks.

Both take ``submit(plan, bound_us, lower_bound_us)`` and ``wait()`` → finished ``(plan key, trial)``
pairs, and run :func:`.evaluate.evaluate_plan`, so a trial's result does not depend on the engine.
Ray is an optional extra (``pip install 'ettools[search]'``); ``ray.init()`` starts a local cluster
when no address is given, or joins ``address`` (``auto``, ``ray://host:10001``, ``host:6379``).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from typing import Any

from .evaluate import Context, evaluate_plan
from .space import plan_key


class LocalEngine:
    """Trials in ``workers`` processes (1: in this process, no pool)."""

    def __init__(self, ctx: Context, workers: int = 2) -> None:
        self.ctx = ctx
        self.workers = max(int(workers), 1)
        self.pool = None
        if self.workers > 1:
            # fork shares the imported modules (start-up in ms); spawn elsewhere
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            self.pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context(method))
        self.pending: dict[Any, str] = {}
        self._done: list[tuple[str, dict[str, Any]]] = []

    @property
    def capacity(self) -> int:
        """How many trials may be in flight at once."""
        return self.workers

    def submit(self, plan: dict[str, Any], bound_us: float, lower_bound_us: float | None = None) -> None:
        """Start a trial (``lower_bound_us``: its stage bound when already known)."""
        if self.pool is None:
            self._done.append((plan_key(plan), evaluate_plan(self.ctx, plan, bound_us, lower_bound_us)))
            return
        self.pending[self.pool.submit(evaluate_plan, self.ctx, plan, bound_us, lower_bound_us)] = plan_key(plan)

    def in_flight(self) -> int:
        """Trials started and not yet collected."""
        return len(self.pending) + len(self._done)

    def wait(self) -> list[tuple[str, dict[str, Any]]]:
        """Block until at least one trial finished; return the finished ones."""
        if self._done:
            out, self._done = self._done, []
            return out
        done, _ = cf.wait(list(self.pending), return_when=cf.FIRST_COMPLETED)
        return [(self.pending.pop(f), f.result()) for f in done]

    def close(self, abort: bool = False) -> None:
        """Stop the workers: after their trials, or with ``abort`` at once (their processes
        terminated: an interrupted search must not outlive its signal by a trial's length)."""
        if self.pool is None:
            return
        if abort:
            for proc in list(getattr(self.pool, "_processes", {}).values()):  # the pool has no public kill
                proc.terminate()
            self.pool.shutdown(wait=False, cancel_futures=True)
            return
        self.pool.shutdown(wait=True, cancel_futures=True)


class RayEngine:
    """Trials as Ray tasks (one CPU each); ``workers`` caps the tasks in flight."""

    def __init__(self, ctx: Context, workers: int = 2, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeError("--backend ray needs Ray: pip install 'ettools[search]' (or pip install 'ray[default]')") from None
        self.ray = ray
        self._own = not ray.is_initialized()
        if self._own:
            kw: dict[str, Any] = {"address": address} if address else {"num_cpus": max(int(workers), 1)}
            ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", **kw)
        self.task = ray.remote(num_cpus=1)(evaluate_plan)
        self.ctx_ref = ray.put(ctx)
        self.workers = max(int(workers), 1)
        self.pending: dict[Any, str] = {}

    @property
    def capacity(self) -> int:
        """How many trials may be in flight at once."""
        return self.workers

    def submit(self, plan: dict[str, Any], bound_us: float, lower_bound_us: float | None = None) -> None:
        """Start a trial as a Ray task (``lower_bound_us``: its stage bound when already known)."""
        self.pending[self.task.remote(self.ctx_ref, plan, bound_us, lower_bound_us)] = plan_key(plan)

    def in_flight(self) -> int:
        """Trials started and not yet collected."""
        return len(self.pending)

    def wait(self) -> list[tuple[str, dict[str, Any]]]:
        """Block until at least one task finished; return the finished ones."""
        done, _ = self.ray.wait(list(self.pending), num_returns=1)
        return [(self.pending.pop(ref), self.ray.get(ref)) for ref in done]

    def close(self, abort: bool = False) -> None:
        """Shut down the Ray runtime this engine started (a joined cluster is left running); with
        ``abort`` the tasks in flight are cancelled first."""
        if abort:
            for ref in list(self.pending):
                self.ray.cancel(ref, force=True)
        if self._own:
            self.ray.shutdown()


def make_engine(ctx: Context, backend: str = "local", workers: int = 2, address: str | None = None):
    """The engine named ``backend`` (``local`` or ``ray``)."""
    if backend == "local":
        return LocalEngine(ctx, workers)
    if backend == "ray":
        return RayEngine(ctx, workers, address)
    raise ValueError(f"unknown backend {backend!r} (local, ray)")
