"""What a trace file's name says: its rank number (``rank3.kineto.json.gz``, ``trace.3.et``).

Below :mod:`ettools.formats` and the readers in :mod:`ettools.converters` that name ranks by
their files, which all import it from here.
"""

from __future__ import annotations

import re
from pathlib import Path

_RANK_RE = re.compile(r"(\d+)(?!.*\d)")


def rank_from_name(path: Path) -> int | None:
    """The rank number in a file name (``rank3.kineto.json.gz``, ``trace.3.et``), if any."""
    name = path.name
    for suffix in (".gz", ".json", ".et", ".csv"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    for suffix in (".kineto", ".et", "_et", ".trace", "_trace"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    m = _RANK_RE.search(name)
    return int(m.group(1)) if m else None
