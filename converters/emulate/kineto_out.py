"""An emulated process's record laid out on a timeline and written as a Kineto trace.

The host thread issues the recorded ops in order. Each op costs the host its dispatch time (from
the host-cost table; with ``host="measured"`` the program's own time between ops, measured on this
machine, comes first); an op that launches device work does so through one ``cudaLaunchKernel``
whose kernel (``emulated <op>``) starts on its stream when the launch has returned and the stream
is free, and runs for the time given. A value read from the device (``.item()``) or a
``synchronize`` holds the host until every stream has drained. A collective on GPU tensors is a
``record_param_comms`` op and an NCCL kernel on the communication stream, after the compute
stream's work at its call (PyTorch makes the NCCL stream wait for the current one); the compute
stream waits for it only where the program does — ``work.wait()`` (a synchronous collective waits
at once) — or where a later kernel reads a tensor the collective writes, so asynchronous
collectives (DDP's buckets, FSDP's prefetched all-gathers) overlap compute as they would. On CPU
tensors (gloo) it is the ``c10d::`` op with a ``gloo:`` span on the gloo thread, the host waiting
for it. Steps are ``ProfilerStep#N`` spans. The trace header names the emulated GPU
(``deviceProperties``), the process group (``distributedInfo``), and says under ``ettools`` that
the times are modelled, not measured.
"""

from __future__ import annotations

from typing import Any

from .host_fit import CLASSES, launch_class

_CPU_TID, _GLOO_TID = 1, 2
# the program's own streams are numbered from 20 (:class:`.device.EmulatedStream`); NCCL's come after
_COMPUTE_STREAM, _COMM_STREAM = 7, 1_000_000
# ProcessGroupNCCL runs send/recv on a stream per peer pair, apart from the group's collectives;
# inside one batch_isend_irecv (one NCCL group) the recvs run beside the sends (a lane of their own)
_P2P_STREAM = _COMM_STREAM + 2
_KINETO_COLL = {"_allgather_base": "AllGather", "allgather": "AllGather", "allgather_into_tensor_coalesced": "AllGather",
                "allreduce": "AllReduce", "allreduce_coalesced": "AllReduce", "_reduce_scatter_base": "ReduceScatter",
                "reduce_scatter": "ReduceScatter", "reduce_scatter_tensor_coalesced": "ReduceScatter",
                "all_to_all": "SendRecv", "broadcast": "Broadcast", "reduce": "Reduce", "send": "SendRecv",
                "recv": "SendRecv", "barrier": "AllReduce", "gather": "SendRecv", "scatter": "SendRecv"}
_KINETO_DTYPE = {"float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
                 "int64": "long int", "int32": "int", "uint8": "unsigned char", "int8": "signed char", "bool": "bool"}
_GLOO = {"_allgather_base": "all_gather", "allgather": "all_gather", "allreduce": "all_reduce",
         "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter", "all_to_all": "all_to_all",
         "broadcast": "broadcast", "send": "send", "recv": "recv", "barrier": "barrier", "reduce": "reduce"}


def _launch_costs(table: Any) -> dict[str, float]:
    """Per-class launch costs (a single number: every class alike)."""
    if isinstance(table, dict):
        return {c: float(table.get(c, table.get("other", 0.0))) for c in CLASSES}
    return dict.fromkeys(CLASSES, float(table))


def _x(cat: str, name: str, ts: float, dur: float, tid: int, pid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": round(ts, 3),
            "dur": round(max(dur, 0.0), 3), "args": args}


def _op_args(row: list[Any], ext: int) -> dict[str, Any]:
    name, _gap, dims, types, conc = row[:5]
    return {"External id": ext, "Record function id": ext, "Input Dims": dims, "Input type": types,
            "Concrete Inputs": conc, "Ev Idx": ext}


