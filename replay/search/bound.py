"""A trial's checks before its replay without synthesis: each pipeline stage's compute and memory
from programs shared by the plans of a search.

Before it replays a plan a trial needs, per pipeline stage, the synthesizer's peak memory per rank
(and the resident part of it) and, for :func:`.evaluate.stage_bound`, ``W`` (µs of the stage's
compute nodes as the replay's compute model times them) and ``O`` (the optimizer's part). A
synthesized stage graph is instances of a few compiled *programs*
(:func:`ettools.converters.symbolic.stage.build_stage`), so :class:`StageWork` computes these
figures from the programs and their instance counts instead of synthesizing the plan, and caches
every piece under the part of the plan it depends on. What each piece depends on is read off the
synthesizer, not assumed:

* **Instances.** Under gpipe, 1F1B and interleaved a stage runs, for each unit of
  :func:`~ettools.converters.symbolic.schedule.stage_units` (``F``/``B`` of one micro-batch through
  one chunk), the ``fwd``/``bwd`` program of every module of the chunk — the same compiled program
  for every micro-batch — and, after the chunk's last backward, each module's ``step`` program
  (merged into gradient buckets with ``bucket_mb``, compute rows kept). Everything else a stage holds
  is communication: sends and receives (:func:`~ettools.converters.symbolic.compiled._p2p_program`),
  the ``sync`` programs of earlier micro-batches (``_sync_program`` adds compute nodes only on the
  last one: the optimizer and the FP8 weight casts), ZeRO-3 gathers. Memory is ``build_stage``'s
  sum: the ``step`` programs' resident bytes, the ``fwd`` programs' saved bytes live from each
  ``F`` to its ``B``, and the largest compute node's tensor size (no other node has one).
* **Programs.** :func:`~ettools.converters.symbolic.distribute.build_programs` reads of the plan
  only: which mesh axes have more than one rank (``axes``, ``batch_axes``), ``sp``, ``recompute``,
  the dtypes' bytes, ``fp8_gemms``, ``vocab_parallel``, ``phase``, ``kv_bytes`` (the ``fwd``/``bwd``
  programs) and for the ``sync``/``step`` programs also ``zero``/``fsdp``, ``optimizer``, ``tie`` with
  ``pp == 1``, ``grad_sync`` and ``schedule == "dualpipe"``; never a degree's number (degrees stay
  symbols, ``tp``, ``edp``, …). Of these, ``zero``/``fsdp`` change the ``fwd``/``bwd`` programs by
  gathers only (communication); ``grad_sync`` and ``dualpipe`` add only collectives to the ``step``
  programs, and ``recompute`` leaves them alone (they read the parameter gradients' layouts,
  which are the parameters' own). Programs are built once per key of what they read.
* **Numbers.** A program's columns are its expressions' values. The global micro-batch ``B`` is
  ``Bl·ep·edp`` and ``dp`` is ``ep·edp`` (``Bl`` the per-rank micro-batch), exact identities
  substituted into the expressions, so a program whose work does not depend on the data-parallel
  degree no longer names it; the columns are then keyed by the values of the symbols left.

The figures equal the synthesized plan's (compute up to the order floating-point sums are taken
in, memory to the byte; tests/test_search_bound.py checks both). Plans this module cannot count
(other schedules, inference) get None: their trial synthesizes as before.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .context import Context, compute_us, synth_kwargs, timing_model
from .evaluate import bound_of_stages
from .space import plan_key

# schedules whose units are whole forwards/backwards (no split weight-gradient halves, no
# overlapped pairs): the instance counting below is build_stage's for them
COUNTED_SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass
class StageFigures:
    """What a plan's trial needs before its replay, per pipeline stage, counted without synthesis."""

    work: list[tuple[float, float]]  # (W_k, O_k): µs of the stage's compute nodes, of its optimizer's
    micro_batches: int
    peak_memory: list[int]  # the synthesizer's peak per rank (StageGraph.peak_memory)
    resident: list[int]  # weights, gradients and optimizer states (StageGraph.resident_bytes)
    schedule: str = "1f1b"

    @property
    def bound_us(self) -> float:
        """The plan's :func:`.evaluate.stage_bound`."""
        return bound_of_stages(self.work, self.micro_batches, self.schedule)


