"""Progress bars on stderr (tqdm), silenced by ``--quiet`` or when stderr is not a terminal.

tqdm is imported by the first bar, not with this module: every command imports this module (for
``--quiet``), and tqdm's own imports (``importlib.metadata``, ``email``, …) cost a command that
draws no bar (``ettools info``) a tenth of its start-up (issue 27).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from tqdm import tqdm

T = TypeVar("T")

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Silence (or re-enable) every progress bar of this process."""
    global _quiet
    _quiet = quiet


def is_quiet() -> bool:
    """Whether progress bars are silenced."""
    return _quiet


def progress(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """Wrap ``items`` in a progress bar on stderr unless quiet."""
    from tqdm import tqdm

    disable = _quiet or not sys.stderr.isatty()
    return iter(tqdm(items, desc=desc, total=total, unit=unit, disable=disable, file=sys.stderr, leave=False))


def bar(total: int, desc: str, unit: str = "it") -> tqdm:
    """A manual progress bar (``.update(n)``, ``.close()``) on stderr unless quiet."""
    from tqdm import tqdm

    disable = _quiet or not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, file=sys.stderr, leave=False)
