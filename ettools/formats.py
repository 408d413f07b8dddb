"""Input format detection (from content, not file names) and dispatch to the readers.

``load_trace`` is the one entry point the CLI and the Python API use to turn paths into a
:class:`~ettools.graph.Trace`: it sniffs each file, groups them by format, reads them with the
matching converter and, given PyTorch ET and Kineto files of the same ranks, links them.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ettools.errors import TraceError
from ettools.filenames import rank_from_name
from ettools.graph import Trace

FORMATS = ("kineto", "pytorch-et", "chakra", "chakra-json", "astrasim-json", "triosim")
_PEEK_BYTES = 1 << 16


def _peek(path: Path) -> bytes:
    """The first bytes of ``path``, gunzipped when it is gzip."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":
                try:
                    with gzip.GzipFile(fileobj=f) as gz:
                        return gz.read(_PEEK_BYTES)
                except (EOFError, OSError, zlib.error) as e:
                    # A truncated file still shows its beginning; judging the rest is the reader's job.
                    f.seek(0)
                    head = _partial_gunzip(f.read())
                    if head:
                        return head
                    raise TraceError(path, f"truncated or corrupt gzip data ({e})") from None
            return f.read(_PEEK_BYTES)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a directory, expected a file") from None


def _partial_gunzip(raw: bytes) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        return d.decompress(raw, _PEEK_BYTES)
    except zlib.error:
        return b""


def sniff(path: Path) -> str:
    """The format of one file: one of :data:`FORMATS`; raises :class:`TraceError` if unknown."""
    head = _peek(path)
    text = head.lstrip()
    if not text:
        raise TraceError(path, "empty file")
    if text[:1] in (b"{", b"["):
        if b'"traceEvents"' in head or b'"schemaVersion"' in head:
            return "kineto"
        if b'"workload_graph"' in head:
            return "astrasim-json"
        if b'"global_metadata"' in head:
            return "chakra-json"
        if b'"nodes"' in head and b'"schema"' in head:
            return "pytorch-et"
        raise TraceError(
            path, "JSON of an unknown shape: expected Kineto (traceEvents), PyTorch ET (schema, nodes), "
            "Chakra JSON (global_metadata) or ASTRA-sim JSON (workload_graph)"
        )
    if not head.strip(b"\0"):
        raise TraceError(path, "holds only NUL bytes: not a trace")
    if path.suffix == ".csv" or text[:40].lower().startswith((b"id,", b"name,", b"op")):
        return "triosim"
    if path.name.endswith((".json", ".json.gz")):  # a name that says JSON over content that is not
        raise TraceError(path, "named JSON but not JSON (nor a Chakra stream under a .et name)")
    # Anything else binary: a Chakra protobuf stream (its reader validates the frames).
    return "chakra"


