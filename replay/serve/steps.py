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
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ettools.classify import CLASSES, classify_names

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


def _union(s: np.ndarray, e: np.ndarray) -> float:
    if not len(s):
        return 0.0
    o = np.argsort(s)
    s, e = s[o], e[o]
    run_end = np.maximum.accumulate(e)
    gaps = np.clip(s[1:] - run_end[:-1], 0, None)
    return float(run_end[-1] - s[0] - gaps.sum())


def serving_steps(trace: Any) -> list[dict[str, Any]]:
    """Every serving iteration of ``trace``'s ranks: rank, name, shape, ``span_us`` and ``device_us``."""
    out = []
    for r, g in sorted(trace.graphs.items()):
        steps = g.meta.get("steps") or []
        if not steps:
            continue
        dev = (g.is_cpu_op == 0) & np.isfinite(g.dur) & (g.dur >= 0)
        st, du = g.start[dev], g.dur[dev]
        attn = classify_names(g.name[dev], g.strings) == CLASSES.index("Attention")
        starts = sorted(s for _, s, _ in steps)
        for name, s, e in steps:
            shape = parse_step_name(name)
            if shape is None:
                continue
            # kernels run after their launch (graph replays run after the host span ends): the
            # device work of a step is what starts from its start until the next step starts
            nxt = next((x for x in starts if x > s), np.inf)
            inside = (st >= s) & (st < nxt)
            shape.update({"rank": int(r), "name": name, "span_us": float(e - s),
                          "device_us": _union(st[inside], st[inside] + du[inside]),
                          "attention_us": _union(st[inside & attn], st[inside & attn] + du[inside & attn])})
            out.append(shape)
    return out


def serving_lines(steps: list[dict[str, Any]]) -> list[str]:
    """Human lines for ``ettools info``."""
    lines = [f"serving iterations: {len(steps)}"]
    for s in steps:
        lines.append(f"  rank {s['rank']} {s['kind']:>7}: {s['prefill_seqs']} prefill seq ({s['prefill_tokens']:,} tokens), "
                     f"{s['decode_seqs']} decode seq (context {s['decode_context']:,}); "
                     f"span {s['span_us'] / 1e3:.3f} ms, device {s['device_us'] / 1e3:.3f} ms "
                     f"(attention {s['attention_us'] / 1e3:.3f} ms)")
    return lines
