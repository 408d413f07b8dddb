"""What :func:`ettools.validate.validate` returns and how it is shown: the result model
(:class:`ValidationResult`, one :class:`Table` of :class:`Cell` per measure of :data:`MEASURES`)
and its rendering as Markdown, self-contained HTML, charts. The model lives here, below
:mod:`ettools.validate`, so that its ``to_markdown``/``to_html`` and the renderers are one module.

Every table gets a grouped bar chart (reference beside candidate per row, totals over ranks,
error % written over rows that differ) drawn with matplotlib (the ``[report]`` extra, imported
only here and only when a chart is drawn). Without matplotlib the report renders without charts
and says so. :func:`render_report` picks the format from the file suffix: ``.md`` writes the
charts as PNG files in ``<stem>_charts/`` beside it; ``.html``/``.htm`` embeds them as base64
``data:`` URIs, so the page is one file. Output bytes are deterministic (fixed PNG metadata).
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ettools.io import atomic_write

MEASURES = ("op_counts", "comm_counts", "comm_bytes", "compute_time", "peak_memory", "step_time")
TITLES = {
    "op_counts": "Operators by class",
    "comm_counts": "Communication calls by type",
    "comm_bytes": "Communication bytes by type",
    "compute_time": "Time by operator class",
    "peak_memory": "Peak memory",
    "step_time": "Step time",
}
UNITS = {"op_counts": "ops", "comm_counts": "calls", "comm_bytes": "bytes", "compute_time": "µs",
         "peak_memory": "bytes", "step_time": "µs"}
ADDITIVE = {"op_counts": True, "comm_counts": True, "comm_bytes": True, "compute_time": True,
            "peak_memory": False, "step_time": False}
MAX_RANK_COLUMNS = 4  # more ranks than this: the report shows totals and a per-rank error line
NO_MATPLOTLIB = "charts left out: matplotlib is not installed (pip install 'ettools[report]')"
_REF_COLOR = "#4C72B0"
_CAND_COLOR = "#DD8452"


# ---- result model --------------------------------------------------------------------------------

def error_pct(ref: float, cand: float) -> float:
    """\\|cand − ref\\| / ref × 100; 0 when both are 0; 100 when only the reference is 0."""
    if ref == 0:
        return 0.0 if cand == 0 else 100.0
    return abs(cand - ref) / abs(ref) * 100.0


def _total_error(pairs: list[tuple[float, float]]) -> float | None:
    if not pairs:
        return None
    ref = sum(r for r, _ in pairs)
    diff = sum(abs(c - r) for r, c in pairs)
    if ref == 0:
        return 0.0 if diff == 0 else 100.0
    return diff / abs(ref) * 100.0


@dataclass
class Cell:
    """One compared value: reference, candidate, error % (all None when not comparable)."""

    reference: float | None
    candidate: float | None
    error_pct: float | None

    def to_json(self) -> dict[str, Any]:
        """``{"reference", "candidate", "error_pct"}``."""
        return {"reference": _num(self.reference), "candidate": _num(self.candidate),
                "error_pct": self.error_pct}


def _num(v: float | None) -> Any:
    if v is None:
        return None
    if float(v).is_integer() and abs(v) < 2**53:
        return int(v)
    return float(v)


@dataclass
class Table:
    """One measure: ``cells[column][row]``; columns are rank labels then ``"total"``."""

    name: str
    title: str
    unit: str
    rows: list[str]
    columns: list[str]
    cells: dict[str, dict[str, Cell]]
    column_error_pct: dict[str, float | None]
    additive: bool

    @property
    def error_pct(self) -> float | None:
        """The measure's total error (see :mod:`ettools.validate`)."""
        return self.column_error_pct.get("total")

    @property
    def rank_columns(self) -> list[str]:
        """Columns other than ``"total"``."""
        return [c for c in self.columns if c != "total"]

    def differing(self) -> list[tuple[str, str, Cell]]:
        """``(column, row, cell)`` of every rank cell with a nonzero error."""
        return [(col, row, cell) for col in self.rank_columns for row, cell in self.cells[col].items()
                if cell.error_pct]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-serializable dict."""
        return {
            "title": self.title,
            "unit": self.unit,
            "rows": list(self.rows),
            "columns": list(self.columns),
            "total": "sum over ranks" if self.additive else "largest rank value",
            "error_pct": self.error_pct,
            "column_error_pct": dict(self.column_error_pct),
            "cells": {col: {row: cell.to_json() for row, cell in rows.items()}
                      for col, rows in self.cells.items()},
        }


@dataclass
class ValidationResult:
    """What :func:`ettools.validate.validate` found; rendered by :meth:`to_markdown`, :meth:`to_html`, :func:`render_report`."""

    reference_name: str
    candidate_name: str
    pairs: list[tuple[str, int, int]]  # (column label, reference rank, candidate rank)
    tables: dict[str, Table]
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    units: dict[str, list[str]] = field(default_factory=dict)
    sources: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    @property
    def errors(self) -> dict[str, float]:
        """Total error % of each compared measure."""
        return {k: t.error_pct for k, t in self.tables.items() if t.error_pct is not None}

    @property
    def max_error_pct(self) -> float:
        """Largest total error over the compared measures (0 when nothing was compared)."""
        return max(self.errors.values(), default=0.0)

    def exceeds(self, tolerance_pct: float, measures: list[str] | tuple[str, ...] | None = None) -> list[str]:
        """Measures whose total error is above ``tolerance_pct`` (all compared ones by default).

        A measure named in ``measures`` that could not be compared counts as exceeding: a CI gate
        must not pass on what it could not check. Unknown names raise ``ValueError``.
        """
        if measures is None:
            return [m for m, e in self.errors.items() if e > tolerance_pct]
        unknown = [m for m in measures if m not in MEASURES]
        if unknown:
            raise ValueError(f"unknown measure(s) {', '.join(unknown)}; known: {', '.join(MEASURES)}")
        errors = self.errors
        return [m for m in MEASURES if m in measures and (m not in errors or errors[m] > tolerance_pct)]

    def to_json(self) -> dict[str, Any]:
        """``{"max_error_pct", "errors", "tables", "skipped", "notes", "pairs", "reference", "candidate"}``."""
        return {
            "max_error_pct": self.max_error_pct,
            "errors": self.errors,
            "tables": {k: t.to_json() for k, t in self.tables.items()},
            "skipped": dict(self.skipped),
            "notes": list(self.notes),
            "pairs": [{"column": c, "reference_rank": r, "candidate_rank": k} for c, r, k in self.pairs],
            "reference": {"name": self.reference_name, "op_unit": self.units.get("reference", []),
                          "sources": self.sources.get("reference", {})},
            "candidate": {"name": self.candidate_name, "op_unit": self.units.get("candidate", []),
                          "sources": self.sources.get("candidate", {})},
        }

    def to_markdown(self, chart_dir: str | Path | None = None, chart_prefix: str = "") -> str:
        """The report as Markdown (see :func:`to_markdown`)."""
        return to_markdown(self, chart_dir=chart_dir, chart_prefix=chart_prefix)

    def to_html(self) -> str:
        """The report as one self-contained HTML page, charts embedded as base64 PNG."""
        return to_html(self)


# ---- numbers -------------------------------------------------------------------------------------

def fmt_value(v: float | None, unit: str) -> str:
    """A cell value for people: ints with separators, bytes in KiB/MiB, µs in ms above 10 ms."""
    if v is None:
        return "–"
    if unit == "bytes":
        return _human_bytes(v)
    if unit == "µs":
        if abs(v) >= 10_000:
            return f"{v / 1000:,.1f} ms"
        return f"{v:,.1f} µs"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:,.3g}"


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n):,} B" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"


def fmt_error(e: float | None) -> str:
    """``"7.14 %"``; ``"–"`` when not comparable."""
    if e is None:
        return "–"
    if e == 0:
        return "0 %"
    return f"{e:.3g} %" if e < 100 else f"{e:,.0f} %"


# ---- charts --------------------------------------------------------------------------------------

def have_matplotlib() -> bool:
    """Whether charts can be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def chart_png(table: Table, *, width: float = 6.4, height: float = 3.2, dpi: int = 100) -> bytes | None:
    """A grouped bar chart of one table's total column as PNG bytes (None without matplotlib)."""
    if not have_matplotlib():
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=dpi)
    try:
        _draw(ax, table)
        fig.tight_layout()
        return _png(fig)
    finally:
        plt.close(fig)


