"""Output side: every bad place to write is one line and exit 2, a multi-file write is all or
nothing (failed move, SIGINT, SIGTERM), names stay inside -o, only regular files are replaced,
and a folder never mixes two runs' rank files."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ettools.cli import main

REPO = Path(__file__).resolve().parents[1]
SINGLE = REPO / "sample_traces" / "single" / "rank0.kineto.json.gz"
DDP = REPO / "sample_traces" / "ddp"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, [*args, "-q"])
    return res.exit_code, res.stdout, res.stderr


def one_line(err: str, *needles: str) -> None:
    # warnings said before the failure (a one-rank set's ASTRA-sim note) are not the error line
    lines = [x for x in err.strip().splitlines() if not x.startswith("ettools: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("ettools: error:"), err
    for n in needles:
        assert n in lines[0], err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every entry under ``folder`` (hidden ones too) with its bytes."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(folder.rglob("*"))} if folder.exists() else {}


def test_output_folder_is_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep")
    code, _, err = run("convert", str(SINGLE), "-o", str(f))
    assert code == 2
    one_line(err, "afile")
    assert f.read_text() == "keep"


def test_output_folder_under_a_file(tmp_path):
    f = tmp_path / "afile"
    f.write_text("keep")
    code, _, err = run("convert", str(SINGLE), "-o", str(f / "sub"))
    assert code == 2
    one_line(err, "afile")
    code, _, err = run("synth", "--model", "gpt3-5b", "--dim", "L=1", "-o", str(f / "sub"))
    assert code == 2
    one_line(err, "afile")


def test_single_file_outputs_that_are_directories(tmp_path):
    d = tmp_path / "dir.json"
    d.mkdir()
    code, _, err = run("replay", str(SINGLE), "--timeline", str(d))
    assert code == 2
    one_line(err, "dir.json", "directory")
    code, _, err = run("calibrate", str(SINGLE), "-o", str(d))
    assert code == 2
    one_line(err, "dir.json")
    assert list(d.iterdir()) == []


def test_plot_without_matplotlib_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, _, err = run("replay", str(SINGLE), "--plot", str(tmp_path / "p.png"))
    assert code == 2
    one_line(err, "matplotlib")
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("name", ["x" * 300, "../../escape", "/abs/name", "a/b", ".hidden", "..", ""])
def test_name_must_be_a_plain_stem(tmp_path, name):
    out = tmp_path / "o" / "p"
    code, _, err = run("convert", str(SINGLE), "-o", str(out), "--name", name)
    assert code == 2
    one_line(err, "--name")
    assert snapshot(tmp_path) == {}
    code, _, err = run("synth", "--model", "gpt3-5b", "--dim", "L=1", "-o", str(out), "--name", name)
    assert code == 2
    one_line(err, "--name")
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dir"])
def test_only_regular_files_are_replaced(tmp_path, kind):
    out = tmp_path / "o"
    out.mkdir()
    target = out / "trace.0.et"
    other = tmp_path / "elsewhere"
    other.write_text("not yours")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(other)
    else:
        target.mkdir()
    before = snapshot(out) if kind != "fifo" else None
    code, _, err = run("convert", str(SINGLE), "-o", str(out))
    assert code == 2
    one_line(err, "trace.0.et")
    assert other.read_text() == "not yours"
    if kind == "fifo":
        assert sorted(p.name for p in out.iterdir()) == ["trace.0.et"]
    else:
        assert snapshot(out) == before


def test_timeline_onto_a_symlink_is_refused(tmp_path):
    other = tmp_path / "victim"
    other.write_text("not yours")
    link = tmp_path / "t.json"
    link.symlink_to(other)
    code, _, err = run("replay", str(SINGLE), "--timeline", str(link))
    assert code == 2
    one_line(err, "t.json", "symbolic link")
    assert other.read_text() == "not yours"


def test_stale_rank_files_of_another_run_are_cleared(tmp_path):
    out = tmp_path / "o"
    code, _, err = run("synth", "--model", "gpt3-5b", "--dim", "L=1", "--dp", "8", "-o", str(out))
    assert code == 0, err
    assert len(list(out.glob("synth.*.et"))) == 8
    (out / "notes.txt").write_text("mine")
    code, _, err = run("synth", "--model", "gpt3-5b", "--dim", "L=1", "--dp", "2", "-o", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.glob("synth.*.et")) == ["synth.0.et", "synth.1.et"]
    assert (out / "notes.txt").read_text() == "mine"  # only files of the same pattern go
    # a deliberately partial write (--ranks) keeps the others
    code, _, err = run("synth", "--model", "gpt3-5b", "--dim", "L=1", "--dp", "8", "--ranks", "4-5",
                       "-o", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.glob("synth.*.et")) == [f"synth.{r}.et" for r in (0, 1, 4, 5)]
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_failed_move_rolls_back_the_whole_set(tmp_path, monkeypatch, fail_at):
    out = tmp_path / "o"
    code, _, err = run("synth", "--model", "gpt3-5b", "--dim", "L=1", "--dp", "4", "-o", str(out))
    assert code == 0, err
    (out / "synth.9.et").write_bytes(b"stale")  # a stale file that the commit would clear
    before = snapshot(out)
    real = os.replace
    calls = {"n": 0}

    def flaky(src, dst, *a, **k):
        if ".ettools-stage-" in str(src):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise OSError(errno.EIO, "Input/output error")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", flaky)
    code, _, err = run("synth", "--model", "gpt3-5b", "--dim", "L=2", "--dp", "4", "-o", str(out))
    assert code == 2
    one_line(err, "nothing was changed")
    assert snapshot(out) == before  # the earlier run's files, byte for byte, and nothing else


@pytest.mark.parametrize("err_no,words", [(errno.ENOSPC, "no space"), (errno.EROFS, "read-only"),
                                          (errno.EACCES, "permission")])
def test_full_disk_and_read_only_are_one_line(tmp_path, monkeypatch, err_no, words):
    import ettools.io as eio

    out = tmp_path / "o"

    def failing_write(self, data):
        raise eio.OutputError(self._path, f"cannot write: {eio._os_problem(OSError(err_no, 'x'))}")

    monkeypatch.setattr(eio._GuardedFile, "write", failing_write)
    code, _, err = run("convert", str(SINGLE), "-o", str(out))
    assert code == 2
    one_line(err, words)
    assert snapshot(out) == {}


def test_immutable_folder_is_one_line(tmp_path, monkeypatch):
    import tempfile

    def refuse(*a, **k):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    out = tmp_path / "o"
    code, _, err = run("convert", str(SINGLE), "-o", str(out))
    assert code == 2
    one_line(err, "not permitted")


def test_real_full_disk_if_dev_full(tmp_path):
    """/dev/full as a single-file output: refused (a device is never replaced) before any work."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    code, _, err = run("replay", str(SINGLE), "--timeline", "/dev/full")
    assert code == 2
    one_line(err, "/dev/full")


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_a_large_write_leaves_nothing(tmp_path, sig, code):
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "ettools", "synth", "--model", "gpt3-5b", "--dim", "L=2",
                             "--dp", "4096", "-o", str(out), "-q"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    staged = False
    while time.monotonic() < deadline and proc.poll() is None:
        stages = list(tmp_path.glob(".ettools-stage-*"))  # a new output folder is staged whole beside it
        if stages and sum(1 for _ in stages[0].iterdir()) > 20:
            staged = True
            break
        time.sleep(0.005)
    assert staged, "the write finished before it could be interrupted"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip().count("\n") == 0
    assert snapshot(out) == {} or list(out.iterdir()) == []
    assert list(tmp_path.glob(".ettools-stage-*")) == []  # the staging folder went too


