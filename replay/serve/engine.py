"""Iteration-level simulation of one serving engine (a model instance and its scheduler).

The engine runs iterations back to back while it has work. Each iteration the scheduler picks
what runs (see :class:`EngineConfig`), the iteration takes :meth:`.cost.StepCost.iteration_us`
(device time plus the host overhead of its sequences),
and at its end every decoding sequence has new tokens and every prefill that completed has its
first token. Policies:

* ``static``: when idle, take up to ``max_seqs`` waiting requests whose whole KV (prompt +
  output) fits, prefill them in one iteration, decode until the longest finishes (finished
  sequences stay in the batch as padding: the step costs the full batch), then take the next batch;
* ``continuous`` (vLLM-style, prefill first): admit waiting requests while their prompts fit the
  token budget, free KV blocks and ``max_seqs``, and run their prefill alone; otherwise decode every
  running sequence;
* ``chunked`` (chunked prefill, Sarathi/vLLM v1): every iteration decodes every running sequence
  and fills the rest of the token budget with prompt chunks (running prefills first, then newly
  admitted requests).

KV cache: blocks of ``block_tokens`` tokens; a request holds ``ceil(tokens / block)`` blocks, a
decode that needs a new block when none is free preempts the most recently admitted running
request (its blocks are freed and it is recomputed later: its prefill covers prompt + generated
tokens). Speculative decoding: each decode step verifies ``spec_tokens`` tokens per sequence and
emits ``1 + (leading accepted drafts)`` tokens, at most ``spec_tokens`` (each draft accepted with
probability ``acceptance``), plus ``spec_tokens − 1`` draft-model steps.

Prefix caching (``prefix``/``group`` given, ``continuous`` and ``chunked``): requests of one
prefix group share the first ``prefix`` tokens of their prompts (a system prompt, few-shot
examples). Once a request of the group has prefilled them, their whole KV blocks stay in the cache
and a later request of the group admitted while they are there skips them: its prefill starts
after them (its attention still reads them) and it allocates only its own blocks (at least one
prompt token is always computed, as vLLM does). Cached blocks no running request references are
evicted, whole groups, when a request cannot otherwise be admitted or a decode would preempt.

Stretches of pure decoding with nothing to admit are advanced many iterations at once in closed
form (iteration time is affine in the summed context, which grows linearly), stopping at the next
arrival, finish, or KV-block shortage; so the cost is per event, not per token.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class EngineConfig:
    """Scheduler and memory settings of an engine."""

    policy: str = "continuous"  # static | continuous | chunked
    token_budget: int = 8192  # new tokens per iteration (max_num_batched_tokens)
    max_seqs: int = 256  # running sequences at most
    block_tokens: int = 16
    kv_blocks: int = 1 << 30
    spec_tokens: int = 1  # tokens a decode step verifies per sequence (1: no speculation)
    acceptance: float = 1.0
    draft_cost: Any = None  # StepCost of the draft model (None: free)
    role: str = "both"  # both | prefill (requests leave after their first token) | decode (arrive prefilled)
    seed: int = 0
    # closed loop: this many clients, each sending its next request the moment its previous one
    # finishes (genai-perf's and ``vllm bench serve --max-concurrency``'s load); 0: the given arrivals
    clients: int = 0

    def __post_init__(self) -> None:
        if self.policy not in ("static", "continuous", "chunked"):
            raise ValueError(f"unknown scheduler {self.policy!r} (static, continuous, chunked)")
        if self.clients < 0 or (self.clients and self.role != "both"):
            raise ValueError("a closed loop needs clients >= 1 on an engine that both prefills and decodes")
        if self.spec_tokens < 1 or not 0.0 <= self.acceptance <= 1.0:
            raise ValueError("spec_tokens must be >= 1 and acceptance within 0..1")


@dataclass
class EngineResult:
    """Per-request times (µs) and engine counters."""

    first_token: np.ndarray
    finish: np.ndarray
    iterations: int
    decode_iterations: int
    prefill_iterations: int
    preemptions: int
    kv_time: np.ndarray  # iteration end times (µs) ...
    kv_used: np.ndarray  # ... and KV blocks in use then
    busy_us: float
    prefix_hit_tokens: int = 0  # prompt tokens served from the prefix cache (not prefilled)
    arrival: np.ndarray | None = None  # closed loop: when the clients sent each request (µs)


def _blocks(tokens: np.ndarray | int, bs: int) -> Any:
    return -(-tokens // bs)


def _run_us(j: int, A: float, B: float, S0: float, inc: float, F: float) -> float:
    """Time of ``j`` decode iterations costing ``max(A + B·S_i, F)`` with ``S_i = S0 + inc·i``."""
    if F <= 0 or B * inc <= 0:
        base = j * A + B * (j * S0 + inc * j * (j - 1) / 2.0)
        return max(base, j * F) if F > 0 else base
    # iterations i < i_star sit on the floor (the affine cost grows with i)
    i_star = min(j, max(0, math.ceil((F - A - B * S0) / (B * inc) - 1e-12)))
    m = j - i_star
    return i_star * F + m * (A + B * S0) + B * inc * (i_star * m + m * (m - 1) / 2.0)


def _first_reaching(j: int, delta: float, A: float, B: float, S0: float, inc: float, F: float) -> int:
    """The fewest iterations (at most ``j``) whose :func:`_run_us` reaches ``delta``."""
    lo, hi = 1, max(j, 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if _run_us(mid, A, B, S0, inc, F) >= delta:
            hi = mid
        else:
            lo = mid + 1
    return lo


def run_engine(arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray, cost: Any, cfg: EngineConfig,
               prefix: np.ndarray | None = None, group: np.ndarray | None = None) -> EngineResult:
    """Simulate one engine over its requests (``arrival`` µs ascending, token counts); ``prefix``
    and ``group`` (per request: shared prompt tokens and their prefix group, -1 none) turn on
    prefix caching (see the module docstring). With ``cfg.clients`` = C > 0 the load is a closed
    loop: the first C requests arrive as given, each later one when a request finishes (no earlier
    than the request before it), and the result carries the arrivals made."""
    n = len(arrival)
    arrival = np.array(arrival, np.float64)
    closed = cfg.clients > 0
    issued = min(cfg.clients, n) if closed else n
    arrival[issued:] = np.inf
    prompt = np.asarray(prompt, np.int64)
    output = np.maximum(np.asarray(output, np.int64), 1)
    bs = cfg.block_tokens
    rng = np.random.default_rng(cfg.seed)
    pre_done = np.zeros(n, np.int64)  # prompt (+ recomputed) tokens in the cache
    gen = np.zeros(n, np.int64)
    need = prompt.copy()  # tokens the prefill must process (prompt, or prompt + generated on recompute)
    held = np.zeros(n, np.int64)  # KV blocks held (owned)
    shared = np.zeros(n, np.int64)  # cached prefix blocks a request uses without owning them
    caching = prefix is not None and group is not None and cfg.policy != "static" and cfg.role != "decode"
    if caching:
        prefix = np.minimum(np.asarray(prefix, np.int64), prompt)
        group = np.asarray(group, np.int64)
    cached: dict[int, int] = {}  # prefix group -> its blocks in the cache
    refs: dict[int, int] = {}  # prefix group -> unfinished requests using its cached blocks
    hits = 0
    first = np.full(n, np.nan)
    fin = np.full(n, np.nan)
    if cfg.role == "decode":  # the prompt's KV arrived with the request; its first token too
        pre_done[:] = prompt
        need[:] = 0
        gen[:] = 1
    free = int(cfg.kv_blocks)
    wait: deque[int] = deque()
    running: list[int] = []
    nxt = 0
    done = 0
    t = 0.0
    iters = dec_iters = pre_iters = preempt = 0
    kv_t: list[float] = []
    kv_u: list[int] = []
    busy = 0.0
    K = cfg.spec_tokens
    draft = cfg.draft_cost
    static_batch: list[int] = []
    deterministic_spec = K == 1 or cfg.acceptance in (0.0, 1.0)
    tok_per_step = 1 if K == 1 else (K if cfg.acceptance == 1.0 else 1)

    def release_shared(i: int) -> None:
        if shared[i]:
            refs[int(group[i])] -= 1
            shared[i] = 0

    def client_next(at: float) -> None:
        # closed loop: the client whose request just finished sends its next one now
        nonlocal issued
        if issued < n:
            arrival[issued] = max(at, arrival[issued - 1]) if issued else at
            issued += 1

    def finish_req(i: int, at: float) -> None:
        nonlocal free, done
        fin[i] = at
        client_next(at)
        free += int(held[i])
        held[i] = 0
        release_shared(i)
        done += 1

    def prefix_hit(i: int) -> int:
        """Whole cached blocks of ``i``'s prompt it may skip now (0 unless caching applies)."""
        if not caching or group[i] < 0 or pre_done[i] > 0:
            return 0
        blocks = min(cached.get(int(group[i]), 0), int(prefix[i]) // bs, (int(need[i]) - 1) // bs)
        return max(blocks, 0)

    def take_hit(i: int, hit_blocks: int) -> None:
        nonlocal hits
        if hit_blocks:
            shared[i] = hit_blocks
            refs[int(group[i])] = refs.get(int(group[i]), 0) + 1
            pre_done[i] = hit_blocks * bs
            need[i] -= hit_blocks * bs
            hits += hit_blocks * bs

    def cache_prefix(i: int) -> None:
        """``i`` has prefilled its prompt: its prefix group's whole blocks join the cache."""
        if not caching or group[i] < 0:
            return
        g = int(group[i])
        pb = int(prefix[i]) // bs
        have = cached.get(g, 0)
        if pb <= have or shared[i] != have:  # already cached (or the cache changed under it)
            return
        move = pb - have  # blocks the request owns that now belong to the cache
        held[i] -= move
        if shared[i] == 0:
            refs[g] = refs.get(g, 0) + 1
        shared[i] = pb
        cached[g] = pb

    def evict() -> bool:
        """Drop the cached prefixes no unfinished request uses; True when blocks were freed."""
        nonlocal free
        gone = [g for g, b in cached.items() if refs.get(g, 0) == 0 and b > 0]
        for g in gone:
            free += cached.pop(g)
        return bool(gone)

    def finish_many(ids: list[int], at: float) -> None:
        # static batching keeps finished sequences in the batch as padding and their blocks held;
        # the whole batch is released once its last sequence finishes
        nonlocal free, done, static_batch, running
        for i in ids:
            if cfg.policy == "static":
                fin[i] = at
                done += 1
                client_next(at)
            else:
                finish_req(i, at)
                if i in running:
                    running.remove(i)
        if cfg.policy == "static" and static_batch and not np.isnan(fin[static_batch]).any():
            for i in static_batch:
                free += int(held[i])
                held[i] = 0
            static_batch, running = [], []

    def step_cost(n_tok: int, n_log: int, dctx: float, pairs: float, n_dec: int, n_seqs: int,
                  floor: bool = True) -> float:
        # n_seqs: sequences in the iteration (decoding + prefilling), for the host overhead
        if floor or not getattr(cost, "launch_us", 0.0):  # costs without an eager floor take no flag
            c = cost.iteration_us(n_tok, n_log, dctx, pairs, n_seqs)
        else:
            c = cost.iteration_us(n_tok, n_log, dctx, pairs, n_seqs, floor=False)
        if draft is not None and K > 1 and n_dec:
            c += (K - 1) * draft.iteration_us(n_dec, n_dec, dctx, 0.0, n_dec)
        return c

    def eager_floor(A: float, n_tok: int, n_seqs: int) -> float:
        # eager mode: an iteration costs at least the host's launches plus what A adds to the
        # device part (host overhead, draft steps): max(A + B·S, F)
        launch = float(getattr(cost, "launch_us", 0.0) or 0.0)
        if launch <= 0:
            return 0.0
        device = cost.iteration_us(n_tok, n_tok, 0.0, 0.0, n_seqs, floor=False) - cost.host_us(n_seqs)
        return A - device + launch

    while done < n:
        while nxt < n and arrival[nxt] <= t:
            wait.append(nxt)
            nxt += 1
        if not running and not wait:
            t = float(arrival[nxt])
            continue
        # ---- choose the iteration's work ---------------------------------------------------------
        prefill: list[tuple[int, int]] = []  # (request, tokens this iteration)
        decoders: list[int] = []
        if cfg.policy == "static":
            if not static_batch:
                while wait and len(static_batch) < cfg.max_seqs:
                    i = wait[0]
                    nb = int(_blocks(prompt[i] + output[i], bs))
                    if nb > free and static_batch:
                        break
                    wait.popleft()
                    free -= nb
                    held[i] = nb
                    static_batch.append(i)
                    prefill.append((i, int(need[i])))
                running = list(static_batch)
            else:  # finished sequences stay in the batch as padding
                decoders = list(static_batch)
        elif cfg.policy == "continuous":
            budget = cfg.token_budget
            while wait and len(running) + len(prefill) < cfg.max_seqs:
                i = wait[0]
                hb = prefix_hit(i)
                nb = int(_blocks(prompt[i] + gen[i] + 1, bs)) - hb
                if nb > free and caching and evict():
                    hb = prefix_hit(i)
                    nb = int(_blocks(prompt[i] + gen[i] + 1, bs)) - hb
                if nb > free or (prefill and need[i] - hb * bs > budget):
                    break
                wait.popleft()
                free -= nb
                held[i] = nb
                take_hit(i, hb)
                prefill.append((i, int(need[i])))
                budget -= int(need[i])
            if not prefill:
                decoders = list(running)
        else:  # chunked
            decoders = [i for i in running if need[i] == 0]
            budget = cfg.token_budget - len(decoders) * K
            for i in running:
                if need[i] > 0 and budget > 0:
                    q = int(min(need[i], budget))
                    prefill.append((i, q))
                    budget -= q
            while wait and budget > 0 and len(running) < cfg.max_seqs:
                i = wait[0]
                hb = prefix_hit(i)
                nb = int(_blocks(prompt[i] + gen[i] + 1, bs)) - hb
                if nb > free and caching and evict():
                    hb = prefix_hit(i)
                    nb = int(_blocks(prompt[i] + gen[i] + 1, bs)) - hb
                if nb > free:
                    break
                wait.popleft()
                free -= nb
                held[i] = nb
                take_hit(i, hb)
                running.append(i)
                q = int(min(need[i], budget))
                prefill.append((i, q))
                budget -= q
        if cfg.policy == "continuous":
            running.extend(i for i, _ in prefill)
        # ---- pure decode: advance many iterations at once ------------------------------------------
        if decoders and not prefill and deterministic_spec:
            d = np.asarray(decoders, np.int64)
            ctx = prompt[d] + gen[d]
            live = np.isnan(fin[d])
            rem = output[d] - gen[d]
            k = tok_per_step
            nd = len(d)
            steps_fin = int(np.min(-(-rem[live] // k))) if live.any() else 1
            n_log = nd * K
            A = step_cost(nd * K, n_log, 0.0, 0.0, nd, nd, floor=False)
            B = cost.alpha_us + ((K - 1) * draft.alpha_us if draft is not None and K > 1 else 0.0)
            F = eager_floor(A, nd * K, nd)
            S0 = float(ctx.sum())
            j = max(steps_fin, 1)
            if cfg.policy != "static":
                # KV blocks: every sequence may need one more block per bs/k steps
                live_n = int(live.sum())
                per = free // max(live_n, 1)
                j_mem = (per - 1) * bs // k if per >= 1 else 0
                if j_mem < 1:
                    j = 1
                else:
                    j = min(j, j_mem)
                if nxt < n and arrival[nxt] < np.inf:  # an arrival may be admitted at the next boundary
                    delta = float(arrival[nxt]) - t
                    if delta > 0:
                        a2 = B * nd * k / 2.0
                        a1 = A + B * S0 - a2
                        if F > 0:  # eager floor: the smallest run reaching the arrival
                            j = _first_reaching(j, delta, A, B, S0, nd * k, F)
                        else:
                            if a2 > 0:
                                jr = (-a1 + math.sqrt(a1 * a1 + 4 * a2 * delta)) / (2 * a2)
                            else:
                                jr = delta / max(a1, 1e-9)
                            j = min(j, max(1, math.ceil(jr - 1e-9)))
                    else:
                        j = 1
            dt = _run_us(j, A, B, S0, nd * k, F)
            if j == 1 and cfg.policy != "static":
                # exact block accounting, with preemption when the cache is full
                grow = _blocks(ctx[live] + k, bs) - held[d[live]] - shared[d[live]]
                needed = int(np.maximum(grow, 0).sum())
                if needed > free and caching:
                    evict()
                while needed > free and running:
                    victim = running.pop()
                    if victim in decoders:
                        decoders.remove(victim)
                    free += int(held[victim])
                    held[victim] = 0
                    release_shared(victim)
                    need[victim] = prompt[victim] + gen[victim]  # recomputed from scratch
                    pre_done[victim] = 0
                    wait.appendleft(victim)
                    preempt += 1
                    if not decoders:
                        break
                    d = np.asarray(decoders, np.int64)
                    ctx = prompt[d] + gen[d]
                    live = np.isnan(fin[d])
                    grow = _blocks(ctx[live] + k, bs) - held[d[live]] - shared[d[live]]
                    needed = int(np.maximum(grow, 0).sum())
                if not decoders:
                    continue
                nd = len(d)
                A = step_cost(nd * K, nd * K, 0.0, 0.0, nd, nd, floor=False)
                F = eager_floor(A, nd * K, nd)
                S0 = float(ctx.sum())
                dt = max(A + B * S0, F)
            t += dt
            busy += dt
            iters += j
            dec_iters += j
            dl = d[live]
            gen[dl] = np.minimum(gen[dl] + j * k, output[dl])
            if cfg.policy != "static":
                newheld = _blocks(prompt[dl] + gen[dl], bs)
                grow = np.maximum(newheld - held[dl] - shared[dl], 0)
                free -= int(grow.sum())
                held[dl] += grow
            # the cache held during these iterations, from their start; then what is left at their end
            kv_t.append(t - dt)
            kv_u.append(int(cfg.kv_blocks - free))
            finish_many(dl[gen[dl] >= output[dl]].tolist(), t)
            kv_t.append(t)
            kv_u.append(int(cfg.kv_blocks - free))
            continue
        # ---- a general iteration (prefill work, or stochastic speculation) --------------------------
        n_tok = sum(q for _, q in prefill)
        pairs = 0.0
        completes = []
        for i, q in prefill:
            c = int(pre_done[i]) + q
            pairs += q * (c - q / 2.0)
            if q >= need[i]:
                completes.append(i)
        d = np.asarray(decoders, np.int64)
        d = d[np.isnan(fin[d])] if cfg.policy != "static" else d
        nd = len(d)
        dctx = float((prompt[d] + gen[d]).sum()) if nd else 0.0
        dt = step_cost(n_tok + nd * K, len(completes) + nd * K, dctx, pairs, nd, nd + len(prefill))
        t += dt
        busy += dt
        iters += 1
        if nd:
            dec_iters += 1
        if prefill:
            pre_iters += 1
        for i, q in prefill:
            pre_done[i] += q
            need[i] -= q
        for i in completes:
            cache_prefix(i)
            gen[i] += 1
            if np.isnan(first[i]):
                first[i] = t
        if nd:
            if K == 1:
                emit = np.ones(nd, np.int64)
            else:
                acc = rng.random((nd, K - 1)) < cfg.acceptance
                lead = np.where(acc.all(axis=1), K - 1, np.argmin(acc, axis=1))
                emit = np.minimum(lead + 1, K)
            gen[d] = np.where(np.isnan(fin[d]), np.minimum(gen[d] + emit, output[d]), gen[d])
            if cfg.policy != "static":
                newheld = _blocks(prompt[d] + gen[d], bs)
                grow = np.maximum(newheld - held[d] - shared[d], 0)
                free -= int(grow.sum())
                held[d] += grow
        fin_now = [i for i in completes if cfg.role == "prefill" or gen[i] >= output[i]]
        fin_now += [i for i in d.tolist() if gen[i] >= output[i] and np.isnan(fin[i])]
        kv_t.append(t - dt)
        kv_u.append(int(cfg.kv_blocks - free))
        finish_many(fin_now, t)
        kv_t.append(t)
        kv_u.append(int(cfg.kv_blocks - free))
    if cfg.role == "decode":
        first[:] = np.nan
    return EngineResult(first, fin, iters, dec_iters, pre_iters, preempt, np.asarray(kv_t), np.asarray(kv_u), busy,
                        hits, arrival if closed else None)