def overview_png(result: ValidationResult, *, dpi: int = 90) -> bytes | None:
    """All tables of ``result`` as panels of one figure (PNG bytes; None without matplotlib)."""
    if not have_matplotlib() or not result.tables:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    tables = list(result.tables.values())
    cols = 2 if len(tables) > 1 else 1
    rows = math.ceil(len(tables) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 2.7 * rows), dpi=dpi, squeeze=False)
    try:
        for ax, t in zip(axes.flat, tables):
            _draw(ax, t, compact=True)
        for ax in list(axes.flat)[len(tables):]:
            ax.axis("off")
        fig.suptitle(f"{result.candidate_name} vs {result.reference_name}: "
                     f"max total error {fmt_error(result.max_error_pct)}", fontsize=10)
        fig.tight_layout()
        return _png(fig)
    finally:
        plt.close(fig)


def _png(fig: object) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})  # type: ignore[attr-defined]
    return buf.getvalue()


def _chart_series(table: Table) -> tuple[list[str], list[float], list[float], list[float | None]]:
    """(labels, reference, candidate, error %) to plot: rows of the total column, or for a
    one-row table with several ranks (step time, peak memory) one bar pair per rank."""
    ranks = table.rank_columns
    if len(table.rows) == 1 and 1 < len(ranks) <= 16:
        row = table.rows[0]
        cells = [(f"rank {c}", table.cells[c][row]) for c in ranks]
    else:
        cells = [(r, table.cells["total"][r]) for r in table.rows]
        if table.name.startswith("comm_"):
            # keep the types either side has, so empty rows do not crowd the chart
            cells = [(r, c) for r, c in cells if (c.reference or 0) or (c.candidate or 0)] or cells[:1]
    return ([label for label, _ in cells], [c.reference or 0.0 for _, c in cells],
            [c.candidate or 0.0 for _, c in cells], [c.error_pct for _, c in cells])