def _expand(paths: list[Path]) -> list[Path]:
    """Directories become their trace files (sorted); files stay as given."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            if (p / "trace.csv").is_file() and (p / "tensor.csv").is_file():
                out.append(p / "trace.csv")
                continue
            with os.scandir(p) as it:  # the entry types come with the listing: no stat per file
                names = sorted(e.name for e in it
                               if e.is_file() and not e.name.startswith(".") and e.name != "comm_group.json"
                               and e.name != "manifest.json" and os.path.splitext(e.name)[1] in (".et", ".json", ".gz", ".csv"))
            kids = [p / nm for nm in names]
            if not kids:
                raise TraceError(p, "directory holds no trace files (.et, .json, .json.gz, .csv)")
            out.extend(kids)
        elif p.exists():
            out.append(p)
        else:
            raise TraceError(p, "no such file or directory")
    return out


@dataclass
class Loaded:
    """What :func:`load_trace` read: the trace, its format, and the ET↔Kineto link report if linked."""

    trace: Trace
    format: str
    files: list[Path]
    link_report: Any = None
    notes: list[str] = field(default_factory=list)
    # counts of defects kept (the trace is still usable): ``info --json`` lists them under ``problems``
    problems: dict[str, int] = field(default_factory=dict)
    # the note of each defect kind read (also in ``notes``), by kind: a pass that repairs a kind
    # (``convert``) withdraws its note and says what it did instead
    defect_notes: dict[str, str] = field(default_factory=dict)

    def note_defect(self, kind: str, note: str) -> None:
        """Say one defect kind read: one note line, with its count."""
        self.withdraw_defect(kind)
        self.defect_notes[kind] = note
        self.notes.append(note)

    def withdraw_defect(self, kind: str) -> None:
        """Drop the note of defect ``kind`` (no longer true of what will be written)."""
        note = self.defect_notes.pop(kind, None)
        if note is not None and note in self.notes:
            self.notes.remove(note)


def load_trace(inputs: list[str | Path], et: str | Path | None = None, steps: str | None = None,
               allow_missing_ranks: bool = False, trust_structure: bool = False) -> Loaded:
    """Read ``inputs`` (files or directories, formats detected from content) into one Trace.

    ``et`` names PyTorch ET files (or a directory) to link with Kineto inputs; ET and Kineto
    files given together in ``inputs`` are linked too. ``steps`` selects Kineto steps. A Chakra
    directory that lacks some rank's file is bad input unless ``allow_missing_ranks``.
    ``trust_structure``: Chakra rank files whose headers name the structure digest of a file read
    before are built from that file and their headers (see ``read_chakra``), not read.
    """
    files = _expand([Path(p) for p in inputs])
    et_files = _expand([Path(et)]) if et is not None else []
    by_format: dict[str, list[Path]] = {}
    sniffed: dict[Path, str] = {}  # trusting headers: one .et file of a folder sniffed for all of them
    for f in files:
        fmt = sniffed.get(f.parent) if trust_structure and f.suffix == ".et" else None
        if fmt is None:
            fmt = sniff(f)
            if trust_structure and f.suffix == ".et" and fmt == "chakra":
                sniffed[f.parent] = fmt
        by_format.setdefault(fmt, []).append(f)
    for f in et_files:
        fmt = sniff(f)
        if fmt != "pytorch-et":
            raise TraceError(f, f"given with --et but it is {fmt}, not a PyTorch Execution Trace")
        by_format.setdefault("pytorch-et", []).append(f)

    try:
        if set(by_format) == {"kineto", "pytorch-et"}:
            loaded = _load_linked(by_format["pytorch-et"], by_format["kineto"], steps)
            _refuse_broken_graphs(loaded)
            return loaded
        if len(by_format) > 1:
            kinds = ", ".join(f"{k} ({by_format[k][0].name})" for k in sorted(by_format))
            raise TraceError(files[0].parent, f"inputs mix formats that cannot be combined: {kinds}")
        fmt, paths = next(iter(by_format.items()))
        check = not allow_missing_ranks and any(Path(p).is_dir() for p in inputs)
        trace = _read(fmt, paths, steps, check, trust_structure)
    except RecursionError:  # a reader (or repr of a value) recursing into values nested thousands deep
        raise TraceError(files[0] if len(files) == 1 else files[0].parent,
                         "values nested too deeply (thousands of levels): not a trace") from None
    loaded = Loaded(trace, fmt, paths)
    _refuse_broken_graphs(loaded)
    neg = sum(int(g.meta.get("negative_durations", 0) or 0) for g in trace.graphs.values()
              if isinstance(getattr(g, "meta", None), dict))
    if neg:  # kept (the events exist) but said: a clamped duration is not a measurement
        loaded.note_defect("negative_durations", f"{neg:,} event(s) with a negative duration, counted as 0")
    huge = sum(int(g.meta.get("implausible_operands", 0) or 0) for g in trace.graphs.values()
               if isinstance(getattr(g, "meta", None), dict))
    if huge:
        loaded.note_defect("implausible_operands", f"{huge:,} op(s) record operands no device holds (a dimension "
                           "past 2^40 or a tensor past 2^50 elements): not used as their shapes")
    return loaded


# formats whose dependencies are written in the file (not derived by ettools): they can hold a
# cycle, a self-dependency or a duplicate id, and nothing downstream can use such a graph
_EXPLICIT_DEPS = ("pytorch-et", "chakra", "chakra-json", "astrasim-json", "pytorch-et+kineto")


def _refuse_broken_graphs(loaded: Loaded) -> None:
    """Duplicate node ids are bad input: refuse, naming the file, rank and first offending node.

    The other defects of a file's own dependencies (real Chakra conversions hold hundreds) are
    kept, and each kind read is said in one note with its count: dangling dependencies (naming an
    id not in the rank), self-dependencies, dependency cycles through 2+ distinct nodes (counted
    without the self-dependencies: one per strongly connected set, the first named) and
    communication nodes without a collective type. ``loaded.problems`` counts
    ``self_dependencies`` and ``dependency_cycles``; ``ettools convert`` drops the dangling and
    self-dependencies (:mod:`ettools.repair`) and refuses a cycle. Compiled O(nodes + edges) checks.
    """
    if loaded.format not in _EXPLICIT_DEPS:
        return
    from dataclasses import replace

    from ettools.checks import check_acyclic, check_unique_ids, structure_key
    from ettools.graph import NodeType
    from ettools.repair import drop_unsound_deps

    cycles = selfs = dangling = untyped = 0
    first = None
    done: dict[tuple, tuple[int, int, list]] = {}  # ranks sharing ids and dependency arrays: checked once
    for rank, g in loaded.trace.graphs.items():
        key = structure_key(g)
        hit = done.get(key)
        if hit is None:
            dup = check_unique_ids(g)
            if dup:
                where = loaded.files[0] if len(loaded.files) == 1 else _rank_file(loaded.files, rank)
                more = f" (and {len(dup) - 1} more)" if len(dup) > 1 else ""
                raise TraceError(where, f"{dup[0]}{more}")
            h, rep = drop_unsound_deps(g)
            hit = done[key] = (rep.self_deps, rep.dangling, check_acyclic(h))
        n_self, n_dangling, found = hit
        selfs += n_self
        dangling += n_dangling
        cycles += len(found)
        untyped += int(((g.type == NodeType.COMM_COLL_NODE) & (g.comm_type < 0)).sum())
        if found and first is None:
            where = loaded.files[0] if len(loaded.files) == 1 else _rank_file(loaded.files, rank)
            first = f"{where}: {replace(found[0], rank=rank)}"
    if dangling:
        loaded.note_defect("dangling_dependencies",
                           f"{dangling:,} dangling dependencies (node ids not in the trace)")
    if selfs:
        loaded.problems["self_dependencies"] = selfs
        loaded.note_defect("self_dependencies", f"{selfs:,} self-dependencies (a node depending on itself)")
    if cycles:
        loaded.problems["dependency_cycles"] = cycles
        loaded.note_defect("dependency_cycles",
                           f"{cycles:,} dependency cycle(s) of 2+ nodes, first: {first}")
    if untyped:
        loaded.note_defect("untyped_comm", f"{untyped:,} collective(s) without a comm_type "
                                           "(untyped communication nodes)")


def _rank_file(files: list[Path], rank: int) -> Path:
    for f in files:
        if rank_from_name(f) == rank:
            return f
    return files[0]


def _read(fmt: str, paths: list[Path], steps: str | None, check_ranks: bool = False,
          trust_structure: bool = False) -> Trace:
    if fmt == "kineto":
        from ettools.converters.kineto import read_kineto

        return read_kineto(paths, steps=steps)
    if fmt == "pytorch-et":
        from ettools.converters.pytorch_et import read_pytorch_et

        return read_pytorch_et(paths)
    if fmt == "chakra":
        from ettools.converters.chakra.reader import read_chakra

        return read_chakra(paths, check_ranks=check_ranks, trust_structure=trust_structure)
    if fmt == "chakra-json":
        from ettools.converters.chakra_json import read_chakra_json

        return _single_or_merge(paths, read_chakra_json)
    if fmt == "astrasim-json":
        from ettools.converters.astrasim_json import read_astrasim_json

        return _single_or_merge(paths, read_astrasim_json)
    if fmt == "triosim":
        from ettools.converters.triosim import read_triosim

        if len(paths) != 1:
            raise TraceError(paths[1], "TrioSim input is one trace.csv (with tensor.csv beside it)")
        return read_triosim(paths[0])
    raise AssertionError(fmt)


def _single_or_merge(paths: list[Path], reader: Any) -> Trace:
    """Read one file per rank with ``reader`` and merge into one trace (ranks from file names)."""
    if len(paths) == 1:
        return reader(paths[0])
    from ettools.merge import merge_ranks

    parts = []
    for i, p in enumerate(paths):
        rank = rank_from_name(p)
        parts.append((i if rank is None else rank, reader(p)))
    return merge_ranks(parts)


def _load_linked(et_paths: list[Path], kineto_paths: list[Path], steps: str | None) -> Loaded:
    from ettools.converters.kineto import read_kineto
    from ettools.converters.link import link_et_kineto
    from ettools.converters.pytorch_et import read_pytorch_et

    et_trace = read_pytorch_et(et_paths)
    kineto_trace = read_kineto(kineto_paths, steps=steps)
    trace, report = link_et_kineto(et_trace, kineto_trace)
    return Loaded(trace, "pytorch-et+kineto", et_paths + kineto_paths, link_report=report)
