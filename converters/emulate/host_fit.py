"""Host-cost tables for emulated capture, measured from real profiled Kineto traces.

An emulated capture counts what the program's host does (:mod:`.hostcount`): Python events
between ops, top-level ops and the kernels each launches. A table turns the counts into time:

* ``top_op_us`` + ``launch_op_us[class]`` per kernel launched: one top-level ``cpu_op`` (a torch
  call from Python with every aten op under it), by non-negative least squares over the
  top-level ops. The class (:func:`launch_class`) is that of the aten op that launches the kernel:
  a GEMM's launch costs its host several times a plain element-wise one's (BLAS selection,
  workspace, nested view ops), so a table of BERT's linears would misprice Qwen's many small ops;
* ``python_event_us``: host time outside top-level ops and outside runtime calls made there
  (synchronizations, copies) per ``python_function`` event — the program's Python, with the
  profiler's cost of tracing it. Tables take it from host-bound traces (kernels busy under half
  the step) where there are any: a GPU-bound step's host also waits on the device, and that wait
  is not the Python's cost;
* ``launch_call_us``: the median launch call (where a launch sits inside its op).

Only the steps (``ProfilerStep`` spans) of the trace's busiest host thread are read. Costs are
what that host did *under the profiler* with the trace's settings (``record_shapes``,
``with_stack``): a host profiled otherwise, or not at all, is faster. Tables of several traces
are fitted over all their ops together.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.io import load_json

_HOST_CATS = frozenset({"cpu_op", "python_function", "cuda_runtime", "cuda_driver"})
_LAUNCH_WORDS = ("LaunchKernel", "aunchKernel", "GraphLaunch", "MemcpyAsync", "MemsetAsync")


class HostFitError(ValueError):
    """A trace that cannot give a host-cost table (one line)."""


def _is_launch(name: str) -> bool:
    return any(w in name for w in _LAUNCH_WORDS)


GEMM_OPS = frozenset({"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
                      "aten::linear", "aten::_scaled_mm", "aten::convolution", "aten::_convolution",
                      "aten::cudnn_convolution", "aten::convolution_backward", "aten::_int_mm"})
CLASSES = ("gemm", "attention", "other")


def launch_class(op: str) -> str:
    """The host-cost class of a kernel launch by the aten op that launches it: GEMM launches pass
    through the BLAS library's selection, attention through its backend's, the rest are plain."""
    if op in GEMM_OPS:
        return "gemm"
    if "attention" in op or "scaled_dot_product" in op:
        return "attention"
    return "other"


def _load(path: str | Path) -> list[dict[str, Any]]:
    """The complete events (``ph == "X"`` with numeric ``ts``/``dur``) of a Kineto JSON file."""
    try:
        doc = load_json(path, items_of="traceEvents")
    except TraceError as e:
        raise HostFitError(f"not a readable Kineto JSON trace: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise HostFitError(f"{path}: no traceEvents: not a Kineto trace")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
            and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]


def trace_host_samples(path: str | Path) -> dict[str, Any]:
    """One real Kineto trace's host, step by step on its busiest host thread: every top-level op
    as ``(duration, launches per class)`` and the Python time and event count (see the module doc)."""
    ev = _load(path)
    steps = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep")]
    cpu_tids = Counter(e.get("tid") for e in ev if e.get("cat") == "cpu_op")
    if not steps or not cpu_tids:
        raise HostFitError(f"{path}: no ProfilerStep with host ops: cannot measure its host")
    main = cpu_tids.most_common(1)[0][0]
    # sorted once; each step is a slice found by binary search (a trace may hold many steps)
    host = sorted((e for e in ev if e.get("tid") == main and e.get("cat") in _HOST_CATS),
                  key=lambda e: (e["ts"], -e["dur"]))
    host_ts = np.array([e["ts"] for e in host], dtype=np.float64)
    kernels = sorted((float(e["ts"]), float(e["dur"])) for e in ev if e.get("cat") == "kernel")
    kernel_ts = np.array([k[0] for k in kernels], dtype=np.float64)
    kernel_sum = np.concatenate([[0.0], np.cumsum([k[1] for k in kernels])])
    ops: list[list[float]] = []  # [duration, gemm, attention, other launches] per top-level op
    launch_calls: list[float] = []
    python_events, python_us, kernel_us = 0, 0.0, 0.0
    for st in steps:
        lo, hi = st["ts"], st["ts"] + st["dur"]
        k0, k1 = np.searchsorted(kernel_ts, [lo, hi], side="left")
        kernel_us += float(kernel_sum[k1] - kernel_sum[k0])
        h0, h1 = np.searchsorted(host_ts, [lo, hi], side="left")
        stack: list[dict[str, Any]] = []  # open cpu_ops, outermost first
        outside_runtime, in_ops, n_py = 0.0, 0.0, 0
        for e in host[h0:h1]:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
                stack.pop()
            cat = e.get("cat")
            if cat == "cpu_op":
                if not stack:
                    ops.append([float(e["dur"]), 0.0, 0.0, 0.0])
                    in_ops += float(e["dur"])
                stack.append(e)
            elif cat == "python_function":
                n_py += 1
            elif stack and _is_launch(str(e.get("name", ""))):
                ops[-1][1 + CLASSES.index(launch_class(str(stack[-1].get("name", ""))))] += 1
                launch_calls.append(float(e["dur"]))
            elif not stack:
                outside_runtime += float(e["dur"])
        if n_py:
            python_events += n_py
            python_us += max(float(st["dur"]) - in_ops - outside_runtime, 0.0)
    if not ops:
        raise HostFitError(f"{path}: no host ops inside its steps")
    if not launch_calls:
        raise HostFitError(f"{path}: no kernel launch inside its steps' ops: not a GPU trace")
    return {"ops": ops, "python_events": python_events, "python_us": python_us, "launch_calls": launch_calls,
            "steps": len(steps), "gpu_busy": kernel_us / max(sum(float(st["dur"]) for st in steps), 1e-9)}


def fit_host_costs(paths: list[str | Path], labels: list[str] | None = None) -> dict[str, Any]:
    """A host-cost table from real traces: top-level op costs by non-negative least squares over
    every trace's top-level ops together; the Python cost per event, the median over the
    host-bound traces where there are any (a program's Python costs 1.3-4.3 µs per event: the
    median keeps one heavy program from setting it for all)."""
    from scipy.optimize import nnls

    samples = [trace_host_samples(p) for p in paths]
    ops = np.array([o for s in samples for o in s["ops"]])
    coef, _ = nnls(np.c_[np.ones(len(ops)), ops[:, 1:]], ops[:, 0])
    with_py = [s for s in samples if s["python_events"]]
    bound = [s for s in with_py if s["gpu_busy"] < 0.5] or with_py
    if not bound:
        raise HostFitError("no trace was profiled with Python stacks (with_stack): the Python cost is unknown")
    call = round(float(np.median([c for s in samples for c in s["launch_calls"]])), 2)
    per = [{"steps": s["steps"], "top_ops": len(s["ops"]), "launches": int(sum(sum(o[1:]) for o in s["ops"])),
            "python_events": s["python_events"], "gpu_busy": round(s["gpu_busy"], 3)} for s in samples]
    return {"top_op_us": round(float(coef[0]), 2),
            "launch_op_us": {c: round(float(v), 2) for c, v in zip(CLASSES, coef[1:])},
            "python_event_us": round(float(np.median([s["python_us"] / s["python_events"] for s in bound])), 2),
            "launch_call_us": call, "sync_us": call,
            "source": "real traces' steps, busiest host thread, as profiled (record_shapes, with_stack): a top-level "
                      "op costs top_op_us + launch_op_us[class] per kernel it launches (non-negative least squares "
                      "over all their top-level ops); Python between ops per python_function event (host-bound "
                      "traces where there are any)",
            "traces": labels if labels is not None else [str(p) for p in paths], "per_trace": per}