def _draw(ax: object, table: Table, compact: bool = False) -> None:
    """Bars of reference and candidate per row on ``ax``; error % above the pairs that differ."""
    import numpy as np

    labels, ref_l, cand_l, errs = _chart_series(table)
    ref, cand = np.array(ref_l, float), np.array(cand_l, float)
    top = max(ref.max(initial=0), cand.max(initial=0))
    scale, unit = _axis_unit(table.unit, top)
    x = np.arange(len(labels))
    w = 0.38
    ax.bar(x - w / 2, ref / scale, w, label="reference", color=_REF_COLOR)  # type: ignore[attr-defined]
    ax.bar(x + w / 2, cand / scale, w, label="candidate", color=_CAND_COLOR)  # type: ignore[attr-defined]
    for i, e in enumerate(errs):
        if e:
            ax.annotate(fmt_error(e), (x[i], max(ref[i], cand[i]) / scale),  # type: ignore[attr-defined]
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=7, color="#B22222")
    ax.set_xticks(x)  # type: ignore[attr-defined]
    ax.set_xticklabels(labels, fontsize=7 if compact or len(labels) > 6 else 8,  # type: ignore[attr-defined]
                       rotation=20 if len(labels) > 5 else 0)
    ax.set_xlim(-0.5 - (1 - len(labels) / 3 if len(labels) < 3 else 0),  # type: ignore[attr-defined]
                len(labels) - 0.5 + (1 - len(labels) / 3 if len(labels) < 3 else 0))
    ax.tick_params(axis="y", labelsize=7)  # type: ignore[attr-defined]
    ax.set_ylabel(unit, fontsize=8)  # type: ignore[attr-defined]
    ax.set_ylim(0, (top / scale) * 1.25 if top > 0 else 1)  # type: ignore[attr-defined]
    ax.set_title(f"{table.title} (total error {fmt_error(table.error_pct)})", fontsize=9)  # type: ignore[attr-defined]
    ax.legend(fontsize=7, frameon=False, loc="upper left", ncols=2)  # type: ignore[attr-defined]
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)  # type: ignore[attr-defined]


def _axis_unit(unit: str, vmax: float) -> tuple[float, str]:
    if unit == "bytes":
        for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
            if vmax >= scale:
                return float(scale), name
        return 1.0, "bytes"
    if unit == "µs" and vmax >= 10_000:
        return 1000.0, "ms"
    return 1.0, unit


# ---- text ----------------------------------------------------------------------------------------