class StageWork:
    """Per-stage compute (µs) and memory of plans of one search context, from cached programs.

    ``stats``: plans asked, plans counted, programs built (symbolic), program sets timed, seconds.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.model = timing_model(ctx)
        self._setups: dict[str, Any] = {}  # plan key without zero/recompute/schedule/buckets -> TrainSetup
        self._progs: dict[tuple, dict[str, Any]] = {}  # symbolic key -> {module: ModulePrograms}
        self._subs: dict[tuple, tuple[dict[str, Any], frozenset[str]]] = {}
        self._timed: dict[tuple, dict[str, tuple]] = {}
        self.stats = {"plans": 0, "counted": 0, "built": 0, "timed": 0, "seconds": 0.0}

    def bound(self, plan: dict[str, Any]) -> float | None:
        """:func:`.evaluate.stage_bound` of ``plan`` without synthesizing it (µs), or None when
        this plan is not one this module counts (or the synthesizer refuses it)."""
        f = self.figures(plan)
        return None if f is None else f.bound_us

    def figures(self, plan: dict[str, Any]) -> StageFigures | None:
        """The plan's :class:`StageFigures`, or None for a plan this module does not count."""
        t0 = time.perf_counter()
        self.stats["plans"] += 1
        try:
            f = self._figures(plan)
        finally:
            self.stats["seconds"] += time.perf_counter() - t0
        self.stats["counted"] += f is not None
        return f

    def stage_compute(self, plan: dict[str, Any]) -> tuple[list[tuple[float, float]], int] | None:
        """``(W_k, O_k)`` per pipeline stage k (µs of its compute nodes, of its optimizer nodes), and
        the plan's micro-batches per step; None for a plan this module does not count."""
        f = self.figures(plan)
        return None if f is None else (f.work, f.micro_batches)

    def _figures(self, plan: dict[str, Any]) -> StageFigures | None:
        from ettools.converters.symbolic.schedule import stage_units
        from ettools.converters.symbolic.stage import assign_stages
        from ettools.errors import TraceError

        if self.model is None or plan["schedule"] not in COUNTED_SCHEDULES:
            return None
        try:
            s = self._setup(plan)
            p = s.plan
            env = self._env(s.values, p)
            uses = []
            for use in s.model.uses:  # as _build: module instances, each given a virtual stage
                count = use.repeat.int_value(env)
                uses.append((use.module, count, not use.repeat.is_const() or count > 1))
            mods, vst = assign_stages(uses, p.pp * p.vpp)
            fb = self._module_figures(s, env, "fb")
            st = self._module_figures(s, env, "step")
        except (ValueError, KeyError, ZeroDivisionError, OverflowError, TraceError):
            return None  # the trial reports why (invalid), as it does today
        by_v: dict[int, list[int]] = {}
        for i, v in enumerate(vst):
            by_v.setdefault(v, []).append(i)
        work, peak, resident = [], [], []
        for stage in range(p.pp):
            chunks = {v // p.pp: v for v in range(p.pp * p.vpp) if v % p.pp == stage and v in by_v}
            names = {c: [mods[k] for k in by_v[v]] for c, v in chunks.items()}
            units = stage_units(p.schedule, p.pp, stage, p.micro_batches, p.vpp)
            n_f: dict[int, int] = {}
            n_b: dict[int, int] = {}
            # activations kept from each forward until its backward, as build_stage counts them
            saved = {c: sum(fb[x][2] for x in ns) for c, ns in names.items()}
            live = peak_act = 0
            for kind, _mb, c in units:
                cnt = n_f if kind == "F" else n_b
                cnt[c] = cnt.get(c, 0) + 1
                if c in saved:
                    live += saved[c] if kind == "F" else -saved[c]
                    peak_act = max(peak_act, live)
            w = o = 0.0
            res = transient = 0
            for c, ns in names.items():
                w += n_f.get(c, 0) * sum(fb[x][0] for x in ns) + n_b.get(c, 0) * sum(fb[x][1] for x in ns)
                if n_b.get(c, 0):  # the step programs follow the chunk's last backward
                    w += sum(st[x][0] for x in ns)
                    o += sum(st[x][1] for x in ns)
                res += sum(st[x][2] for x in ns)
                # the largest op's working set (compute nodes: the only ones with a tensor size)
                transient = max([transient, *(fb[x][3] for x in ns), *(st[x][3] for x in ns)])
            work.append((w, o))
            resident.append(res)
            peak.append(res + peak_act + transient)
        return StageFigures(work, p.micro_batches, peak, resident, p.schedule)

    # ---- pieces ------------------------------------------------------------------------------
    def _setup(self, plan: dict[str, Any]) -> Any:
        """The plan's :func:`~ettools.converters.symbolic.synth.train_setup`. That resolves the
        template and checks every tensor's size (milliseconds), so it runs once per plan without its
        ZeRO stage, recompute, schedule and buckets: ``train_setup`` puts those in the Plan's own
        fields only (``vpp`` off the interleaved schedule: 1)."""
        from ettools.converters.symbolic.synth import recompute_mode, train_setup

        base = dict(plan, zero=0, recompute=False, bucket_mb=None, schedule="1f1b", vpp=1)
        k = plan_key(base)
        s = self._setups.get(k)
        if s is None:
            try:
                s = train_setup(self.ctx.model, **synth_kwargs(self.ctx, base))
            except (ValueError, KeyError) as e:
                s = e  # refused: every plan of this shape is
            self._setups[k] = s
        if isinstance(s, Exception):
            raise s
        inter = plan["schedule"] == "interleaved"
        return s._replace(plan=dataclasses.replace(
            s.plan, zero=plan["zero"], bucket_mb=plan["bucket_mb"], recompute=recompute_mode(bool(plan["recompute"])),
            schedule=plan["schedule"], vpp=plan["vpp"] if inter else 1))

    @staticmethod
    def _env(values: dict[str, int], p: Any) -> dict[str, Any]:
        env: dict[str, Any] = dict(values)
        env.update({"tp": p.tp, "cp": p.cp, "ep": p.ep, "edp": p.dp // p.ep, "dp": p.dp})
        env["Bl"] = values["B"] // p.dp  # the per-rank micro-batch (B is global)
        return env

    def _keys(self, s: Any) -> tuple[tuple, tuple, Any]:
        """``(fwd/bwd key, step key, the plan the programs are built from)`` (module docstring)."""
        p = s.plan
        common = (p.axes, p.sp, p.act_bytes, p.param_bytes, p.grad_bytes, p.kv_bytes, p.fp8_gemms,
                  p.vocab_parallel, p.phase, s.meta.get("dtype"))
        # the step programs (optimizer, weight casts, resident state) are recompute's alike: they
        # read the parameter gradients' layouts, which are the parameters' own (sharding rule 1)
        tied = bool(p.tie and s.model.ties)
        step = common + (p.zero, p.fsdp_modules if p.zero == 3 else None, p.optimizer, tied, tied and p.pp == 1)
        build = dataclasses.replace(p, schedule="1f1b", vpp=1, micro_batches=1, bucket_mb=None,
                                    pp_scatter_gather=False, dp_after_backward=False, grad_sync="iteration")
        return ("fb", p.recompute) + common, ("step",) + step, build

    def _programs(self, s: Any, which: str) -> tuple[tuple, dict[str, Any]]:
        from ettools.converters.symbolic.distribute import build_programs

        k_fb, k_step, build = self._keys(s)
        key = k_fb if which == "fb" else k_step
        progs = self._progs.get(key)
        if progs is None:
            progs = build_programs(s.model, build)
            self.stats["built"] += 1
            # one build serves both kinds: its fwd/bwd for k_fb, its step programs for k_step
            self._progs.setdefault(k_fb, progs)
            self._progs.setdefault(k_step, progs)
        return key, progs

    def _module_figures(self, s: Any, env: dict[str, Any], which: str) -> dict[str, tuple]:
        """Per module, ``which`` fb: ``(fwd µs, bwd µs, saved bytes, largest tensor size)``; step:
        ``(step µs, optimizer µs, resident bytes, largest tensor size)``."""
        key, progs = self._programs(s, which)
        sub = self._subs.get(key)
        if sub is None:
            sub = self._subs[key] = _compute_nodes(progs, which)
        nodes, symbols = sub
        nkey = (key, tuple(sorted((x, env[x]) for x in symbols)))
        hit = self._timed.get(nkey)
        if hit is None:
            hit = self._timed[nkey] = self._time(nodes, env, s)
            self.stats["timed"] += 1
        return hit

    def _time(self, progs: dict[str, Any], env: dict[str, Any], s: Any) -> dict[str, tuple]:
        """Compile the programs (compute nodes only) with ``env``; time them as the replay would."""
        from ettools.converters.symbolic.instantiate import (
            DEFAULT_DEVICE,
            Mesh,
            StageGraph,
            Stamper,
            compile_program,
        )
        from ettools.graph import StringTable, Trace, TraceMeta
        from ettools.replay import compute as cm

        strings = StringTable()
        names = list(progs)
        parts = [compile_program(progs[nm], env, strings, {}, dict(DEFAULT_DEVICE)) for nm in names]
        n = sum(c.n for c in parts)
        cols = {k: np.concatenate([c.cols[k] for c in parts]) for k in parts[0].cols}
        owner = np.repeat(np.arange(len(parts)), [c.n for c in parts])
        # one graph through the synthesizer's own stamping: the columns, shape attributes and
        # metadata (estimated durations, dtype) the replay's compute model reads on a real rank
        sg = StageGraph(0, cols, np.zeros(n + 1, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.uint8),
                        np.zeros(n, np.int64), np.full(n, -1, np.int64))
        meta_extra = {"durations": "estimated", "estimated_for": DEFAULT_DEVICE["name"],
                      "dtype": s.meta.get("dtype", "bf16"), **({"gemm_dtype": "fp8"} if s.plan.fp8_gemms else {})}
        g = Stamper(Mesh({"tp": 1, "cp": 1, "ep": 1, "edp": 1, "pp": 1}), [sg], {}, strings, meta_extra).rank_graph(0)
        g = cm.without_estimates(Trace(TraceMeta(), {0: g}, strings)).graphs[0]
        d = compute_us(g, self.model) if n else np.zeros(0)
        total = np.bincount(owner, weights=d, minlength=len(parts))
        opt = s.plan.optimizer
        is_opt = np.array([str(strings[i]).startswith(f"{opt} ") for i in g.name.tolist()], bool) \
            if opt and n else np.zeros(n, bool)
        optimizer = np.bincount(owner[is_opt], weights=d[is_opt], minlength=len(parts))
        out: dict[str, list] = {}
        for i, nm in enumerate(names):
            mod, _, prog = nm.rpartition(".")
            c = parts[i]
            big = int(c.cols["tensor_size"].max()) if c.n else -1
            if prog == "step":
                out[mod] = [float(total[i]), float(optimizer[i]), c.param_bytes, big]
            else:
                row = out.setdefault(mod, [0.0, 0.0, 0, -1])
                row[0 if prog == "fwd" else 1] = float(total[i])
                row[2] += c.saved_bytes  # the forward's (the backward saves none)
                row[3] = max(row[3], big)
        return {k: tuple(v) for k, v in out.items()}


def _compute_nodes(progs: dict[str, Any], which: str) -> tuple[dict[str, Any], frozenset[str]]:
    """Each module's ``fwd``/``bwd`` (``which`` fb) or ``step`` program reduced to its compute nodes
    (dependency-free copies) and the bytes it keeps (saved activations, resident state), with
    ``B = Bl·ep·edp`` and ``dp = ep·edp`` substituted; the symbols their values depend on."""
    from ettools.converters.symbolic.expr import Expr
    from ettools.converters.symbolic.program import Program
    from ettools.graph import NodeType

    e = Expr.sym("ep") * Expr.sym("edp")
    rule = {"B": Expr.sym("Bl") * e, "dp": e}
    out: dict[str, Any] = {}
    symbols: set[str] = set()
    for mod, mp in progs.items():
        for prog in ((mp.fwd, mp.bwd) if which == "fb" else (mp.step,)):
            nodes = []
            for nd in prog.nodes:
                if nd.type != NodeType.COMP_NODE:
                    continue
                new = dataclasses.replace(nd, flops=nd.flops.subs(rule), bytes=nd.bytes.subs(rule),
                                          repeat=nd.repeat.subs(rule), shape=tuple(x.subs(rule) for x in nd.shape),
                                          causal=tuple(x.subs(rule) for x in nd.causal), deps=(), imports=())
                for x in (new.flops, new.bytes, new.repeat, *new.shape, *new.causal):
                    symbols |= x.symbols
                nodes.append(new)
            kept = {"saved_bytes": prog.saved_bytes.subs(rule), "param_bytes": prog.param_bytes.subs(rule)}
            for x in kept.values():
                symbols |= x.symbols
            out[f"{mod}.{prog.key.rpartition('.')[2]}"] = Program(prog.key, nodes, **kept)
    return out, frozenset(symbols)
