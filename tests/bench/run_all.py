"""Run every benchmark in this folder, one after another, and print their figures.

Usage: ``python tests/bench/run_all.py [NAME ...]`` (names like ``kineto``, ``chakra``; default all).
Each ``bench_*.py`` is a standalone script printing its own figures and target ratios; they are
not collected by pytest.

``python tests/bench/run_all.py --update-readme [NAME ...]`` regenerates the README figures that a
benchmark owns. A README (``README.md`` and the stage READMEs ``converters/``, ``scaler/``,
``replay/README.md``) marks such figures as a block::

    <!-- bench:NAME -->
    ... replaced on every update ...
    <!-- /bench:NAME -->

and ``bench_NAME.py --readme`` prints the block's new contents between a line
``<!-- readme:begin -->`` and a line ``<!-- readme:end -->`` on stdout. A benchmark may print other
contents for one README's blocks between ``<!-- readme:begin PATH -->`` and ``<!-- readme:end -->``,
``PATH`` relative to the repository (``README.md``): a one-line summary in the top-level README
beside the full table in a stage README, from one run. Only the benchmarks that own a block are run
(those named, if any); a benchmark that fails leaves its blocks as they were, one that prints no
contents for a block leaves that block, and the command exits 1.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
READMES = [ROOT / "README.md", ROOT / "converters" / "README.md", ROOT / "scaler" / "README.md",
           ROOT / "replay" / "README.md"]
BEGIN, END = "<!-- readme:begin -->", "<!-- readme:end -->"
_BLOCK = re.compile(r"(?P<open>^<!-- bench:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(?P<close>^<!-- /bench:(?P=name) -->$)",
                    re.S | re.M)
_OPEN = re.compile(r"^<!-- bench:([\w-]+) -->$", re.M)
_CLOSE = re.compile(r"^<!-- /bench:([\w-]+) -->$", re.M)


def block_names(text: str) -> list[str]:
    """Names of the ``<!-- bench:NAME -->`` blocks in ``text``, in order (each once)."""
    return list(dict.fromkeys(m.group("name") for m in _BLOCK.finditer(text)))


def replace_blocks(text: str, contents: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with the body of every block named in ``contents`` replaced by its new contents.

    Returns the new text and the names replaced (a name appearing twice is replaced twice). Blocks
    whose name is not in ``contents`` stay as they are. An opening marker without its closing one
    (or a closing one without its opening one, or blocks nested) is an error: the rest of the file is
    never swallowed.
    """
    blocks = list(_BLOCK.finditer(text))
    starts, ends = {m.start() for m in blocks}, {m.end() for m in blocks}
    bad = [m.group(1) for m in _OPEN.finditer(text) if m.start() not in starts]
    bad += [m.group(1) for m in _CLOSE.finditer(text) if m.end() not in ends]
    if bad:
        raise ValueError(f"README block marker(s) without their pair (or nested): {', '.join(dict.fromkeys(bad))}")
    done: list[str] = []

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in contents:
            return m.group(0)
        done.append(name)
        body = contents[name].strip("\n")
        return m.group("open") + (body + "\n" if body else "") + m.group("close")

    return _BLOCK.sub(sub, text), done


def readme_block(stdout: str, readme: str | None = None) -> str | None:
    """What a benchmark printed between ``<!-- readme:begin -->`` (``<!-- readme:begin README -->``
    for the contents of the README at the path ``readme`` alone) and ``<!-- readme:end -->`` (the
    last such block), or None."""
    lines = stdout.splitlines()
    begin = BEGIN if readme is None else f"<!-- readme:begin {readme} -->"
    starts = [i for i, line in enumerate(lines) if line.strip() == begin]
    if not starts:
        return None
    i = starts[-1]
    for j in range(i + 1, len(lines)):
        if lines[j].strip() == END:
            return "\n".join(lines[i + 1:j])
    return None


def update_file(path: Path, contents: dict[str, str]) -> list[str]:
    """Rewrite ``path``'s blocks named in ``contents``; returns the names replaced (file untouched
    when nothing changes)."""
    text = path.read_text()
    new, done = replace_blocks(text, contents)
    if new != text:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(new)
        tmp.replace(path)
    return done


def _run(script: Path, args: list[str]) -> tuple[int, str]:
    """Run a benchmark, echoing its output live; returns (exit code, stdout)."""
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True)
    out = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        out.append(line)
    return proc.wait(), "".join(out)


def update_readmes(names: list[str]) -> int:
    """Run each benchmark owning a README block (restricted to ``names`` if given) and rewrite its
    blocks; exit code 1 if any benchmark failed or printed no contents for one of its blocks."""
    readmes = [p for p in READMES if p.exists()]
    where = {p: block_names(p.read_text()) for p in readmes}
    owned = list(dict.fromkeys(n for p in readmes for n in where[p]))
    if names:
        owned = [n for n in owned if n in names]
    failed, outputs = [], {}
    for name in owned:
        script = HERE / f"bench_{name}.py"
        if not script.exists():
            print(f"no {script.name} for the README block bench:{name}")
            failed.append(name)
            continue
        print(f"\n=== {script.name} --readme ===", flush=True)
        t0 = time.perf_counter()
        rc, out = _run(script, ["--readme"])
        print(f"--- {script.name}: exit {rc}, {time.perf_counter() - t0:.1f} s", flush=True)
        if rc:
            print(f"{script.name}: failed; its README blocks are kept")
            failed.append(name)
            continue
        outputs[name] = out
    for path in readmes:
        rel = path.relative_to(ROOT).as_posix()
        contents = {}
        for name in (n for n in where[path] if n in outputs):
            block = readme_block(outputs[name], rel)
            block = readme_block(outputs[name]) if block is None else block
            if block is None:
                print(f"bench_{name}.py printed no {BEGIN} (nor <!-- readme:begin {rel} -->) block; "
                      f"its block in {rel} is kept")
                failed.append(name)
                continue
            contents[name] = block
        done = update_file(path, contents)
        if done:
            print(f"updated {rel}: {', '.join(done)}")
    if failed:
        print(f"\nnot updated: {', '.join(dict.fromkeys(failed))}")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    """Run the selected benchmarks; exit non-zero if any script failed."""
    if "--update-readme" in argv:
        return update_readmes([a for a in argv if a != "--update-readme"])
    scripts = sorted(HERE.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in argv]
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)])
        print(f"--- {script.name}: exit {rc}, {time.perf_counter() - t0:.1f} s", flush=True)
        if rc:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
