"""The node columns of one Kineto rank while its graph is built: :class:`_Rank`.

Rows are the kept events in start order; the class holds their times, names (interned), node
types, resources (``thread <tid>``, ``stream <tid>`` or ``device <d> stream <tid>``), the comm
columns the collective builder fills, the edges and sparse attributes gathered so far, and the
rank's meta. The builders (:mod:`~ettools.converters.kineto_build`, ``kineto_edges``,
``kineto_attrs``, ``kineto_comm``, ``kineto_sync``) read and fill it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.converters.kineto_events import IS_DEVICE, Events, codes, distinct
from ettools.graph import AttrColumn, NodeType, StringTable


def _dense_unique(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` of small non-negative codes, by a lookup table."""
    if len(keys) == 0 or int(keys.max()) > 4 * len(keys) + 4096:
        return np.unique(keys, return_inverse=True)
    present = np.zeros(int(keys.max()) + 1, bool)
    present[keys] = True
    uniq = np.flatnonzero(present)
    slot = np.cumsum(present) - 1
    return uniq, slot[keys]


class _RowArgs:
    """``args`` of a node row (the event's args dict), looked up when asked."""

    def __init__(self, args: Any, order: np.ndarray) -> None:
        self.args, self.order = args, order

    def __getitem__(self, row: int) -> dict[str, Any]:
        return self.args[int(self.order[row])]


class _Rank:
    """Node-level columns of one rank while its graph is built (rows sorted by start)."""

    def __init__(self, e: Events, order: np.ndarray, strings: StringTable, base: float) -> None:
        self.e = e
        self.order = order
        self.n = n = len(order)
        self.strings = strings
        self.start = e.ts[order] - base
        self.dur = e.dur[order]
        self.end = self.start + self.dur
        self.cls = e.cls[order]
        self.args = _RowArgs(e.args, order)
        codes = e.name_code[order]
        used = distinct(codes)
        table = np.zeros(len(e.names), np.int32)
        table[used] = [strings.intern(x if isinstance(x, str) else str(x)) for x in (e.names[i] for i in used.tolist())]
        self.name_id = table[codes]
        self.is_dev = IS_DEVICE[self.cls]
        self.is_host = ~self.is_dev
        self.type = np.full(n, int(NodeType.COMP_NODE), np.uint8)
        self.comm_type = np.full(n, -1, np.int8)
        self.comm_bytes = np.full(n, -1, np.int64)
        self.comm_group = np.full(n, -1, np.int32)
        self.comm_peer = np.full(n, -1, np.int32)
        self.comm_tag = np.full(n, -1, np.int64)
        self.parent = np.full(n, -1, np.int64)
        self.launcher = np.full(n, -1, np.int64)
        self.edges: list[tuple[np.ndarray, np.ndarray, int]] = []
        self.attrs: dict[str, AttrColumn] = {}
        self.meta: dict[str, Any] = {}
        self._resources(e)

    def _resources(self, e: Events) -> None:
        tcode = e.tid_code[self.order]
        dev_rows = np.flatnonzero(self.is_dev)
        pcode = np.zeros(self.n, np.int64)  # host resources ignore the pid
        dcode, plist = codes(e.pids(self.order[dev_rows]), np.int64)
        pcode[dev_rows] = dcode
        plist = plist or [0]
        tlist = e.tids
        dev_pids = sorted(set(plist) if len(dev_rows) else [], key=str)
        self.devices = dev_pids
        multi = len(dev_pids) > 1
        combo = (self.is_dev.astype(np.int64) * len(plist) + pcode) * len(tlist) + tcode
        uniq, inv = _dense_unique(combo)
        names = []
        self.stream_key: dict[tuple[Any, Any], int] = {}  # (device pid, stream tid) -> resource id
        for c in uniq.tolist():
            t = tlist[c % len(tlist)]
            p = plist[(c // len(tlist)) % len(plist)]
            dev = c // (len(tlist) * len(plist))
            if dev:
                res = f"device {p} stream {t}" if multi else f"stream {t}"
            else:
                res = f"thread {t}"
            rid = self.strings.intern(res)
            names.append(rid)
            if dev:
                self.stream_key[(p, t)] = rid
        self.res = np.asarray(names, np.int32)[inv.reshape(-1)] if len(names) else np.zeros(0, np.int32)
        self.tid_code = tcode

    def add_edges(self, dst: np.ndarray, src: np.ndarray, kind: int) -> None:
        """``dst`` rows depend on ``src`` rows."""
        if len(dst):
            self.edges.append((np.asarray(dst, np.int64), np.asarray(src, np.int64), int(kind)))

    def set_attr(self, name: str, kind: str, rows: np.ndarray, values: list[Any]) -> None:
        """A sparse attribute column (rows any order; sorted here)."""
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            return
        if np.any(rows[1:] < rows[:-1]):
            o = np.argsort(rows, kind="stable")
            values = [values[i] for i in o.tolist()]
            rows = rows[o]
        self.attrs[name] = AttrColumn(kind, rows, list(values))

    def name(self, row: int) -> str:
        """Name of node ``row``."""
        return self.strings[int(self.name_id[row])]
