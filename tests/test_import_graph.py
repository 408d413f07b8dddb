"""Arrows one way (issue 28, item 2): the distribution's import graph has no circle.

The graph is read from the source files with :mod:`ast`, not from what an import happens to load:
every folder that ``pyproject.toml`` maps to an import name (``ettools/``, ``converters/`` →
``ettools.converters``, ``scaler/``, ``replay/``, ``schema/``) is one package tree, and every
``import``/``from … import`` in a module is an edge, wherever it stands: at the top, inside a
function, under ``if``/``try``. ``from . import x`` and ``from pkg import x`` point at the
submodule ``pkg.x`` when there is one, else at ``pkg`` (the package that defines ``x``).
Not counted: the implicit import of a module's parent packages, and ``importlib.import_module``
calls with a computed name (the PEP 562 ``__getattr__`` of ``ettools.replay`` and
``ettools.replay.search``, which import their own submodules on first use).

The rules:

1. No strongly connected component of more than one module: no module imports, directly or
   through others, a module that imports it. A name two modules share goes into a third below
   both (``ettools.graph_algorithms``, ``ettools.filenames``, ``ettools.cli_options``, …).
2. The core is below the stages: ``ettools.graph``, ``ettools.io`` and every module they import,
   transitively, import nothing from ``ettools.converters``, ``ettools.scaler`` or
   ``ettools.replay``; and no other ``ettools`` module imports a stage directly, except the front
   door: the command line (every module of the ``ettools.cli`` package, ``ettools/cli/*.py``),
   :mod:`ettools.convert`, :mod:`ettools.formats` and the capture modules (``ettools/capture*.py``),
   whose job is to hand the user's request to the stage that serves it. They may import stages;
   stages must not import them back (rule 1).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parents[1]
STAGES = ("ettools.converters", "ettools.scaler", "ettools.replay")
FRONT_DOOR = {"ettools.cli", "ettools.convert", "ettools.formats"}  # with ettools.cli.* and ettools.capture*
CORE_ROOTS = ("ettools.graph", "ettools.io")


def _in(name: str, packages: tuple[str, ...] | str) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(name == p or name.startswith(p + ".") for p in packages)


def _modules() -> dict[str, Path]:
    """Import name -> source file of every module of the distribution (folders as pyproject maps them)."""
    text = (REPO / "pyproject.toml").read_text()  # (no tomllib: Python 3.10 is supported)
    line = re.search(r"^package-dir = \{(.*)\}$", text, re.M)
    assert line, "pyproject.toml: no [tool.setuptools] package-dir line"
    roots = {pkg: REPO / d for pkg, d in re.findall(r'"([\w.]+)" = "([\w/]+)"', line.group(1))}
    assert set(STAGES) | {"ettools"} <= set(roots), roots
    mods: dict[str, Path] = {}
    for pkg, root in roots.items():
        for f in sorted(root.rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([pkg, *parts])
            # a folder mapped to its own name (converters/ under ettools.converters) is not also ettools.*
            if any(_in(name, other) and other != pkg and len(other) > len(pkg) for other in roots):
                continue
            mods[name] = f
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """Modules of the distribution that ``name`` imports anywhere in its source."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in mods else mod)
    out.discard(name)
    return {m for m in out if m in mods}


def _graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        g.add_edges_from((name, t) for t in _imports(name, path, mods))
    return g


def _path_around(g: nx.DiGraph, component: set[str]) -> str:
    """One circle inside ``component``, as ``a -> b -> … -> a``."""
    cycle = nx.find_cycle(g.subgraph(component))
    return " -> ".join([a for a, _ in cycle] + [cycle[0][0]])


def test_the_graph_is_read():
    """The reader sees the modules and the edges this test is about (a broken reader passes everything)."""
    g = _graph()
    assert {"ettools.graph", "ettools.cli", "ettools.cli.convert", "ettools.converters.kineto",
            "ettools.scaler.tp", "ettools.replay.search.cli"} <= set(g)
    assert g.has_edge("ettools.checks", "ettools.graph")
    assert g.has_edge("ettools.cli", "ettools.replay.search.cli")  # a module imported from a package
    assert g.has_edge("ettools.cli", "ettools.cli.convert")  # `from ettools.cli.convert import convert`
    assert g.has_edge("ettools.cli.convert", "ettools.formats")  # inside a function
    assert g.has_edge("ettools.replay.search.cli", "ettools.replay.search")  # `from . import Space`
    assert g.number_of_edges() > 500


def test_no_import_circles():
    g = _graph()
    circles = sorted((sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1), key=len)
    assert not circles, "import circles (each a set of modules that import each other):\n" + "\n".join(
        f"  {len(c)} modules: {_path_around(g, set(c))}" for c in circles)


def test_core_imports_no_stage():
    g = _graph()
    core = set(CORE_ROOTS)
    for root in CORE_ROOTS:
        core |= nx.descendants(g, root)
    reached = sorted(m for m in core if _in(m, STAGES))
    assert not reached, "the graph model and I/O reach stages: " + "; ".join(
        " -> ".join(nx.shortest_path(g, r, m)) for m in reached for r in CORE_ROOTS if nx.has_path(g, r, m))
    direct = sorted(
        (a, b) for a, b in g.edges
        if _in(a, "ettools") and not _in(a, STAGES) and _in(b, STAGES)
        and a not in FRONT_DOOR and not _in(a, "ettools.cli") and not a.startswith("ettools.capture")
    )
    assert not direct, "core modules (not the front door) import stages: " + ", ".join(
        f"{a} -> {b}" for a, b in direct)