def test_commit_is_whole_under_a_signal(tmp_path):
    """A signal that lands during the moves waits until the set is whole: all files or none."""
    from ettools.io import OutputSet

    out = tmp_path / "o"
    out.mkdir()  # an existing folder: files are moved in one by one
    names = [f"t.{r}.et" for r in range(300)]
    real = os.replace
    fired = {"n": 0}

    def replace_and_signal(src, dst, *a, **k):
        fired["n"] += 1
        if fired["n"] == 50:
            os.kill(os.getpid(), signal.SIGINT)  # blocked during the commit: delivered after it
        return real(src, dst, *a, **k)

    os.replace = replace_and_signal
    try:
        with pytest.raises(KeyboardInterrupt):
            with OutputSet() as s:
                for n in names:
                    s.write_file(out / n, b"x")
    finally:
        os.replace = real
    assert sorted(p.name for p in out.iterdir()) == sorted(names)


def test_a_new_output_folder_appears_whole(tmp_path):
    """Files for a folder that does not exist yet (written directly and from the background
    thread) are staged beside it: the folder appears at the commit, whole, with the usual modes;
    an aborted set leaves neither the folder nor its staging."""
    from ettools.io import OutputSet

    out = tmp_path / "new" / "o"
    umask = os.umask(0)
    os.umask(umask)
    with OutputSet() as s:
        for r in range(50):
            s.submit(out / f"t.{r}.et", bytes([r]) * (r + 1))
        s.write_file(out / "comm_group.json", b"{}")
        s.submit(out / "t.7.et", b"again")  # the same file twice: the last write wins
        assert not out.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([f"t.{r}.et" for r in range(50)] + ["comm_group.json"])
    assert (out / "t.3.et").read_bytes() == b"\x03" * 4 and (out / "t.7.et").read_bytes() == b"again"
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (out / "t.3.et").stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in out.parent.iterdir()] == ["o"]

    other = tmp_path / "other"
    with pytest.raises(RuntimeError):
        with OutputSet() as s:
            s.submit(other / "t.0.et", b"x")
            raise RuntimeError("stop")
    assert not other.exists() and list(tmp_path.glob(".ettools-stage-*")) == []


def test_a_background_write_error_is_one_error_and_nothing_is_left(tmp_path, monkeypatch):
    """A write that fails on the writer thread is raised to the caller (naming the file) and the
    set leaves nothing behind."""
    import ettools.io as eio
    from ettools.io import OutputSet

    def failing_write(self, data):
        raise eio.OutputError(self._path, f"cannot write: {eio._os_problem(OSError(errno.ENOSPC, 'x'))}")

    monkeypatch.setattr(eio._GuardedFile, "write", failing_write)
    out = tmp_path / "o"
    with pytest.raises(eio.OutputError, match=r"t\.\d+\.et.*no space"):
        with OutputSet() as s:
            for r in range(20):
                s.submit(out / f"t.{r}.et", b"x" * 1000)
    assert not out.exists() and list(tmp_path.iterdir()) == []
