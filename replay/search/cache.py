"""On-disk cache of search trials, keyed by plan, one file per search context.

A context (model, dimensions, GPU count, batch, sequence, dtype, system, network, timing) names a
JSON-lines file ``<dir>/<hash>.jsonl``; each line is one finished trial of one plan. A re-run, or a
search over a wider space in the same context, reads every line and re-evaluates only plans it does
not hold. Trials pruned by the bound are kept with their memory and lower bound (so a later run
re-checks the bound without synthesizing), but a later run whose best is worse replays them.
Appends are line-buffered: an interrupted search keeps what it finished.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import orjson

# bump when what a trial's numbers mean changes: old files are then ignored, not misread
CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ettools/search`` (``~/.cache/ettools/search``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ettools" / "search"


class TrialCache:
    """Trials of one context by plan key; ``None`` directory: in memory only."""

    def __init__(self, directory: str | Path | None, context: dict[str, Any]) -> None:
        from ettools import __version__

        key = orjson.dumps({"v": CACHE_VERSION, "ettools": __version__, **context}, option=orjson.OPT_SORT_KEYS)
        self.context_hash = hashlib.blake2b(key, digest_size=10).hexdigest()
        self.path = Path(directory) / f"{self.context_hash}.jsonl" if directory is not None else None
        self.trials: dict[str, dict[str, Any]] = {}
        self.hits = 0
        self._fh = None
        if self.path is not None and self.path.exists():
            for line in self.path.read_bytes().splitlines():
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a line cut by an interrupted run
                self.trials[rec["key"]] = rec["trial"]

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached trial of plan ``key`` (counted as a hit), or None."""
        t = self.trials.get(key)
        if t is not None:
            self.hits += 1
        return t

    def put(self, key: str, trial: dict[str, Any]) -> None:
        """Store a finished trial (appended to the file at once)."""
        self.trials[key] = trial
        if self.path is None:
            return
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab", buffering=0)
        self._fh.write(orjson.dumps({"key": key, "trial": trial}) + b"\n")

    def close(self) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