def layout(raw: dict[str, Any], kernel_us: dict[int, float], comm_us: dict[int, float], costs: dict[str, float],
           host: str = "modelled") -> dict[str, Any]:
    """The Kineto trace (a JSON-able dict) of one process's ``raw`` record: rows ``i`` of its
    steps, kernels of ``kernel_us[i]`` µs and collectives of ``comm_us[i]`` µs; ``costs``: the
    host-cost table (:mod:`.host_fit`: ``top_op_us``, ``launch_op_us``, ``python_event_us``,
    ``launch_call_us``, ``sync_us``). Host time: with ``host="modelled"`` the program's Python
    events before each op at ``python_event_us``, each top-level op ``top_op_us`` and each kernel it
    launches ``launch_op_us``; with ``"measured"`` the gaps measured on this machine instead of
    the Python events."""
    rows = raw["rows"]
    pid = 1000 + int(raw.get("rank", 0))
    events: list[dict[str, Any]] = []
    free: dict[int, float] = {}
    ready: dict[int, float] = {}  # storage -> when the collective writing it ends
    comm_end: dict[int, float] = {}  # collective row -> its end
    groups: dict[int, float] = {}  # batch_isend_irecv call -> when its ops may start
    t = 0.0
    ext = 0
    corr = 0
    top_cost, launch_cost = float(costs["top_op_us"]), _launch_costs(costs["launch_op_us"])
    py_cost = float(costs["python_event_us"])
    call, sync_cost = float(costs["launch_call_us"]), float(costs["sync_us"])
    for step, first, end in raw["steps"]:
        step_start = t
        ext += 1
        step_ev = _x("user_annotation", f"ProfilerStep#{step}", t, 0.0, _CPU_TID, pid, {"External id": ext})
        events.append(step_ev)
        for i in range(first, end):
            row = rows[i]
            name, gap, _d, _t, _c, device, stream, _phase, module, kind, comm = row[:11]
            reads = row[11] if len(row) > 11 else []
            py, top = (int(row[12]), int(row[13])) if len(row) > 13 else (0, 1)
            t += max(float(gap), 0.0) if host == "measured" else py * py_cost
            own = top_cost if top else 0.0  # a top-level op's fixed cost, on its first aten op
            ext += 1
            args = _op_args(row, ext)
            if module:
                args["Module"] = module
            if kind == "sync" and device == "cuda" or name in ("cudaDeviceSynchronize", "cudaStreamSynchronize",
                                                                "cudaEventSynchronize"):
                done = max([t, *free.values()])
                end_t = done + sync_cost
                if name.startswith("cuda"):
                    events.append(_x("cuda_runtime", name, t, end_t - t, _CPU_TID, pid, {"External id": ext}))
                else:
                    events.append(_x("cpu_op", name, t, end_t - t, _CPU_TID, pid, args))
                    events.append(_x("cuda_runtime", "cudaStreamSynchronize", t + 0.5, end_t - t - 0.5, _CPU_TID,
                                     pid, {"External id": ext}))
                t = end_t
            elif kind == "wait":
                # work.wait(): the current stream waits for the collective's end (an event wait)
                done_at = comm_end.get(int(comm["row"]), 0.0)
                events.append(_x("cuda_runtime", "cudaStreamWaitEvent", t, call, _CPU_TID, pid, {"External id": ext}))
                free[stream] = max(free.get(stream, 0.0), done_at)
                t += call
            elif kind == "comm" and comm is not None:
                t, end_at = _collective(events, comm, comm_us.get(i, 0.0), name, args, t, free, pid, ext, corr,
                                        own + launch_cost["other"], call, groups)
                comm_end[i] = end_at
                for st in comm.get("writes") or []:
                    ready[st] = end_at
                corr += 1
            elif kind == "kernel" and device == "cuda":
                corr += 1
                op_cost = own + launch_cost[launch_class(name)]
                events.append(_x("cpu_op", name, t, op_cost, _CPU_TID, pid, args))
                launch = t + max(op_cost - call, 0.0) / 2
                events.append(_x("cuda_runtime", "cudaLaunchKernel", launch, call, _CPU_TID, pid,
                                 {"External id": ext, "correlation": corr}))
                # after its stream's work and after any collective that writes what it reads
                start = max(launch + call, free.get(stream, 0.0), *(ready.get(st, 0.0) for st in reads))
                dur = float(kernel_us.get(i, 0.0))
                events.append(_x("kernel", f"emulated {name}", start, dur, stream, 0,
                                 {"External id": ext, "device": 0, "stream": stream, "correlation": corr}))
                free[stream] = start + dur
                t += op_cost
            else:
                events.append(_x("cpu_op", name, t, own, _CPU_TID, pid, args))
                t += own
        step_ev["dur"] = round(max([t, *free.values()]) - step_start, 3)
        t = max([t, *free.values()])  # steps are taken as synchronized at their boundary
    gpu = raw.get("gpu_spec") or {}
    match = gpu.get("match") or {}
    compute = list(match.get("compute") or [9, 0])
    world, rank = int(raw.get("world", 1)), int(raw.get("rank", 0))
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": gpu.get("name", "emulated GPU"),
                              "totalGlobalMem": int(gpu.get("memory_bytes", 0)), "computeMajor": compute[0],
                              "computeMinor": compute[1] if len(compute) > 1 else 0,
                              "numSms": int(match.get("sms") or 0)}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "ettools": {"emulated": True, "gpu": raw.get("gpu"), "durations": "modelled", "host": host,
                    "peak_memory_bytes": raw.get("peak_memory"), "placeholder_reads": raw.get("placeholder_reads", 0),
                    "event_timings": raw.get("event_timings", 0),
                    "compiled_regions": raw.get("compiled", 0),
                    "step_kind": raw.get("step_kind"), "argv": raw.get("argv")},
        "traceEvents": sorted(events, key=lambda e: (e["ts"], e["tid"] != _CPU_TID)),
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 0,
    }


