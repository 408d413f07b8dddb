"""Every Kineto trace with device work under ``../shared/traces``, found by reading the files, and
the step figures a test checks a replay against, read with gzip and a JSON parser (not ettools'
readers).

A trace is one Kineto file, or the ``rank*.json.gz`` files of one folder (the ranks of one job).
New traces dropped into ``../shared/traces`` are picked up without a code change.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path
from typing import Any

import orjson

from ettools.gcpause import no_gc

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
_RANK_FILE = re.compile(r"^rank\d+\.json(\.gz)?$")


def load_json(raw: bytes | str) -> Any:
    """``raw`` parsed: with orjson, or the standard library's json where orjson refuses the text
    (NaN, integers past 64 bits, invalid UTF-8) — the values json gives either way, sooner; with
    no cyclic-GC passes over the millions of new objects (a parse frees none: about half its time)."""
    with no_gc():
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return json.loads(raw)


def read_json(path: Path) -> Any:
    """A JSON file, plain or gzipped, parsed with :func:`load_json`."""
    raw = Path(path).read_bytes()
    return load_json(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


@functools.cache
def raw_events(path: Path) -> tuple[dict, ...]:
    """The file's ``traceEvents`` (empty when the file is not a Kineto trace)."""
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ()
    return tuple(doc["traceEvents"])


def has_device_work(path: Path) -> bool:
    """True when the file holds at least one kernel, device copy or device memset.

    Read at collection by every xdist worker, so read fast and not kept: a file whose bytes name
    no ``traceEvents`` or none of the device categories (in any case) has none; the others are
    parsed with orjson (the stdlib's json where orjson refuses the text: NaN, integers past 64
    bits), the same test on the same ``traceEvents`` as :func:`raw_events` gives."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    low = raw.lower()
    if b'"traceevents"' not in low or not any(c.encode() in low for c in DEVICE_CATS):
        return False
    doc = load_json(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return False
    return any(isinstance(e, dict) and e.get("ph") == "X" and str(e.get("cat", "")).lower() in DEVICE_CATS
               for e in doc["traceEvents"])


def gpu_traces(root: Path = SHARED) -> list[str]:
    """Names (relative to ``root``) of every Kineto trace with device work: a folder of rank files
    counts once, other files each count alone."""
    out: set[str] = set()
    for f in sorted(root.rglob("*.json.gz")):
        if not has_device_work(f):
            continue
        siblings = [p for p in f.parent.iterdir() if _RANK_FILE.match(p.name)]
        if _RANK_FILE.match(f.name) and len(siblings) >= 1 and all(_RANK_FILE.match(p.name) for p in
                                                                   f.parent.glob("*.json.gz")):
            out.add(str(f.parent.relative_to(root)))
        else:
            out.add(str(f.relative_to(root)))
    return sorted(out)


def trace_files(name: str, root: Path = SHARED) -> list[Path]:
    """The files of trace ``name`` (rank files in rank order)."""
    p = root / name
    if not p.is_dir():
        return [p]
    return sorted(p.glob("rank*.json.gz"), key=lambda q: int(re.sub(r"\D", "", q.name.split(".")[0])))


def raw_steps(path: Path) -> list[float]:
    """``ProfilerStep#N`` durations on the host, in step order, straight from the file."""
    steps = [(float(e["ts"]), float(e["dur"])) for e in raw_events(path)
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
             and str(e.get("cat", "")).lower() not in ("gpu_user_annotation",)]
    return [d for _, d in sorted(steps)]
