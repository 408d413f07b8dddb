"""``tests/bench/run_all.py --update-readme``: README blocks ``<!-- bench:NAME -->`` … ``<!-- /bench:NAME -->``
rewritten with what ``bench_NAME.py --readme`` printed between ``<!-- readme:begin -->`` and
``<!-- readme:end -->`` (the replacement and the parsing only: no benchmark is run here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run_all():
    spec = importlib.util.spec_from_file_location("bench_run_all", REPO / "tests" / "bench" / "run_all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


run_all = _run_all()

README = """# Title

Prose before, with an inline `<!-- bench:x -->` mention that is not a marker.

<!-- bench:selfreplay -->
| old | table |
| --- | --- |
| 1 | 2 |
<!-- /bench:selfreplay -->

Prose between.

<!-- bench:other -->
kept as it is
<!-- /bench:other -->

<!-- bench:selfreplay -->
old again
<!-- /bench:selfreplay -->
Prose after.
"""


def test_a_named_block_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text(README)
    done = run_all.update_file(path, {"selfreplay": "| new | table |\n| --- | --- |\n| 3 | 4 |\n"})
    assert done == ["selfreplay", "selfreplay"]
    text = path.read_text()
    assert text.count("| new | table |") == 2 and "old" not in text
    assert "<!-- bench:other -->\nkept as it is\n<!-- /bench:other -->" in text
    # everything outside the replaced bodies is byte for byte what it was
    assert text.replace("| new | table |\n| --- | --- |\n| 3 | 4 |\n", "") == (
        README.replace("| old | table |\n| --- | --- |\n| 1 | 2 |\n", "").replace("old again\n", ""))
    assert not list(tmp_path.glob("*.tmp"))


def test_replacing_twice_is_stable_and_unnamed_blocks_untouched(tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text(README)
    run_all.update_file(path, {"selfreplay": "A"})
    once = path.read_text()
    run_all.update_file(path, {"selfreplay": "A"})
    assert path.read_text() == once
    assert run_all.update_file(path, {"nothing": "B"}) == []
    assert path.read_text() == once
    assert run_all.block_names(once) == ["selfreplay", "other"]


def test_an_empty_body_keeps_the_markers(tmp_path: Path) -> None:
    new, done = run_all.replace_blocks(README, {"other": ""})
    assert done == ["other"] and "<!-- bench:other -->\n<!-- /bench:other -->" in new
    again, _ = run_all.replace_blocks(new, {"other": "back"})
    assert "<!-- bench:other -->\nback\n<!-- /bench:other -->" in again


@pytest.mark.parametrize("broken", [
    "a\n<!-- bench:x -->\nbody\nno closing line\n",
    "a\nbody\n<!-- /bench:x -->\n",
    "<!-- bench:x -->\n<!-- bench:y -->\n<!-- /bench:y -->\n<!-- /bench:x -->\n",
    "<!-- bench:x -->\nbody\n<!-- /bench:y -->\n",
])
def test_unpaired_or_nested_markers_are_refused(broken: str, tmp_path: Path) -> None:
    path = tmp_path / "README.md"
    path.write_text(broken)
    with pytest.raises(ValueError, match="without their pair"):
        run_all.update_file(path, {"x": "new", "y": "new"})
    assert path.read_text() == broken


def test_the_block_a_benchmark_printed_is_read_between_its_markers() -> None:
    out = "figures...\n<!-- readme:begin -->\n| a |\n| --- |\n<!-- readme:end -->\nmore output\n"
    assert run_all.readme_block(out) == "| a |\n| --- |"
    assert run_all.readme_block("no block\n") is None
    assert run_all.readme_block("<!-- readme:begin -->\nnever ended\n") is None
    twice = "<!-- readme:begin -->\nfirst\n<!-- readme:end -->\n<!-- readme:begin -->\nlast\n<!-- readme:end -->\n"
    assert run_all.readme_block(twice) == "last"


def test_the_repository_readmes_have_well_formed_blocks() -> None:
    """Every README block is paired, and names a benchmark script that exists."""
    names = []
    for path in run_all.READMES:
        if path.exists():
            text = path.read_text()
            run_all.replace_blocks(text, {})  # raises on an unpaired marker
            names += run_all.block_names(text)
    assert "selfreplay" in names
    for name in names:
        assert (REPO / "tests" / "bench" / f"bench_{name}.py").exists(), name


def test_a_benchmark_may_print_contents_for_one_readme_alone() -> None:
    """One run of a benchmark can fill its block in the stage README with a table and in README.md
    with a one-line summary: ``<!-- readme:begin PATH -->`` is read for that README only, and the
    plain ``<!-- readme:begin -->`` for every other README."""
    out = ("<!-- readme:begin -->\n| table |\n<!-- readme:end -->\n"
           "<!-- readme:begin README.md -->\n- one line\n<!-- readme:end -->\n")
    assert run_all.readme_block(out, "README.md") == "- one line"
    assert run_all.readme_block(out) == "| table |"
    assert run_all.readme_block(out, "replay/README.md") is None  # falls back to the plain block
    assert run_all.readme_block("<!-- readme:begin README.md -->\nx\n", "README.md") is None  # never ended
