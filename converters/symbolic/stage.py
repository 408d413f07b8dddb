"""Stage graphs: the graph of one pipeline stage assembled from program instances along the
schedule (:func:`build_stage`), with a slot per collective and a peer offset per send/receive
instead of groups and peers (:class:`StageGraph`); the layers' split over the (virtual) stages
(:func:`assign_stages`) and the stage's peak memory."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ettools.graph import CollectiveType, EdgeKind, NodeType, StringTable

from .compiled import SHAPE_COLS, Compiled, _accumulate_program, _p2p_program, merge_sync
from .dualpipe import chunk_stage, mirror_reduction
from .mesh import MIRROR, Mesh
from .plan import Plan
from .program import ModulePrograms
from .schedule import split_layers, stage_units
from .zero_bubble import split_weight_grads


@dataclass
class StageGraph:
    """The nodes of one pipeline stage, with slots and peer offsets instead of groups and peers."""

    stage: int
    cols: dict[str, np.ndarray]
    dep_ptr: np.ndarray
    dep_id: np.ndarray
    dep_kind: np.ndarray
    peer_delta: np.ndarray  # per node; 0 where not a send/recv
    tags: np.ndarray  # per node; -1 where not a send/recv
    peak_memory: int = 0
    resident_bytes: int = 0
    activation_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    kv_cache_bytes: int = 0  # inference: the KV cache of every micro-batch the stage holds
    model_flops: int = 0  # per iteration, model-FLOPs convention (3x forward when training)
    # how the rows came about, ``(base, program, edges)``: instance i (a program run once: a module's
    # forward of one micro-batch, a receive, …) holds rows base[i]..base[i+1]-1 and is program
    # ``program[i]``, whose internal edges ``edges[program[i]]`` (``(src, dst)``, rows from the
    # instance's first) every instance of it has (ettools search bounds plans by them)
    instances: tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray]]] | None = None

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.cols["type"])


def assign_stages(uses: list[tuple[str, int, bool]], n_vstages: int) -> tuple[list[str], list[int]]:
    """Flatten ``(module, count, repeated)`` uses and give each instance a virtual stage.

    Repeated modules (the layers) are split evenly over the virtual stages; modules before the
    first repeated one go to the first virtual stage, after the last one to the last.
    """
    mods: list[str] = []
    is_layer: list[bool] = []
    for name, count, repeated in uses:
        mods += [name] * count
        is_layer += [repeated] * count
    layer_pos = [i for i, f in enumerate(is_layer) if f]
    vst = [0] * len(mods)
    if n_vstages == 1:
        return mods, vst
    if not layer_pos:
        raise ValueError("pipeline parallelism needs repeated modules (layers) to split")
    per = split_layers(len(layer_pos), n_vstages)
    k = 0
    for v, cnt in enumerate(per):
        for _ in range(cnt):
            vst[layer_pos[k]] = v
            k += 1
    first, last = layer_pos[0], layer_pos[-1]
    for i in range(len(mods)):
        if i < first:
            vst[i] = 0
        elif i > last:
            vst[i] = n_vstages - 1
    return mods, vst


def build_stage(stage: int, plan: Plan, mods: list[str], vst: list[int], programs: dict[str, ModulePrograms],
                compiled: dict[str, Compiled], act_bytes_out: dict[str, list[int]], strings: StringTable,
                mesh: Mesh, slots: dict[tuple, int] | None = None,
                device: dict[str, float] | None = None) -> StageGraph:
    """Assemble the graph of pipeline ``stage`` (see the module docstring).

    ``slots`` (the collective slots of the programs) is needed for pipeline scatter/gather
    (``plan.pp_scatter_gather``): each boundary transfer carries 1/tp of the tensor and the
    receiver all-gathers it over the TP group. With ``plan.dp_after_backward`` every gradient
    synchronisation node depends on the stage's last backward node (else each bucket follows its
    own gradients); either way the optimizer runs after all gradient reductions of the stage.
    ``device`` (peak FLOP/s, memory bandwidth) times the nodes the stage adds itself (gradient
    accumulation under ``plan.grad_accumulation == "separate"``), as :func:`.compiled.compile_program`.

    Under DualPipe (:mod:`.dualpipe`) the stage holds two chunks, model stages ``stage`` (chunk 0,
    forward direction) and ``pp − 1 − stage`` (chunk 1, reverse direction: its activations flow
    towards stage 0's rank), runs overlapped forward/backward pairs side by side, and all-reduces
    its gradients with its mirror rank's (the other copy) after its last unit."""
    pp, vpp, M = plan.pp, plan.vpp, plan.micro_batches
    V = pp * vpp
    dual = plan.schedule == "dualpipe" and plan.phase == "train"

    def holder(v: int, c: int) -> int:
        """The stage (rank along pp) that runs virtual stage ``v`` in chunk ``c``."""
        return chunk_stage(pp, v, c) if dual else v % pp

    # chain positions per virtual stage
    by_v: dict[int, list[int]] = {}
    for i, v in enumerate(vst):
        by_v.setdefault(v, []).append(i)
    if dual:
        v_of_chunk = {c: chunk_stage(pp, stage, c) for c in (0, 1) if chunk_stage(pp, stage, c) in by_v}
        my_vs = sorted(v_of_chunk.values())
    else:
        my_vs = [v for v in range(V) if v % pp == stage and v in by_v]
        v_of_chunk = {v // pp: v for v in my_vs}
    if plan.phase == "train":
        units = stage_units(plan.schedule, pp, stage, M, vpp)
    else:  # inference: forward passes only, micro-batches in order through the stage's chunks
        units = [("F", i, c) for i in range(M) for c in range(vpp)]
    # zero-bubble schedules run each backward as B (input gradients) and W (weight gradients);
    # DualPipe splits some backwards only: ``I`` (input gradients, its ``W`` later), ``B``/``OB`` whole
    split = any(k == "W" for k, _m, _c in units)
    b_halved = split and not dual  # ZB-H1: every B is an input-gradient half

    def input_half(kind: str) -> bool:
        return kind == "I" or (kind == "B" and b_halved)

    def grads_done(kind: str) -> bool:
        """Whether the unit's end has a micro-batch's weight gradients."""
        return kind == "W" or (kind in ("B", "OB") and not b_halved)

    halves: dict[str, tuple[Compiled, Compiled]] = {}

    def bwd_part(mod: str, which: int) -> Compiled:
        if mod not in halves:
            halves[mod] = split_weight_grads(compiled[f"{mod}.bwd"], strings)
        return halves[mod][which]

    # the last backward unit of each chunk (gradient synchronisation + optimizer follow it)
    last_b = {}
    for idx, (kind, _mb, c) in enumerate(units):
        if grads_done(kind):
            last_b[c] = idx
    pp_stride = mesh.stride("pp")

    inst_prog: list[Compiled] = []
    inst_info: list[tuple[str, int, int]] = []  # (kind, chain position or boundary, mb)
    inst_peer: list[int] = []
    inst_tag: list[int] = []
    key_of: dict[tuple[str, int, int], int] = {}
    p2p_cache: dict[tuple[str, str, int], Compiled] = {}
    bucket_cache: dict[tuple, Compiled] = {}
    schedule_chain: list[int] = []  # instances whose order the schedule fixes
    # the serial instances the next one waits for: one, but both lanes' last right after an
    # overlapped pair (DualPipe), whose forward and backward only wait for what came before the pair
    tails: list[int] = []
    seq_edges: list[tuple[int, int]] = []  # (instance, a serial instance that starts after it ends)

    def add(prog: Compiled, kind: str, pos: int, mb: int, peer: int = 0, tag: int = -1, serial: bool = True) -> int:
        i = len(inst_prog)
        inst_prog.append(prog)
        inst_info.append((kind, pos, mb))
        inst_peer.append(peer)
        inst_tag.append(tag)
        key_of[(kind, pos, mb)] = i
        if serial:
            schedule_chain.append(i)
            seq_edges.extend((t, i) for t in tails)
            tails[:] = [i]
        return i

    sg_slot = -1
    if plan.pp_scatter_gather and plan.tp > 1 and not plan.sp:
        if slots is None:
            raise ValueError("pipeline scatter/gather needs the collective slots")
        sg_slot = slots.setdefault(("tp",), len(slots))

    def p2p(kind: str, what: str, mod: str, nbytes: int) -> Compiled:
        if sg_slot >= 0:
            nbytes = -(-nbytes // plan.tp)  # each TP rank moves its 1/tp share
        key = (kind, what, nbytes, mod)
        c = p2p_cache.get(key)
        if c is None:
            c = p2p_cache[key] = _p2p_program(kind, f"{kind}_{what} {mod}", strings, nbytes, sg_slot)
        return c

    accum_cache: dict[int, Compiled] = {}

    def accumulate(k: int, mb: int) -> None:
        """Autograd's accumulation of module ``k``'s weight gradients into those of the micro-batches
        before ``mb`` (the first's are taken as they are): an in-place add over every local
        gradient, reading both and writing one (``plan.grad_accumulation == "separate"``)."""
        if plan.grad_accumulation != "separate" or mb < 1:
            return
        nb = compiled[f"{mods[k]}.step"].grad_bytes
        if nb <= 0:
            return
        if k not in accum_cache:
            accum_cache[k] = _accumulate_program(f"add.grad_accumulation {mods[k]}", strings,
                                                 -(-nb // plan.grad_bytes), 3 * nb, device)
        add(accum_cache[k], "accum", k, mb)

    def peer_delta(v_from: int, v_to: int, c: int) -> int:
        return (holder(v_to, c) - holder(v_from, c)) * pp_stride

    last_b_stage = max((i for i, (k, _m, c) in enumerate(units) if grads_done(k) and c in v_of_chunk), default=-1)
    after: list[tuple[int, int]] = []  # (sync instance, backward instance it waits for)
    step_syncs: list[int] = []  # the last micro-batch's synchronisation instances
    deferred: list[tuple] = []  # after backward: the last step's synchronisation, added at the end
    last_bwd = -1

    def add_sync(prog: Compiled, kind: str, k: int, mb: int, is_last: bool) -> None:
        i = add(prog, kind, k, mb, serial=False)
        if plan.dp_after_backward:
            after.append((i, last_bwd))
        if is_last:
            step_syncs.append(i)

    def sync_instances(pos: list[int], mb: int, which: str) -> None:
        if plan.bucket_mb is None:
            for k in reversed(pos):
                prog = compiled[f"{mods[k]}.{which}"]
                if prog.n:
                    add_sync(prog, "sync", k, mb, which == "step")
        else:
            for members in _buckets(pos, mods, compiled, which, plan.bucket_mb):
                key = (which, tuple(members))
                prog = bucket_cache.get(key)
                if prog is None:
                    prog = bucket_cache[key] = merge_sync(
                        [(k, compiled[f"{mods[k]}.{which}"]) for k in members], strings,
                        "all_reduce ddp.bucket")
                if prog.n:
                    add_sync(prog, "bucket", members[0], mb, which == "step")

    # DeepSpeed's engine sends a step's output at the start of the next step (idle or not): before
    # that step's receive on a backward step, after it on a forward step
    deferred_sends: list[tuple[Compiled, str, int, int, int, int]] = []
    defer = plan.schedule == "deepspeed"

    def send(prog: Compiled, kind: str, pos: int, mb: int, peer: int, tag: int) -> None:
        if defer:
            deferred_sends.append((prog, kind, pos, mb, peer, tag))
        else:
            add(prog, kind, pos, mb, peer, tag)

    def flush_sends() -> None:
        for a in deferred_sends:
            add(*a)
        deferred_sends.clear()

    fork: list[int] = []  # before an overlapped pair: what both its halves wait for
    for uidx, (kind, mb, c) in enumerate(units):
        if defer and kind in ("B", "IB"):
            flush_sends()
        if kind == "OF":
            fork = list(tails)
        elif kind == "OB":  # the backward beside the pair's forward: its own lane from the fork
            f_lane, tails[:] = list(tails), fork
        v = v_of_chunk.get(c)
        if v is None or kind in ("IF", "IB"):
            if kind == "IF":
                flush_sends()
            continue
        pos = by_v[v]
        if kind in ("F", "OF"):
            if v > 0:
                first = pos[0]
                for ti, nb in enumerate(act_bytes_out[mods[first - 1]]):
                    add(p2p("recv", "act", mods[first], nb), f"recv_act{ti}", first, mb,
                        peer_delta(v, v - 1, c), _tag(mb, v - 1, 0, V, M))
            flush_sends()
            for k in pos:
                add(compiled[f"{mods[k]}.fwd"], "fwd", k, mb)
            if v < V - 1:
                last = pos[-1]
                for ti, nb in enumerate(act_bytes_out[mods[last]]):
                    send(p2p("send", "act", mods[last], nb), f"send_act{ti}", last, mb,
                        peer_delta(v, v + 1, c), _tag(mb, v, 0, V, M))
        elif kind == "W":
            for k in reversed(pos):
                last_bwd = add(bwd_part(mods[k], 1), "bwdW", k, mb)
                accumulate(k, mb)
        else:
            if v < V - 1:
                last = pos[-1]
                for ti, nb in enumerate(act_bytes_out[mods[last]]):
                    add(p2p("recv", "grad", mods[last], nb), f"recv_grad{ti}", last, mb,
                        peer_delta(v, v + 1, c), _tag(mb, v, 1, V, M))
            for k in reversed(pos):
                last_bwd = add(bwd_part(mods[k], 0) if input_half(kind) else compiled[f"{mods[k]}.bwd"], "bwd", k, mb)
                if not input_half(kind):
                    accumulate(k, mb)
            if v > 0:
                first = pos[0]
                for ti, nb in enumerate(act_bytes_out[mods[first - 1]]):
                    send(p2p("send", "grad", mods[first], nb), f"send_grad{ti}", first, mb,
                        peer_delta(v, v - 1, c), _tag(mb, v - 1, 1, V, M))
            if kind == "OB":  # the pair has ended once both lanes have
                tails[:] = f_lane + tails
        if grads_done(kind):
            is_last = uidx == last_b[c]
            if is_last and plan.dp_after_backward:
                deferred.append((pos, mb))
                if uidx == last_b_stage:
                    for pos_d, mb_d in deferred:
                        sync_instances(pos_d, mb_d, "step")
            elif is_last or plan.grad_sync == "microbatch":
                sync_instances(pos, mb, "step" if is_last else "sync")

    flush_sends()
    if dual and my_vs:
        # the two copies of each stage are one model: the rank's gradients (both chunks) summed with
        # its mirror rank's, which runs the same two stages in the opposite directions
        nbytes = sum(compiled[f"{mods[k]}.step"].grad_bytes for v in my_vs for k in by_v[v])
        if nbytes:
            if slots is None:
                raise ValueError("the dualpipe schedule needs the collective slots")
            mirror_slot = slots.setdefault((MIRROR,), len(slots))
            step_syncs.append(add(mirror_reduction(strings, nbytes, mirror_slot), "mirror", -1, -1, serial=False))
    n_inst = len(inst_prog)
    # programs as one table; instance rows gathered from it (no per-instance array work)
    uniq: dict[int, int] = {}
    plist: list[Compiled] = []
    for p in inst_prog:
        if id(p) not in uniq:
            uniq[id(p)] = len(plist)
            plist.append(p)
    pid = np.fromiter((uniq[id(p)] for p in inst_prog), np.int64, n_inst)
    psize = np.array([p.n for p in plist], np.int64)
    poff = np.zeros(len(plist) + 1, np.int64)
    np.cumsum(psize, out=poff[1:])
    sizes = psize[pid]
    base = np.zeros(n_inst + 1, np.int64)
    np.cumsum(sizes, out=base[1:])
    n = int(base[-1])
    inst_of_row = np.repeat(np.arange(n_inst), sizes)
    gather = poff[pid][inst_of_row] + (np.arange(n, dtype=np.int64) - base[:-1][inst_of_row])
    cols = {}
    for k in ("type", "name", "num_ops", "tensor_size", "comm_type", "comm_bytes", "slot", "dur") + SHAPE_COLS:
        table = np.concatenate([p.cols[k] for p in plist]) if plist else np.zeros((0, 4) if k == "shape" else 0)
        cols[k] = table[gather]
    peer_delta_col = np.asarray(inst_peer, np.int64)[inst_of_row]
    tag_col = np.asarray(inst_tag, np.int64)[inst_of_row]
    is_p2p = (cols["type"] == NodeType.COMM_SEND_NODE) | (cols["type"] == NodeType.COMM_RECV_NODE)
    tag_col = np.where(is_p2p, tag_col, -1)
    peer_delta_col = np.where(is_p2p, peer_delta_col, 0)

    # internal edges, tiled per program
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    kinds: list[np.ndarray] = []
    for j, p in enumerate(plist):
        if not len(p.e_src):
            continue
        b = base[:-1][pid == j][:, None]
        srcs.append((b + p.e_src[None, :]).ravel())
        dsts.append((b + p.e_dst[None, :]).ravel())
    if srcs:
        kinds.append(np.full(sum(len(s) for s in srcs), int(EdgeKind.DATA), np.uint8))

    # links between instances (Python ints: a few per instance)
    memo: dict[tuple[int, str], tuple[int, ...]] = {}
    first_of_v = {v: by_v[v][0] for v in my_vs}
    last_of_v = {v: by_v[v][-1] for v in my_vs}
    base_l = base.tolist()
    exports_l = [{k: (tuple(r.tolist()), pt) for k, (r, pt) in p.exports.items()} for p in plist]
    imports_l = [[(k, tuple(r.tolist())) for k, r in p.imports.items()] for p in plist]
    pid_l = pid.tolist()

    def grad_source(pos: int, mb: int, port: str) -> tuple[int | None, str]:
        # a parameter's gradient: the weight-gradient half where the backward is split and it
        # exports the port, else the (input-gradient half of the) backward
        w = key_of.get(("bwdW", pos, mb))
        if w is not None and port in exports_l[pid_l[w]]:
            return w, port
        return key_of.get(("bwd", pos, mb)), port

    def source(i: int, port: str) -> tuple[int, ...]:
        key = (i, port)
        hit = memo.get(key)
        if hit is not None:
            return hit
        kind, pos, mb = inst_info[i]
        j, q = None, None
        head, _, rest = port.partition(":")
        if kind in ("bucket", "sync") and head.partition("@")[0] == "tgrad":
            # a tied weight's gradient from the other module using it (once in the model)
            um, _, up = rest.partition(":")
            j, q = grad_source(mods.index(um), mb, f"pgrad:{up}")
        elif kind == "bucket":
            stem, _, at = head.partition("@")
            j, q = grad_source(int(at), mb, f"{stem}:{rest}")
        elif kind in ("fwd", "bwd", "bwdW", "sync"):
            v = vst[pos]
            if head == "bw":  # a weight-gradient half reading its input-gradient half
                j, q = key_of.get(("bwd", pos, mb)), port
            elif head == "in":
                if pos == first_of_v[v]:
                    j, q = key_of.get((f"recv_act{rest}", pos, mb)), "out"
                else:
                    j, q = key_of.get(("fwd", pos - 1, mb)), f"out:{rest}"
            elif head == "gout":
                if pos == last_of_v[v]:
                    j, q = key_of.get((f"recv_grad{rest}", pos, mb)), "out"
                else:
                    j, q = key_of.get(("bwd", pos + 1, mb)), f"gin:{rest}"
            elif head in ("t", "tc"):
                j, q = key_of.get(("fwd", pos, mb)), port
            elif head == "pgrad":
                j, q = grad_source(pos, mb, port)
        elif kind.startswith("send_act"):
            j, q = key_of.get(("fwd", pos, mb)), f"out:{kind[len('send_act'):]}"
        elif kind.startswith("send_grad"):
            j, q = key_of.get(("bwd", pos, mb)), f"gin:{kind[len('send_grad'):]}"
        if j is None:
            out: tuple[int, ...] = ()  # a graph input (the first module's input, data)
        else:
            rows, passthrough = exports_l[pid_l[j]].get(q, ((), ()))
            b0 = base_l[j]
            out = tuple(b0 + r for r in rows)
            for pp_ in passthrough:
                out += source(j, pp_)
        memo[key] = out
        return out

    link_src: list[int] = []
    link_dst: list[int] = []
    for i in range(n_inst):
        b0 = base_l[i]
        for port, rows in imports_l[pid_l[i]]:
            s_ = source(i, port)
            for x in s_:
                for r in rows:
                    link_src.append(x)
                    link_dst.append(b0 + r)
    if link_src:
        srcs.append(np.asarray(link_src, np.int64))
        dsts.append(np.asarray(link_dst, np.int64))
        kinds.append(np.full(len(link_src), int(EdgeKind.DATA), np.uint8))
    # schedule order: each serial instance starts after the previous one ends (both lanes of an
    # overlapped pair after what came before it, what follows the pair after both)
    if seq_edges:
        se = np.asarray(seq_edges, np.int64)
        srcs.append(base[se[:, 0] + 1] - 1)
        dsts.append(base[se[:, 1]])
        kinds.append(np.full(len(se), int(EdgeKind.CTRL), np.uint8))
    # after backward: every row of a synchronisation instance waits for the last backward node
    for i, b in after:
        if b >= 0 and base[i + 1] > base[i]:
            dsts.append(np.arange(base[i], base[i + 1], dtype=np.int64))
            srcs.append(np.full(int(base[i + 1] - base[i]), base[b + 1] - 1, np.int64))
            kinds.append(np.full(int(base[i + 1] - base[i]), int(EdgeKind.CTRL), np.uint8))
    # the optimizer step runs once all gradients are reduced (Megatron's finish_grad_sync /
    # DDP's wait before optimizer.step): its nodes wait for the stage's last backward node and for
    # every gradient reduction (all-reduce, reduce-scatter) of the last micro-batch
    if step_syncs and last_bwd >= 0:
        rows = np.concatenate([np.arange(base[i], base[i + 1], dtype=np.int64) for i in step_syncs])
        # a reduction over a group spanning pipeline stages (the tied embedding's first + last
        # stage) runs after the pipeline flush, as Megatron's finalize_model_grads: issued with the
        # stage's last micro-batch still to send, it would hold a one-collective-at-a-time queue
        # (ASTRA-sim's, the replay's) while its peer waits on that send -- a deadlock
        # DeepSpeed's engine reduces (tied, then data-parallel gradients) after its last step;
        # DualPipe's mirror pairs span stages too
        cross = [slot for axes, slot in (slots or {}).items() if "emb" in axes or MIRROR in axes]
        coll = cols["type"][rows] == NodeType.COMM_COLL_NODE
        flush_rows = rows[coll] if plan.schedule == "deepspeed" else \
            rows[np.isin(cols["slot"][rows], cross) & coll] if cross else rows[:0]
        for t in tails if len(flush_rows) else ():
            srcs.append(np.full(len(flush_rows), base[t + 1] - 1, np.int64))
            dsts.append(flush_rows)
            kinds.append(np.full(len(flush_rows), int(EdgeKind.CTRL), np.uint8))
        opt = rows[cols["type"][rows] == NodeType.COMP_NODE]
        red = rows[np.isin(cols["comm_type"][rows], [int(CollectiveType.ALL_REDUCE),
                                                     int(CollectiveType.REDUCE_SCATTER)])
                   & (cols["type"][rows] == NodeType.COMM_COLL_NODE)]
        mirror_rows = red[np.isin(cols["slot"][red], [slots[(MIRROR,)]])] if dual and (MIRROR,) in (slots or {}) \
            else red[:0]
        if len(mirror_rows):  # the copies are summed once each is reduced over its own groups
            others = red[~np.isin(red, mirror_rows)]
            srcs.append(np.tile(others, len(mirror_rows)))
            dsts.append(np.repeat(mirror_rows, len(others)))
            kinds.append(np.full(len(others) * len(mirror_rows), int(EdgeKind.CTRL), np.uint8))
        waits = np.append(red, base[last_bwd + 1] - 1)
        if len(opt):
            srcs.append(np.tile(waits, len(opt)))
            dsts.append(np.repeat(opt, len(waits)))
            kinds.append(np.full(len(opt) * len(waits), int(EdgeKind.CTRL), np.uint8))

    src = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    dst = np.concatenate(dsts) if dsts else np.zeros(0, np.int64)
    kind = np.concatenate(kinds) if kinds else np.zeros(0, np.uint8)
    # one edge per (dst, src): a data edge wins over a control edge
    keep = src != dst
    src, dst, kind = src[keep], dst[keep], kind[keep]
    key = dst * max(n, 1) + src
    order = np.lexsort((kind, key))
    key, src, dst, kind = key[order], src[order], dst[order], kind[order]
    first = np.ones(len(key), bool)
    first[1:] = key[1:] != key[:-1]
    src, dst, kind = src[first], dst[first], kind[first]
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=dep_ptr[1:])

    # memory: resident parameter state + activations kept between a forward and its backward
    resident = sum(compiled[f"{mods[k]}.step"].param_bytes for v in my_vs for k in by_v[v])
    saved_of_chunk = {c: sum(compiled[f"{mods[k]}.fwd"].saved_bytes for k in by_v[v])
                      for c, v in v_of_chunk.items()}
    live = peak_act = 0
    for kind_u, _mb, c in units:
        if c not in saved_of_chunk:
            continue
        # a split backward frees the inputs its W still reads after W
        if kind_u in ("F", "OF"):
            live += saved_of_chunk[c]
        elif grads_done(kind_u):
            live -= saved_of_chunk[c]
        peak_act = max(peak_act, live)
    transient = int(cols["tensor_size"].max()) if n else 0
    kv = M * sum(compiled[f"{mods[k]}.fwd"].cache_bytes for v in my_vs for k in by_v[v])
    fwd_flops = sum(inst_prog[i].model_flops for i in range(n_inst) if inst_info[i][0] == "fwd")
    sg = StageGraph(stage, cols, dep_ptr, src.astype(np.uint64), kind, peer_delta_col, tag_col,
                    resident + peak_act + kv + max(transient, 0), resident, peak_act, kv_cache_bytes=kv,
                    model_flops=int(fwd_flops * (3 if plan.phase == "train" else 1)),
                    instances=(base, pid, [(p.e_src, p.e_dst) for p in plist]))
    return sg


def _buckets(pos: list[int], mods: list[str], compiled: dict[str, Compiled], which: str,
             cap_mb: float) -> list[list[int]]:
    """Modules of a chunk grouped into gradient buckets in backward order, DDP-style: the first
    bucket holds up to 1 MiB (or the cap if smaller), the others up to ``cap_mb`` MiB."""
    out: list[list[int]] = []
    cur: list[int] = []
    size = 0
    cap = min(1 << 20, int(cap_mb * (1 << 20)))
    for k in reversed(pos):
        nb = compiled[f"{mods[k]}.{which}"].grad_bytes
        if cur and size + nb > cap:
            out.append(cur)
            cur, size = [], 0
            cap = int(cap_mb * (1 << 20))
        cur.append(k)
        size += nb
    if cur:
        out.append(cur)
    return out


def _tag(mb: int, boundary: int, direction: int, n_vstages: int, micro_batches: int) -> int:
    """Send/recv tag, unique per transfer: ``direction·M·nb + mb·nb + boundary`` for ``nb``
    pipeline boundaries and ``M`` micro-batches (with one boundary: activation of micro-batch
    ``m`` has tag ``m``, its gradient ``M + m``, the convention of the sample captures)."""
    nb = max(n_vstages - 1, 1)
    return direction * micro_batches * nb + mb * nb + boundary

