"""``tabulate(rows, headers, intfmt=",")`` (its default ``simple`` format), without importing tabulate.

``ettools info`` prints its tables with tabulate, whose import costs ~45 ms of CPU (most of it
``importlib.metadata``, imported for tabulate's version string): a twentieth of the whole command
on a 35 MB trace (issue 27, item 4). :func:`simple_table` gives the same bytes for the cells those
tables hold (Python ``int`` and printable ASCII ``str``), and hands any other table to tabulate
itself (floats, ``None``, bools, non-ASCII or control characters, ragged rows, no rows).

Cell types, formats and alignments follow tabulate 0.9-0.10: a column is ``int`` when every
non-empty cell is an int or reads as one (``"12"``, ``"1,234"``), ``float`` when every one reads as
a number (``"1.5"``, ``"1e3"``: formatted ``"g"``, so ``"12345.678"`` prints ``12345.7``), else
text. Number columns are right-aligned on their decimal points, text left-aligned; every column is
at least its header plus two wide; cells are joined by two spaces and each line's right end is
stripped. ``tests/test_text_table.py`` compares it with tabulate on many generated tables.
"""

from __future__ import annotations

import math
import re
from typing import Any

# tabulate's _float_with_thousands_separators
_THOUSANDS = re.compile(r"^(([+-]?[0-9]{1,3})(?:,([0-9]{3}))*)?(?(1)\.[0-9]*|\.[0-9]+)?$")
_NONE, _BOOL, _INT, _FLOAT, _STR = range(5)  # tabulate's order of generality (no bytes here)


def _plain(cell: Any) -> bool:
    """A cell this module renders as tabulate does: an ``int`` (not a bool) or printable ASCII text
    (no ANSI codes, tabs, newlines, backslashes: tabulate's colour and multi-line handling)."""
    if type(cell) is int:
        return True
    return type(cell) is str and cell.isascii() and cell.isprintable() and "\\" not in cell


def _is_int_text(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _is_number_text(s: str) -> bool:
    """tabulate's ``_isnumber`` of a str: ``float(s)`` works and is finite, or ``s`` spells inf/nan."""
    try:
        f = float(s)
    except ValueError:
        return False
    return not (math.isinf(f) or math.isnan(f)) or s.lower() in ("inf", "-inf", "nan")


def _type(cell: int | str) -> int:
    """tabulate's ``_type`` of an int or a plain str (numbers parsed)."""
    if type(cell) is int:
        return _INT
    if not cell:
        return _NONE
    if cell in ("True", "False"):
        return _BOOL
    if _is_int_text(cell) or ("." not in cell and _THOUSANDS.match(cell)):
        return _INT
    if _is_number_text(cell) or _THOUSANDS.match(cell):
        return _FLOAT
    return _STR


def _format(cell: int | str, kind: int) -> str:
    """tabulate's ``_format`` with ``floatfmt="g"``, ``intfmt=","`` and no colour codes."""
    if isinstance(cell, str) and not cell:
        return ""
    if kind == _INT:
        return format(cell, ",") if type(cell) is int else cell  # a str keeps its own digits
    if kind == _FLOAT:
        val = cell.replace(",", "") if isinstance(cell, str) and "," in cell else cell
        try:
            return format(float(val), "g")
        except (ValueError, TypeError):
            return f"{val}"
    return f"{cell}"


def _after_point(s: str) -> int:
    """tabulate's ``_afterpoint``: digits after the decimal point (or the exponent), -1 for none."""
    if (_is_number_text(s) or _THOUSANDS.match(s)) and not _is_int_text(s):
        pos = s.rfind(".")
        pos = s.lower().rfind("e") if pos < 0 else pos
        return len(s) - pos - 1 if pos >= 0 else -1
    return -1


def _column(cells: list[str], header: str, number: bool) -> tuple[list[str], str, int]:
    """The column's cells padded to one width, its padded header, and that width."""
    if number:  # tabulate's "decimal" alignment: pad after the digits so the points line up
        points = [_after_point(s) for s in cells]
        most = max(points)
        cells = [s + (most - p) * " " for s, p in zip(cells, points)]
    else:
        cells = [s.strip() for s in cells]
    width = max(max(map(len, cells)), len(header) + 2)
    if number:
        return [s.rjust(width) for s in cells], header.rjust(width), width
    return [s.ljust(width) for s in cells], header.ljust(width), width


def simple_table(rows: list[list[Any]], headers: list[str]) -> str:
    """``tabulate(rows, headers=headers, intfmt=",")``, byte for byte (see the module docstring)."""
    n = len(headers)
    if (not rows or not n or any(len(r) != n for r in rows) or not all(_plain(h) and type(h) is str for h in headers)
            or not all(_plain(c) for r in rows for c in r)):
        from tabulate import tabulate

        return tabulate(rows, headers=headers, intfmt=",")
    columns, head, widths = [], [], []
    for j, header in enumerate(headers):
        raw = [r[j] for r in rows]
        kind = max(map(_type, raw), default=_BOOL)
        kind = max(kind, _BOOL)  # tabulate's reduce starts from bool
        cells, h, w = _column([_format(c, kind) for c in raw], header, kind in (_INT, _FLOAT))
        columns.append(cells)
        head.append(h)
        widths.append(w)
    lines = ["  ".join(head).rstrip(), "  ".join("-" * w for w in widths).rstrip()]
    lines += ["  ".join(cells).rstrip() for cells in zip(*columns)]
    return "\n".join(lines)
