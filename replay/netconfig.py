"""ASTRA-sim's network YAML and system JSON, read as-is (the inputs of :mod:`.network`).

Inputs
------
*Network YAML* (ASTRA-sim analytical backend; a flat file, read by a small parser of its subset:
``key: [a, b]`` flow lists, ``- item`` block lists, scalars, ``#`` comments)::

    topology: [ Ring, Switch ]     # one building block per dimension: Ring | Switch | FullyConnected
    npus_count: [ 8, 4 ]           # NPUs per dimension; NPU id -> dim 0 = id % n0, dim 1 = id // n0 % n1, ...
    bandwidth: [ 400.0, 50.0 ]     # GB/s per link per direction, 1 GB = 2^30 B
    latency: [ 500.0, 2000.0 ]     # ns per hop

*System JSON* (ASTRA-sim system layer): ``all-reduce-implementation``, ``all-gather-implementation``,
``reduce-scatter-implementation``, ``all-to-all-implementation`` (one algorithm per dimension:
``ring``, ``direct``, ``halvingDoubling``, ``doubleBinaryTree``; a single entry applies to every
dimension), ``preferred-dataset-splits`` (chunks a collective is cut into), plus the compute keys
``peak-perf`` (TFLOPS), ``local-mem-bw`` (GB/s), ``roofline-enabled`` used by :mod:`.compute`.
Unknown keys are kept and ignored.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ettools.errors import TraceError
from ettools.graph import CollectiveType

TOPOLOGIES = ("Ring", "Switch", "FullyConnected")
ALGORITHMS = ("ring", "direct", "halvingDoubling", "doubleBinaryTree")
_ALGO_ALIASES = {
    "ring": "ring", "onering": "ring", "direct": "direct", "onedirect": "direct",
    "halvingdoubling": "halvingDoubling", "onehalvingdoubling": "halvingDoubling",
    "doublebinarytree": "doubleBinaryTree", "dbt": "doubleBinaryTree",
}
_TOPO_ALIASES = {"ring": "Ring", "switch": "Switch", "fullyconnected": "FullyConnected", "fc": "FullyConnected"}
GB = float(1 << 30)  # ASTRA-sim's GB


# ---- the YAML subset ---------------------------------------------------------------------------

def _scalar(tok: str) -> Any:
    tok = tok.strip()
    if len(tok) >= 2 and tok[0] == tok[-1] and tok[0] in "'\"":
        return tok[1:-1]
    low = tok.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "~", ""):
        return None
    try:
        return int(tok)
    except ValueError:
        pass
    try:
        return float(tok)
    except ValueError:
        return tok


def parse_flat_yaml(text: str, path: str | Path = "<yaml>") -> dict[str, Any]:
    """Parse the flat YAML subset ASTRA-sim's network files use (see the module docstring).

    ``key: scalar``, ``key: [a, b, c]`` and ``key:`` followed by ``- item`` lines; ``#`` starts a
    comment. Anything else (nested mappings, multi-line flow lists, anchors) raises TraceError.
    """
    out: dict[str, Any] = {}
    current: str | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"\s+#.*$|^#.*$", "", raw).rstrip()
        if not line.strip() or line.strip() == "---":
            continue
        stripped = line.strip()
        if stripped.startswith("- "):
            if current is None or not isinstance(out.get(current), list):
                raise TraceError(path, f"line {lineno}: list item outside a list")
            out[current].append(_scalar(stripped[2:]))
            continue
        if line[0].isspace():
            raise TraceError(path, f"line {lineno}: nested mappings are not supported in a network file")
        m = re.match(r"^([A-Za-z0-9_\-]+)\s*:\s*(.*)$", line)
        if not m:
            raise TraceError(path, f"line {lineno}: expected 'key: value', got {stripped!r}")
        key, val = m.group(1), m.group(2).strip()
        current = key
        if val == "":
            out[key] = []
        elif val.startswith("["):
            if not val.endswith("]"):
                raise TraceError(path, f"line {lineno}: flow list must close on the same line")
            inner = val[1:-1].strip()
            out[key] = [_scalar(t) for t in inner.split(",")] if inner else []
        else:
            out[key] = _scalar(val)
    return out


# ---- configuration -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Dim:
    """One network dimension: building block, NPUs, link bandwidth (GB/s, 2^30 B) and hop latency (ns)."""

    topology: str
    npus: int
    bandwidth_gbps: float
    latency_ns: float

    @property
    def bytes_per_ns(self) -> float:
        """Link bandwidth in bytes per ns (ASTRA-sim's ``bw_GBps_to_Bpns``)."""
        return self.bandwidth_gbps * GB / 1e9

    def hops(self, a: int, b: int) -> int:
        """Hops between local coordinates ``a`` and ``b`` of this dimension."""
        if a == b:
            return 0
        if self.topology == "Switch":
            return 2
        if self.topology == "FullyConnected":
            return 1
        k = (b - a) % self.npus
        return min(k, self.npus - k)

    def neighbour_hops(self) -> int:
        """Hops between ring neighbours (the ring algorithm's messages)."""
        return 2 if self.topology == "Switch" else 1

    def delay(self, nbytes: int, hops: int) -> float:
        """``floor(hops·latency + bytes/bandwidth)`` ns: one message."""
        if nbytes <= 0 and hops <= 0:
            return 0.0
        return float(math.floor(hops * self.latency_ns + nbytes / self.bytes_per_ns))


@dataclass
class SystemConfig:
    """ASTRA-sim system JSON: algorithm per dimension and collective, dataset splits, compute keys."""

    algorithms: dict[str, list[str]] = field(default_factory=dict)  # "all-reduce" -> per dim
    splits: int = 1
    peak_tflops: float | None = None
    local_mem_bw_gbps: float | None = None
    roofline_enabled: bool = False
    raw: dict[str, Any] = field(default_factory=dict)
    endpoint_delay_ns: float = 0.0  # ASTRA-sim ``endpoint-delay``: per message hand-off at the NPU
    lifo: bool = False  # ``scheduling-policy`` LIFO: the newest waiting collective of a rank runs first
    from_file: bool = False  # an ASTRA-sim system file was read (its system layer's costs apply)

    def algorithm(self, kind: str, dim: int) -> str:
        """Algorithm of collective ``kind`` ("all-reduce", ...) on dimension ``dim`` (default ring)."""
        algs = self.algorithms.get(kind) or []
        if not algs:
            return "ring"
        return algs[dim] if dim < len(algs) else algs[-1]


def load_system(source: str | Path | dict[str, Any] | None) -> SystemConfig:
    """Read an ASTRA-sim system JSON (a path or an already parsed dict); None gives the defaults."""
    if source is None:
        return SystemConfig()
    path: str | Path = "<system>"
    if isinstance(source, dict):
        raw = dict(source)
    else:
        path = Path(source)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise TraceError(path, "no such file") from None
        except json.JSONDecodeError as e:
            raise TraceError(path, f"not valid JSON: {e}") from None
        if not isinstance(raw, dict):
            raise TraceError(path, "system configuration must be a JSON object")
    algos: dict[str, list[str]] = {}
    for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        v = raw.get(f"{kind}-implementation")
        if v is None:
            continue
        items = v if isinstance(v, list) else [v]
        names = []
        for it in items:
            a = _ALGO_ALIASES.get(str(it).replace("_", "").replace("-", "").lower())
            if a is None:
                raise TraceError(path, f"{kind}-implementation: unknown algorithm {it!r} "
                                       f"(known: {', '.join(ALGORITHMS)})")
            names.append(a)
        algos[kind] = names
    splits = raw.get("preferred-dataset-splits", 1)
    try:
        splits = max(1, int(splits))
    except (TypeError, ValueError):
        raise TraceError(path, f"preferred-dataset-splits must be an integer, got {splits!r}") from None
    peak = raw.get("peak-perf")
    bw = raw.get("local-mem-bw")
    try:
        ep = float(raw.get("endpoint-delay", 10))  # ASTRA-sim's default communication_delay: 10 ns
    except (TypeError, ValueError):
        raise TraceError(path, f"endpoint-delay must be a number, got {raw.get('endpoint-delay')!r}") from None
    return SystemConfig(algos, splits, float(peak) if peak is not None else None,
                        float(bw) if bw is not None else None, bool(raw.get("roofline-enabled", 0)), raw,
                        endpoint_delay_ns=max(ep, 0.0),
                        lifo=str(raw.get("scheduling-policy", "LIFO")).upper() == "LIFO", from_file=True)


_COLL_KIND = {
    int(CollectiveType.ALL_REDUCE): "all-reduce", int(CollectiveType.ALL_GATHER): "all-gather",
    int(CollectiveType.REDUCE_SCATTER): "reduce-scatter", int(CollectiveType.REDUCE_SCATTER_BLOCK): "reduce-scatter",
    int(CollectiveType.ALL_TO_ALL): "all-to-all", int(CollectiveType.BROADCAST): "all-gather",
    int(CollectiveType.GATHER): "all-gather", int(CollectiveType.REDUCE): "reduce-scatter",
    int(CollectiveType.SCATTER): "reduce-scatter", int(CollectiveType.BARRIER): "all-reduce",
}


def coll_kind(comm_type: int) -> str:
    """The ASTRA-sim collective family ("all-reduce", ...) a Chakra collective type is timed as."""
    return _COLL_KIND.get(int(comm_type), "all-reduce")
