"""Request workloads: arrival times and token counts.

Arrivals: Poisson at a rate (exponential gaps), a fixed interval, or a JSONL file with one object
per line holding ``arrival`` (or ``arrival_s``/``timestamp``: seconds), ``prompt_tokens`` (or
``input_tokens``/``prompt_len``) and ``output_tokens`` (or ``output_len``/``max_tokens``).
Token counts: a fixed number ``"512"``, a uniform range ``"128-1024"``, or ``"exp:MEAN"``
(geometric with that mean, at least 1).

Shared prefixes (for prefix caching): ``synthetic(..., shared_prefix=N, prefix_groups=G)`` gives
every request one of ``G`` prefixes of ``N`` tokens (drawn uniformly; a system prompt or few-shot
examples) ahead of its own prompt tokens; a JSONL line may name its ``prefix_group`` (an integer)
and ``prefix_tokens`` (how many of its prompt tokens the group shares).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from ettools.errors import TraceError


@dataclass
class Workload:
    """Requests in arrival order: arrival (s), prompt and output tokens."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    prefix: np.ndarray | None = None  # prompt tokens shared with the request's prefix group
    group: np.ndarray | None = None  # prefix group (-1: none)

    def subset(self, idx: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The prefix columns of the requests ``idx`` (None when the workload has none)."""
        if self.prefix is None or self.group is None:
            return None, None
        return self.prefix[idx], self.group[idx]

    def __len__(self) -> int:
        return len(self.arrival_s)


MAX_TOKENS = 1 << 31  # prompt tokens of one request: what --max-model-len takes; beyond, sums overflow int64
# generated tokens of one request: each is one simulated iteration (~7 us), and no engine generates more
MAX_OUTPUT_TOKENS = 1 << 20


def draw_tokens(spec: str | int, n: int, rng: np.random.Generator, most: int = MAX_TOKENS) -> np.ndarray:
    """``n`` token counts from a spec (see the module docstring), each 1 .. ``most`` (checked on
    the spec, before anything is drawn: a huge count overflowed numpy's int64 or ran for hours)."""
    s = str(spec).strip()
    try:
        if s.startswith("exp:"):
            mean = float(s[4:])
            if not 0 < mean <= most:  # NaN too
                raise ValueError
            return np.maximum(1, rng.geometric(1.0 / max(mean, 1.0), n)).astype(np.int64).clip(1, most)
        if "-" in s:
            a, b = (int(x) for x in s.split("-", 1))
            if a < 1 or b < a or b > most:
                raise ValueError
            return rng.integers(a, b + 1, n).astype(np.int64)
        v = int(s)
        if not 1 <= v <= most:
            raise ValueError
        return np.full(n, v, np.int64)
    except ValueError:
        raise ValueError(f"bad token count {spec!r}: N, A-B or exp:MEAN with 1 <= N <= A <= B, MEAN "
                         f"<= {most:,}") from None


MAX_REQUESTS = 10_000_000  # one arrival array and per-request state: bounded before it is allocated


MAX_PREFIX_GROUPS = 1 << 20


def synthetic(rate: float | None, interval: float | None, duration: float, prompt: str | int, output: str | int,
              seed: int = 0, shared_prefix: int = 0, prefix_groups: int = 1) -> Workload:
    """Poisson arrivals at ``rate`` per second (or one every ``interval`` s) over ``duration`` s;
    ``shared_prefix`` tokens of one of ``prefix_groups`` prefixes ahead of each prompt (0: none)."""
    if not 0 <= shared_prefix <= MAX_TOKENS // 2:
        raise ValueError(f"shared prefix must be 0..{MAX_TOKENS // 2:,} tokens, got {shared_prefix}")
    if not 1 <= prefix_groups <= MAX_PREFIX_GROUPS:
        raise ValueError(f"prefix groups must be 1..{MAX_PREFIX_GROUPS:,}, got {prefix_groups}")
    rng = np.random.default_rng(seed)
    if not (np.isfinite(duration) and duration > 0):
        raise ValueError(f"duration must be a finite number of seconds > 0, got {duration}")
    expected = duration / interval if interval is not None and interval > 0 else (rate or 0.0) * duration
    if expected > MAX_REQUESTS:
        raise ValueError(f"{expected:.3g} requests expected (rate x duration): at most {MAX_REQUESTS:,} are simulated")
    if interval is not None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        t = np.arange(0.0, duration, interval)
    else:
        if rate is None or rate <= 0:
            raise ValueError("give a rate > 0 (requests per second) or an interval")
        gaps = rng.exponential(1.0 / rate, int(rate * duration * 1.2 + 10 * np.sqrt(rate * duration) + 10))
        t = np.cumsum(gaps)
        t = t[t < duration]
    n = len(t)
    own = draw_tokens(prompt, n, rng, MAX_TOKENS - shared_prefix)
    out = draw_tokens(output, n, rng, MAX_OUTPUT_TOKENS)
    if not shared_prefix:
        return Workload(t, own, out)
    group = rng.integers(0, prefix_groups, n).astype(np.int64)
    return Workload(t, own + shared_prefix, out, np.full(n, shared_prefix, np.int64), group)


def closed_loop_requests(n: int, prompt: str | int, output: str | int, seed: int = 0, shared_prefix: int = 0,
                         prefix_groups: int = 1) -> Workload:
    """``n`` requests for a closed loop (``serve --concurrency``): token counts drawn as
    :func:`synthetic` draws them, every arrival at 0 (the clients start together; later arrivals
    are made by the simulation as requests finish)."""
    if not 1 <= n <= MAX_REQUESTS:
        raise ValueError(f"requests must be 1..{MAX_REQUESTS:,}, got {n}")
    w = synthetic(None, 1.0, float(n), prompt, output, seed, shared_prefix, prefix_groups)
    return Workload(np.zeros(n), w.prompt, w.output, w.prefix, w.group)


_ARR = ("arrival", "arrival_s", "arrival_time", "timestamp")
_IN = ("prompt_tokens", "input_tokens", "prompt_len", "input_len")
_OUT = ("output_tokens", "output_len", "max_tokens", "completion_tokens")


def load_requests(path: str | Path) -> Workload:
    """Requests from a JSONL file (see the module docstring); bad lines are an error naming the file."""
    p = Path(path)
    try:
        lines = p.read_bytes().splitlines()
    except OSError as e:
        raise TraceError(str(p), f"cannot read requests: {e.strerror}") from None
    arr, pr, out, pre, grp = [], [], [], [], []
    for k, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            o = orjson.loads(line)
            a = next(float(o[x]) for x in _ARR if x in o)
            i = next(int(o[x]) for x in _IN if x in o)
            j = next(int(o[x]) for x in _OUT if x in o)
        except (orjson.JSONDecodeError, StopIteration, TypeError, ValueError):
            raise TraceError(str(p), f"line {k}: needs arrival, prompt_tokens and output_tokens") from None
        if not (1 <= i <= MAX_TOKENS and 1 <= j <= MAX_OUTPUT_TOKENS and 0 <= a < float("inf")):
            raise TraceError(str(p), f"line {k}: prompt tokens must be 1..{MAX_TOKENS:,}, output tokens "
                                     f"1..{MAX_OUTPUT_TOKENS:,} and arrival a finite number >= 0")
        try:
            g = int(o.get("prefix_group", -1))
            pt = int(o.get("prefix_tokens", 0)) if g >= 0 else 0
        except (TypeError, ValueError):
            g, pt = -2, 0
        if g < -1 or not 0 <= pt <= i:
            raise TraceError(str(p), f"line {k}: prefix_group must be an integer >= 0 and prefix_tokens "
                                     "0..prompt_tokens")
        arr.append(a)
        pr.append(i)
        out.append(j)
        pre.append(pt)
        grp.append(g)
    if not arr:
        raise TraceError(str(p), "no requests")
    order = np.argsort(np.asarray(arr), kind="stable")
    w = Workload(np.asarray(arr)[order], np.asarray(pr, np.int64)[order], np.asarray(out, np.int64)[order])
    if any(g >= 0 for g in grp):
        w.prefix, w.group = np.asarray(pre, np.int64)[order], np.asarray(grp, np.int64)[order]
    return w