def _header_lines(result: ValidationResult) -> list[tuple[str, str]]:
    """(label, text) facts shown above the tables."""
    cols = [c for c, _, _ in result.pairs]
    pairs = ", ".join(f"{r}↔{k}" for _, r, k in result.pairs[:8])
    if len(result.pairs) > 8:
        pairs += f", … ({len(result.pairs)} pairs)"
    out = [
        ("reference", f"{result.reference_name} (operators counted as "
                      f"{'/'.join(result.units.get('reference', [])) or '?'} ops)"),
        ("candidate", f"{result.candidate_name} (operators counted as "
                      f"{'/'.join(result.units.get('candidate', [])) or '?'} ops)"),
        ("ranks compared (reference↔candidate)", pairs if cols else "none"),
        ("max total error", fmt_error(result.max_error_pct)),
    ]
    for side in ("reference", "candidate"):
        for measure, srcs in result.sources.get(side, {}).items():
            if srcs and measure in result.tables:
                out.append((f"{side} {measure.replace('_', ' ')} from", ", ".join(srcs)))
    return out


def display_unit(table: Table) -> str:
    """The unit every value of ``table`` is shown in (one per table, so its heading says it):
    ms for a time table whose largest value is 10 ms or more, else the table's unit."""
    if table.unit != "µs":
        return table.unit
    vals = [abs(v) for col in table.cells.values() for cell in col.values()
            for v in (cell.reference, cell.candidate) if v is not None]
    return "ms" if vals and max(vals) >= 10_000 else "µs"


def _fmt(v: float | None, table: Table, unit: str) -> str:
    if unit == "ms" and v is not None:
        return f"{v / 1000:,.1f}"
    if unit == "µs" and v is not None:
        return f"{v:,.1f}"
    return fmt_value(v, table.unit)


def _table_grid(table: Table) -> tuple[list[str], list[list[str]]]:
    """Header and body rows of one table as strings (per-rank columns only for few ranks); a last
    row gives the measure's total error, the number the summary shows."""
    unit = display_unit(table)
    rank_cols = table.rank_columns
    show = rank_cols if 1 < len(rank_cols) <= MAX_RANK_COLUMNS else []
    total_label = "total" if table.additive else "max over ranks"
    if len(rank_cols) == 1:
        total_label = f"rank {rank_cols[0]}"
    header = ["", *[f"rank {c}" for c in show], f"{total_label}: reference", "candidate", "error"]
    body = []
    for row in table.rows:
        line = [row]
        for c in show:
            cell = table.cells[c][row]
            line.append(f"{_fmt(cell.reference, table, unit)} / {_fmt(cell.candidate, table, unit)}"
                        f" ({fmt_error(cell.error_pct)})")
        cell = table.cells["total"][row]
        line += [_fmt(cell.reference, table, unit), _fmt(cell.candidate, table, unit),
                 fmt_error(cell.error_pct)]
        body.append(line)
    if len(table.rows) > 1 or len(rank_cols) > 1:  # Σ|c − r| / Σ r over every row and rank
        body.append(["total error (Σ|c − r| / Σ r, all rows and ranks)", *[
            fmt_error(table.column_error_pct.get(c)) for c in show], "", "", fmt_error(table.error_pct)])
    return header, body