def _comm_stream(comm: dict[str, Any], free: dict[int, float], start: float,
                 groups: dict[int, float]) -> tuple[int, float]:
    """The stream of a GPU collective or send/recv and the earliest it may start there (after
    ``start``: its launch and the compute stream's work): a collective after the collective stream's
    work; a send/recv after its peer pair's, and every op of one ``batch_isend_irecv`` at once,
    when the group's first op could start."""
    coll, peer = comm["coll"], comm.get("peer")
    if coll not in ("send", "recv") or peer is None:
        return _COMM_STREAM, max(start, free.get(_COMM_STREAM, 0.0))
    pair = _P2P_STREAM + 2 * int(peer)
    group = comm.get("coalesced")
    if group is None:
        return pair, max(start, free.get(pair, 0.0), free.get(pair + 1, 0.0))
    if group not in groups:  # the group begins when every p2p lane before it is done
        groups[group] = max([start, *(v for s, v in free.items() if s >= _P2P_STREAM)])
    return pair + (coll == "recv"), max(start, groups[group])


def _collective(events: list[dict[str, Any]], comm: dict[str, Any], us: float, name: str,
                args: dict[str, Any], t: float, free: dict[int, float], pid: int, ext: int, corr: int,
                op_cost: float, call: float, groups: dict[int, float]) -> tuple[float, float]:
    """Emit one collective (NCCL form on GPU tensors, gloo form on CPU tensors); the host time
    after it and the collective's end."""
    coll = comm["coll"]
    ranks = comm.get("ranks") or []
    # ProcessGroupNCCL records a recv's buffer as its input too (In = Out = numel): so does this
    in_nelems = comm["out_nelems"] if coll == "recv" and comm.get("device") != "cpu" else comm["in_nelems"]
    meta = {"Collective name": coll, "In msg nelems": in_nelems, "Out msg nelems": comm["out_nelems"],
            "Group size": len(ranks), "dtype": comm["dtype"], "Process Group Name": str(comm.get("group", "0")),
            "Process Group Ranks": str(list(ranks)), "In split size": "[]", "Out split size": "[]"}
    if comm.get("peer") is not None:  # the global peer, under the key a real NCCL trace uses
        meta["Dst Rank" if coll == "send" else "Src Rank"] = comm["peer"]
    if comm.get("device") == "cpu":
        end = t + op_cost + us
        events.append(_x("cpu_op", name, t, end - t, _CPU_TID, pid, args))
        gloo = _GLOO.get(coll, coll)
        shapes = args["Input Dims"][0] if args["Input Dims"] and args["Input Dims"][0] else []
        dtype = _KINETO_DTYPE.get(comm["dtype"], comm["dtype"])
        events.append(_x("user_annotation", f"gloo:{gloo}", t + op_cost, us, _GLOO_TID, pid,
                         {"External id": ext, "Input Dims": shapes, "Input type": [dtype] * len(shapes)}))
        return end, end
    events.append(_x("cpu_op", name, t, op_cost, _CPU_TID, pid, args))
    events.append(_x("cpu_op", "record_param_comms", t + 0.1, op_cost - 0.2, _CPU_TID, pid, {"External id": ext, **meta}))
    launch = t + max(op_cost - call, 0.0) / 2
    events.append(_x("cuda_runtime", "cudaLaunchKernel", launch, call, _CPU_TID, pid,
                     {"External id": ext, "correlation": corr + 1}))
    stream, start = _comm_stream(comm, free, max(launch + call, free.get(_COMPUTE_STREAM, 0.0)), groups)
    dtype = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(comm["dtype"], comm["dtype"])
    kname = f"ncclDevKernel_{_KINETO_COLL.get(coll, 'SendRecv')}_Sum_{dtype}_RING_LL(emulated)"
    events.append(_x("kernel", kname, start, us, stream, 0,
                     {"External id": ext, "device": 0, "stream": stream, "correlation": corr + 1, **meta}))
    free[stream] = start + us
    return t + op_cost, start + us
