"""The Kineto block reader: events → compact columns, a block of events at a time.

:func:`extract_blocks` is the fast path of :func:`ettools.converters.kineto_events.extract`. It
reads the events in blocks of :data:`~ettools.converters.kineto_events.BLOCK`, from a parsed list
or from the chunks of :class:`ettools.json_chunks.ItemChunks` (the ``traceEvents`` array
parsed a slice of text at a time), and keeps nothing of an event object once its block is
read: what later passes need of it is reduced at once to columns (times, codes, int args), the
launch geometry of kernels, the operand texts of CPU ops, reduced ``[memory]`` rows, fwdbwd flow
columns, and the whole ``args`` only of the few events whose args a later pass reads (sync events,
and the NCCL/gloo/c10d events the collectives are read from: :func:`keeps_args`). So the parsed
JSON of a whole trace, ~7x its text, is never held at once (issue 26: memory ≤ 4x the input).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain, compress, repeat
from operator import and_, eq
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ettools.converters.kineto_columns import (
    _ARG_GROUPS,
    _DUR,
    _INT,
    _NAME,
    _PH,
    _PH_FLOW,
    _PH_INSTANT,
    _PH_KIND,
    _PH_TABLE,
    _PH_X,
    _TS,
    ARG_COLUMNS,
    BLOCK,
    CPU_OP,
    FLOW_KEYS,
    IS_DEVICE,
    KERNEL,
    MEMCPY,
    MEMSET,
    SYNC_EV,
    Events,
    _count_skipped,
    _FirstSeen,
    _Irregular,
    _pick,
    class_mask,
    classify,
    memory_rows,
    usable_flows,
)
from ettools.converters.kineto_comm import is_nccl_kernel

_COPY_OR_SET = class_mask((MEMCPY, MEMSET))
_ARGS_KEY, _CAT_KEY, _TID_KEY, _EMPTY, _ZERO = repeat("args"), repeat("cat"), repeat("tid"), repeat(""), repeat(0)
HUGE = "huge"  # operand value of a CPU op whose Input Dims no device could hold


class SparseArgs(dict):
    """``args`` of the event rows that keep theirs (row → dict); any other row reads as ``{}``.

    Stands in for the list of every event's args: indexing (and ``_pick``) by row gives what the
    list gave for every row a later pass reads."""

    def __missing__(self, row: int) -> dict[str, Any]:
        return {}


def keeps_args(name: Any) -> bool:
    """Whether the events named ``name`` keep their whole ``args``: the collectives are read from
    NCCL kernels and the ``record_param_comms``/``nccl:``/``c10d::``/``gloo:`` host ops around them
    (:mod:`ettools.converters.kineto_comm`); the name is tested as the graph will spell it."""
    s = name if isinstance(name, str) else str(name)
    return s == "record_param_comms" or s.startswith(("c10d::", "gloo:")) or is_nccl_kernel(s)


_MAX_DIM, _MAX_NUMEL = 1 << 40, 1 << 50


def plausible_dims(dims: list[Any]) -> bool:
    """Whether every tensor of a Kineto ``Input Dims`` list is one a device could hold."""
    for d in dims:
        if not isinstance(d, list):
            continue
        shapes = d if d and all(isinstance(x, list) for x in d) else [d]  # a TensorList's shapes
        for shape in shapes:
            n = 1
            for x in shape:
                if isinstance(x, int) and not isinstance(x, bool):
                    if x < 0 or x > _MAX_DIM:
                        return False
                    n *= max(x, 1)
                    if n > _MAX_NUMEL:
                        return False
    return True


def json_text(v: Any) -> str:
    """``v`` as compact JSON text ('' for None)."""
    return "" if v is None else orjson.dumps(v).decode()


def operand_value(args: dict[str, Any], seen: dict[Any, Any] | None = None) -> Any:
    """The operands of a CPU op, as the ``inputs`` attribute keeps them: None when its ``Input
    Dims`` is not a list, :data:`HUGE` when a tensor of it no device holds, else the JSON texts of
    (``Concrete Inputs``, ``Input Dims``, ``Input type``) (three '' when one is not JSON).

    ``seen`` (for args parsed from JSON) remembers the value of each distinct operand triple, keyed
    by the triple's JSON text: the same shapes recur every step (1.5 k distinct triples in 40 k ops
    of hta_8rank_rank3), and one ``orjson.dumps`` of the triple costs a fraction of the shape check
    and the three texts (issue 27: a fifth of the block reader's time on that trace). Equal texts
    are equal parsed values, types included (``1``, ``1.0`` and ``true`` differ), so the remembered
    value is the one they would give; a triple JSON cannot hold is read without the memo."""
    dims = args.get("Input Dims")
    if not isinstance(dims, list):
        return None
    if seen is not None:
        try:
            key = orjson.dumps((args.get("Concrete Inputs"), dims, args.get("Input type")))
        except (TypeError, ValueError):
            return _operand_texts(args, dims)
        v = seen.get(key)
        if v is None:
            v = seen[key] = _operand_texts(args, dims)
        return v
    return _operand_texts(args, dims)


def _operand_texts(args: dict[str, Any], dims: list[Any]) -> Any:
    """:func:`operand_value` of an op whose ``Input Dims`` is the list ``dims``, read afresh."""
    if not plausible_dims(dims):
        return HUGE
    try:
        return (json_text(args.get("Concrete Inputs")), json_text(dims), json_text(args.get("Input type")))
    except (TypeError, ValueError):  # a value JSON cannot hold (huge ints): no shapes for it
        return ("", "", "")


def _blocks(ev: list[Any] | Iterable[list[Any]]) -> Iterator[tuple[int, list[Any]]]:
    """(index of its first event in ``traceEvents``, block) of every block of the events."""
    if isinstance(ev, list):
        for b0 in range(0, len(ev), BLOCK):
            yield b0, ev[b0:b0 + BLOCK]
        return
    b0 = 0
    for chunk in ev:  # a parsed slice of the array: split into cache-sized blocks, then dropped
        for k in range(0, len(chunk), BLOCK):
            yield b0 + k, chunk[k:k + BLOCK]
        b0 += len(chunk)
        del chunk


def phases(block: list[Any]) -> np.ndarray:
    """``_PH_*`` code of each event of ``block``: when every phase is a one-letter ASCII string (all
    Kineto writes), their concatenation read as bytes through a table, with no per-event call;
    else event by event."""
    ph = list(map(_PH, block))
    try:
        text = "".join(ph)
    except TypeError:  # a phase that is not a string
        text = ""
    if len(text) == len(ph) and text.isascii() and "" not in ph:  # no empty phase: each is one letter
        return _PH_TABLE[np.frombuffer(text.encode("ascii"), np.uint8)]
    return np.fromiter(map(_PH_KIND.__getitem__, ph), np.int8, len(ph))


def extract_blocks(path: Path, ev: list[Any] | Iterable[list[Any]]) -> Events:
    """:func:`~ettools.converters.kineto_events.extract` of regular events, block by block (an
    irregular one raises ``_Irregular`` or the error of reading it).

    ``ev``: the event list, or an iterable of its consecutive slices (parsed chunks). Names, threads
    and categories go straight into their codes: their raw per-row lists are not kept
    (``Events.name``/``tid``/``cat`` stay empty; ``cat_code`` says so); nor are the event objects
    (``Events.events`` empty, ``Events.index`` their positions) or their args (a
    :class:`SparseArgs` of the few a later pass reads; ``Events.operands`` the CPU ops' operands)."""
    n = 0
    index_p: list[np.ndarray] = []
    args = SparseArgs()
    operands: dict[int, Any] = {}
    seen_texts: dict[bytes, Any] = {}  # operand triple's JSON -> its operand_value
    arg_p: dict[str, list[np.ndarray]] = {k: [] for k in ARG_COLUMNS}
    pid_p: list[np.ndarray] = []
    cat_p: list[np.ndarray] = []
    ts_p: list[np.ndarray] = []
    dur_p: list[np.ndarray] = []
    name_p: list[np.ndarray] = []
    tid_p: list[np.ndarray] = []
    flow_cols: dict[str, list[Any]] = {k: [] for k in FLOW_KEYS}
    grid: list[Any] = []
    block_dim: list[Any] = []
    geom_types: set[type] = set()
    memory: list[Any] = []
    n_memory = 0
    cat_ix, name_ix, tid_ix = _FirstSeen(), _FirstSeen(), _FirstSeen()
    cls_of: list[int] = []  # class of each category of cat_ix
    cls_tab = np.zeros(0, np.int8)
    keep_of: list[bool] = []  # whether each name of name_ix keeps its events' args
    keep_tab = np.zeros(0, bool)
    for b0, block in _blocks(ev):
        kind = phases(block)
        is_x = kind == _PH_X
        xi = np.flatnonzero(is_x)
        x = block if len(xi) == len(block) else _pick(block, xi)
        if x:
            m = len(x)
            # fromiter converts exactly as np.array(list, float64) does (strings, bools, big ints
            # alike) without the list; a value it cannot convert raises (the checked reader names it)
            t = np.fromiter(map(_TS, x), np.float64, m)
            d = np.fromiter(map(_DUR, x), np.float64, m)
            # args, cat and tid are optional (the checked reader's defaults: no args, "", 0); an
            # event without args is common (kernels of some captures, the profiler's own spans)
            a = list(map(dict.get, x, _ARGS_KEY))
            if not all(map(dict.__instancecheck__, a)):
                a = [v if isinstance(v, dict) else {} for v in a]
            cc = np.fromiter(map(cat_ix.__getitem__, map(dict.get, x, _CAT_KEY, _EMPTY)), np.int32, m)
            if len(cat_ix) > len(cls_of):
                cls_of += [classify(c) for c in list(cat_ix)[len(cls_of):]]
                cls_tab = np.array(cls_of, np.int8)
            cb = cls_tab[cc]
            nc = np.fromiter(map(name_ix.__getitem__, map(_NAME, x)), np.int32, m)
            if len(name_ix) > len(keep_of):
                keep_of += [keeps_args(s) for s in list(name_ix)[len(keep_of):]]
                keep_tab = np.array(keep_of, bool)
            for use_of, keys in _ARG_GROUPS:  # each arg, from the events whose class uses it
                use = use_of[cb]
                every = bool(use.all())
                rows = None if every else np.flatnonzero(use)
                sub = a if every else _pick(a, rows)
                for k, default in keys:
                    v = list(map(dict.get, sub, repeat(k), repeat(default)))
                    if not set(map(type, v)) <= _INT:  # a bool, str or float: int_column's rules apply
                        raise _Irregular
                    vals = np.fromiter(v, np.int64, len(v))
                    if every:
                        col = vals
                    else:
                        col = np.full(m, default, np.int64)
                        col[rows] = vals
                    arg_p[k].append(col)
            kern = np.flatnonzero(cb == KERNEL)
            if len(kern):  # launch geometry (the calibrated compute model keys on it)
                ka = _pick(a, kern)
                g = list(map(dict.get, ka, repeat("grid")))
                bd = list(map(dict.get, ka, repeat("block")))
                both = list(map(and_, map(list.__instancecheck__, g), map(list.__instancecheck__, bd)))
                geom_types.update(map(type, chain.from_iterable(compress(g, both))))
                geom_types.update(map(type, chain.from_iterable(compress(bd, both))))
                grid += g
                block_dim += bd
            _keep_args(args, a, n, keep_tab[nc] | (cb == SYNC_EV), cb)
            for i in np.flatnonzero(cb == CPU_OP).tolist():
                v = operand_value(a[i], seen_texts)
                if v is not None:
                    operands[n + i] = v
            dev = np.flatnonzero(IS_DEVICE[cb])
            pids = np.zeros(m, object)
            if len(dev):
                pids[dev] = list(map(dict.get, _pick(x, dev), repeat("pid"), repeat(0)))
            pid_p.append(pids)
            cat_p.append(cc)
            name_p.append(nc)
            tid_p.append(np.fromiter(map(tid_ix.__getitem__, map(dict.get, x, _TID_KEY, _ZERO)), np.int64, m))
            ts_p.append(t)
            dur_p.append(d)
            index_p.append(xi + b0)
            n += m
        if (kind == _PH_FLOW).any():
            f = _pick(block, np.flatnonzero(kind == _PH_FLOW))
            fw = list(compress(f, map(eq, map(dict.get, f, repeat("cat")), repeat("fwdbwd"))))
            for k, col in usable_flows(fw).items():
                flow_cols[k] += col
        if (kind == _PH_INSTANT).any():
            i = _pick(block, np.flatnonzero(kind == _PH_INSTANT))
            mem = list(compress(i, map(eq, map(dict.get, i, repeat("name")), repeat("[memory]"))))
            n_memory += len(mem)
            memory += memory_rows(mem)
        del block, x
    if not n:
        raise _Irregular  # nothing to read: the checked reader builds the empty columns
    ts = np.concatenate(ts_p)
    dur = np.concatenate(dur_p)
    if np.isnan(ts).any() or np.isnan(dur).any():
        raise _Irregular
    neg = dur < 0
    negative = int(neg.sum())
    if negative:
        dur[neg] = 0.0
    cat_code = np.concatenate(cat_p)
    out = Events(path, n, ts, dur, [], [], [], [], args, cls_tab[cat_code],
                 np.concatenate(name_p), list(name_ix), np.concatenate(tid_p), list(tid_ix),
                 [], memory, {}, negative, np.concatenate(pid_p), {},
                 {k: np.concatenate(v) for k, v in arg_p.items()}, cat_code, list(cat_ix), flow_cols,
                 {"grid": grid, "block": block_dim, "int_only": geom_types <= _INT},
                 index=np.concatenate(index_p), operands=operands, memory_events=n_memory)
    _count_skipped(out, dict(zip(cat_ix, cls_of)))
    return out


def _keep_args(store: SparseArgs, a: list[dict[str, Any]], row0: int, whole: np.ndarray, cb: np.ndarray) -> None:
    """Into ``store`` (rows from ``row0``): the whole args of the ``whole`` rows, and the ``bytes`` of
    copies and sets (their ``tensor_size``); the args of every other row are not read again."""
    for i in np.flatnonzero(whole).tolist():
        store[row0 + i] = a[i]
    for i in np.flatnonzero(_COPY_OR_SET[cb] & ~whole).tolist():
        if "bytes" in a[i]:
            store[row0 + i] = {"bytes": a[i]["bytes"]}
