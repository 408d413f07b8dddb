"""Serving iterations of real traces: vLLM's and SGLang's annotated ``execute_…`` steps.

Both engines (with their profiler annotations, as TraceLens reads them) name each model-execute
span ``execute_<tokens>_context_<n>(sq<Σq>sk<Σk>sqsq<Σq²>sqsk<Σq·k>)_generation_<m>(sq…sk…sqsq…sqsk…)``:
``n`` sequences in prefill (context) with ``Σq`` new tokens attending over ``Σk`` keys, ``m``
decoding sequences (one query each) over ``Σk`` cached tokens. The Kineto reader turns these spans
into steps; :func:`serving_steps` parses them into the iteration shape — ``prefill``, ``decode`` or
``mixed`` — with its measured span, its device time (union of the intervals of the kernels
that start from the step's start until the next step's) and the part of it in attention kernels
(:func:`ettools.classify.classify`'s Attention class; KV-cache writes are Memory), which
:mod:`.fit` charges to the context the step reads.

Host side of each iteration (:func:`host_times`, read off the same trace):

* ``blocked_us``: time the host spent in runtime calls that wait for the device (device/stream/event
  synchronize, synchronous or pageable copies — :func:`ettools.converters.kineto_sync.runtime_kind`
  and the reader's ``blocking`` attribute), within the step's span;
* ``host_us``: the step's span minus ``blocked_us`` — the engine's host work for the iteration
  (input preparation, attention metadata, launches, sampling); an upper bound when the profiler
  recorded Python calls (``python_events``, each costs the profiler time);
* ``launch_us`` / ``graph_launch_us``: host time inside launch calls / CUDA-HIP graph launches;
* ``device_wait_us``: the GPU waiting for the host — idle time on the device between the step's
  first and last device op while the host was not itself waiting for the device (the union of
  every device op and every blocked host call, subtracted from that window). An engine that
  overlaps its host work with the previous iteration (vLLM async scheduling, SGLang's overlap
  scheduler) shows only what it could not hide.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ettools.classify import CLASSES, classify_names
from ettools.converters.kineto_sync import BLOCKING, DEV_SYNC, EVENT_SYNC, LAUNCH, STREAM_SYNC, runtime_kind
from ettools.graph import EdgeKind
from ettools.intervals import merge_intervals, union_length

_SEG = r"\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
_RE = re.compile(r"execute_(\d+)_context_(\d+)" + _SEG + r"_generation_(\d+)" + _SEG)


def parse_step_name(name: str) -> dict[str, Any] | None:
    """The iteration shape a serving step name encodes, or None when it is not one."""
    m = _RE.search(name)
    if not m:
        return None
    v = [int(x) for x in m.groups()]
    tokens, n_pre, pq, pk, pqq, pqk, n_dec, dq, dk, _dqq, _dqk = v
    kind = "mixed" if n_pre and n_dec else "prefill" if n_pre else "decode"
    return {"kind": kind, "tokens": tokens, "prefill_seqs": n_pre, "prefill_tokens": pq, "prefill_keys": pk,
            # causal query-key pairs: Σ q·k − Σ q²/2 (each query sees the keys before it)
            "prefill_pairs": pqk - pqq / 2.0, "decode_seqs": n_dec, "decode_tokens": dq, "decode_context": dk}


def _covered(ms: np.ndarray, me: np.ndarray, lo: float, hi: float) -> float:
    """Length of merged intervals ``(ms, me)`` inside ``[lo, hi]``."""
    return float(np.clip(np.minimum(me, hi) - np.maximum(ms, lo), 0, None).sum())


class _HostView:
    """A rank's host runtime calls sorted into waits and launches, and its device ops (columns)."""

    def __init__(self, g: Any) -> None:
        cat = g.attrs.get("cat")
        cats = np.full(g.num_nodes, "", dtype=object)
        if cat is not None:
            cats[cat.rows] = cat.values
        host = g.is_cpu_op == 1
        rt = host & np.array([c.endswith(("_runtime", "_driver")) or c in ("Runtime",) for c in cats], bool)
        uniq, inv = np.unique(g.name[rt], return_inverse=True)
        kinds = np.array([runtime_kind(g.strings[int(u)]) for u in uniq], np.int64)[inv] if len(uniq) else \
            np.zeros(0, np.int64)
        rows = np.flatnonzero(rt)
        wait = np.isin(kinds, [DEV_SYNC, STREAM_SYNC, EVENT_SYNC, BLOCKING])
        blk = g.attrs.get("blocking")
        if blk is not None:
            wait |= np.isin(rows, blk.rows)
        ok = np.isfinite(g.start) & np.isfinite(g.dur) & (g.dur >= 0)
        w = rows[wait & ok[rows]]
        self.wait_s, self.wait_e = merge_intervals(g.start[w], g.start[w] + g.dur[w])
        la = rows[(kinds == LAUNCH) & ok[rows]]
        self.launch_s, self.launch_e = merge_intervals(g.start[la], g.start[la] + g.dur[la])
        gl = la[np.array(["graphlaunch" in g.strings[int(i)].lower() for i in g.name[la]], bool)] if len(la) else la
        self.graph_s, self.graph_e = merge_intervals(g.start[gl], g.start[gl] + g.dur[gl])
        dev = np.flatnonzero((g.is_cpu_op == 0) & ok)
        dev = dev[np.argsort(g.start[dev], kind="stable")]
        self.dev_s, self.dev_e = g.start[dev], g.start[dev] + g.dur[dev]
        # when each device op's launch call returned (LAUNCH edges; -inf: launched before the trace)
        src, dst, kind = g.edge_rows()
        lk = (kind == int(EdgeKind.LAUNCH)) & (src >= 0)
        launched = np.full(g.num_nodes, -np.inf)
        np.maximum.at(launched, dst[lk], g.start[src[lk]] + g.dur[src[lk]])
        self.dev_launched = launched[dev]
        # the device is not waiting for the host while it runs something or the host waits for it
        busy_s, busy_e = np.r_[self.dev_s, self.wait_s], np.r_[self.dev_e, self.wait_e]
        self.busy_s, self.busy_e = merge_intervals(busy_s, busy_e)
        self.python = np.flatnonzero(host & (cats == "python_function"))
        self.start = g.start

    def times(self, s: float, e: float, w0: float, w1: float) -> dict[str, Any]:
        """Host measures of a step spanning ``[s, e]`` whose device ops cover ``[w0, w1]``."""
        blocked = _covered(self.wait_s, self.wait_e, s, e)
        st = self.start[self.python]
        return {"host_us": float(e - s) - blocked, "blocked_us": blocked,
                "launch_us": _covered(self.launch_s, self.launch_e, s, e),
                "graph_launch_us": _covered(self.graph_s, self.graph_e, s, e),
                "device_wait_us": self._device_wait(w0, w1),
                "python_events": int(((st >= s) & (st < e)).sum())}


    def _device_wait(self, w0: float, w1: float) -> float:
        """Idle gaps of the device in ``[w0, w1]`` that end with an op launched after the gap began."""
        k = (self.busy_e[:-1] >= w0) & (self.busy_s[1:] <= w1)
        a, b = self.busy_e[:-1][k], self.busy_s[1:][k]
        if not len(a):
            return 0.0
        # the op that ends each gap (a gap may also end with a host wait: then no device op starts there)
        i = np.clip(np.searchsorted(self.dev_s, b), 0, len(self.dev_s) - 1)
        opens = np.isclose(self.dev_s[i], b) if len(self.dev_s) else np.zeros(len(b), bool)
        # queued before the device went idle: the gap is the device's own, not a wait for the host
        host_bound = opens & (self.dev_launched[i] > a)
        return float(np.clip(np.minimum(b, w1) - np.maximum(a, w0), 0, None)[host_bound].sum())