def _rank_error_line(table: Table) -> str:
    """Per-rank total errors, worst first (for tables with many ranks)."""
    errs = [(c, table.column_error_pct.get(c)) for c in table.rank_columns]
    errs = [(c, e) for c, e in errs if e is not None]
    bad = sorted([(c, e) for c, e in errs if e], key=lambda x: (-x[1], int(x[0]) if x[0].isdigit() else 0))
    if not bad:
        return f"every rank: {fmt_error(0.0)}"
    shown = ", ".join(f"rank {c}: {fmt_error(e)}" for c, e in bad[:10])
    more = f" (+{len(bad) - 10} more)" if len(bad) > 10 else ""
    return f"ranks with errors: {shown}{more}; {len(errs) - len(bad)} rank(s) exact"


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def to_markdown(result: ValidationResult, chart_dir: str | Path | None = None, chart_prefix: str = "",
                written: list[Path] | None = None) -> str:
    """The report as Markdown. With ``chart_dir``, charts are written there as PNG files (their
    paths appended to ``written``) and linked as ``<chart_prefix><name>.png``; without, no charts
    are drawn."""
    written = [] if written is None else written
    lines = ["# Trace validation", ""]
    for label, text in _header_lines(result):
        lines.append(f"- **{label}**: {_md_escape(text)}")
    for note in result.notes:
        lines.append(f"- note: {_md_escape(note)}")
    for m, why in result.skipped.items():
        lines.append(f"- not compared: {m.replace('_', ' ')} ({_md_escape(why)})")
    charts = chart_dir is not None and have_matplotlib()
    if chart_dir is not None and not charts:
        lines.append(f"- {NO_MATPLOTLIB}")
    lines += ["", "| measure | total error |", "|---|---|"]
    lines += [f"| {t.title} | {fmt_error(t.error_pct)} |" for t in result.tables.values()]
    if charts:
        png = overview_png(result)
        if png is not None:
            written.append(_write_png(Path(chart_dir) / "overview.png", png))
            lines += ["", f"![overview]({chart_prefix}overview.png)"]
    for name, t in result.tables.items():
        lines += ["", f"## {t.title} ({display_unit(t)})", ""]
        if charts:
            png = chart_png(t)
            if png is not None:
                written.append(_write_png(Path(chart_dir) / f"{name}.png", png))
                lines += [f"![{t.title}]({chart_prefix}{name}.png)", ""]
        header, body = _table_grid(t)
        lines.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
        for row in body:
            lines.append("| " + " | ".join(_md_escape(c) for c in row) + " |")
        if len(t.rank_columns) > MAX_RANK_COLUMNS:
            lines += ["", _rank_error_line(t)]
    lines.append("")
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em}
td{text-align:right}td:first-child{text-align:left}th{background:#f3f3f3}
.bad{color:#b22222;font-weight:600}ul{line-height:1.5}img{max-width:100%}"""


def to_html(result: ValidationResult) -> str:
    """The report as one HTML page; charts embedded as ``data:image/png;base64`` images."""
    e = html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\"><title>Trace validation</title>",
           f"<style>{_CSS}</style></head><body>", "<h1>Trace validation</h1>", "<ul>"]
    for label, text in _header_lines(result):
        out.append(f"<li><b>{e(label)}</b>: {e(text)}</li>")
    for note in result.notes:
        out.append(f"<li>note: {e(note)}</li>")
    for m, why in result.skipped.items():
        out.append(f"<li>not compared: {e(m.replace('_', ' '))} ({e(why)})</li>")
    charts = have_matplotlib()
    if not charts:
        out.append(f"<li>{e(NO_MATPLOTLIB)}</li>")
    out.append("</ul>")
    out.append("<table><tr><th>measure</th><th>total error</th></tr>")
    for t in result.tables.values():
        cls = ' class="bad"' if t.error_pct else ""
        out.append(f"<tr><td>{e(t.title)}</td><td{cls}>{e(fmt_error(t.error_pct))}</td></tr>")
    out.append("</table>")
    if charts:
        png = overview_png(result)
        if png is not None:
            out.append(_img(png, "overview"))
    for t in result.tables.values():
        out.append(f"<h2>{e(t.title)} ({e(display_unit(t))})</h2>")
        if charts:
            png = chart_png(t)
            if png is not None:
                out.append(_img(png, t.title))
        header, body = _table_grid(t)
        out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        for row in body:
            cells = []
            for i, c in enumerate(row):
                bad = i == len(row) - 1 and c not in ("0 %", "–")
                attr = ' class="bad"' if bad else ""
                cells.append(f"<td{attr}>{e(c)}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</table>")
        if len(t.rank_columns) > MAX_RANK_COLUMNS:
            out.append(f"<p>{e(_rank_error_line(t))}</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'


def _write_png(path: Path, png: bytes) -> Path:
    with atomic_write(path) as f:
        f.write(png)
    return path


def render_report(result: ValidationResult, path: str | Path) -> list[Path]:
    """Write the report to ``path`` by suffix (``.md``, ``.markdown``, ``.html``, ``.htm``).

    Returns the files written (Markdown: the ``.md`` file, then its charts in
    ``<stem>_charts/``). Another suffix is a ``ValueError``.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        text = to_html(result)
        with atomic_write(path, "w") as f:
            f.write(text)
        return [path]
    if suffix in (".md", ".markdown"):
        chart_dir = path.parent / f"{path.stem}_charts"
        charts: list[Path] = []
        text = to_markdown(result, chart_dir=chart_dir, chart_prefix=f"{chart_dir.name}/", written=charts)
        with atomic_write(path, "w") as f:
            f.write(text)
        return [path, *charts]
    raise ValueError(f"report file must end in .md or .html, not {path.name!r}")