def host_times(trace: Any) -> list[dict[str, Any]]:
    """The host measures (see the module docstring) of every serving iteration of ``trace``."""
    return [{k: s[k] for k in ("rank", "kind", "prefill_seqs", "decode_seqs", "tokens", "host_us", "blocked_us",
                               "launch_us", "graph_launch_us", "device_wait_us", "python_events", "device_us")}
            for s in serving_steps(trace)]


def serving_steps(trace: Any) -> list[dict[str, Any]]:
    """Every serving iteration of ``trace``'s ranks: rank, name, shape, ``span_us`` and ``device_us``."""
    out = []
    for r, g in sorted(trace.graphs.items()):
        steps = g.meta.get("steps") or []
        shapes = [parse_step_name(name) for name, _, _ in steps]
        if not any(x is not None for x in shapes):
            continue  # no serving iteration here: the per-rank views below would be built for nothing
        dev = (g.is_cpu_op == 0) & np.isfinite(g.dur) & (g.dur >= 0)
        st, du = g.start[dev], g.dur[dev]
        attn = classify_names(g.name[dev], g.strings) == CLASSES.index("Attention")
        starts = sorted(s for _, s, _ in steps)
        hv = _HostView(g)
        for (name, s, e), shape in zip(steps, shapes):
            if shape is None:
                continue
            # kernels run after their launch (graph replays run after the host span ends): the
            # device work of a step is what starts from its start until the next step starts
            nxt = next((x for x in starts if x > s), np.inf)
            inside = (st >= s) & (st < nxt)
            shape.update({"rank": int(r), "name": name, "span_us": float(e - s),
                          "device_us": union_length(st[inside], st[inside] + du[inside]),
                          "attention_us": union_length(st[inside & attn], st[inside & attn] + du[inside & attn])})
            w0 = float(st[inside].min()) if inside.any() else s
            w1 = float((st[inside] + du[inside]).max()) if inside.any() else s
            shape.update(hv.times(s, e, w0, w1))
            out.append(shape)
    return out


def serving_lines(steps: list[dict[str, Any]]) -> list[str]:
    """Human lines for ``ettools info``."""
    lines = [f"serving iterations: {len(steps)}"]
    for s in steps:
        lines.append(f"  rank {s['rank']} {s['kind']:>7}: {s['prefill_seqs']} prefill seq ({s['prefill_tokens']:,} tokens), "
                     f"{s['decode_seqs']} decode seq (context {s['decode_context']:,}); "
                     f"span {s['span_us'] / 1e3:.3f} ms, device {s['device_us'] / 1e3:.3f} ms "
                     f"(attention {s['attention_us'] / 1e3:.3f} ms); host busy {s['host_us'] / 1e3:.3f} ms "
                     f"(graph launch {s['graph_launch_us'] / 1e3:.3f} ms), GPU waiting for the host "
                     f"{s['device_wait_us'] / 1e3:.3f} ms")
    return lines
