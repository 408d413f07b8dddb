"""Build and load the emulated-CUDA registrations (``fake_cuda.cpp``) for the installed torch.

A CPU-only PyTorch knows no ``cuda`` device: a tensor moved there fails in the dispatcher's
device guard before any Python mode sees it, and the autograd engine refuses accelerator work
when no CUDA runtime reports itself. The registrations in ``fake_cuda.cpp`` answer both without a
driver. They are compiled once per torch build with the system C++ compiler (about two seconds)
into a cache folder (``$ETTOOLS_CACHE``, else ``$XDG_CACHE_HOME/ettools``, else
``~/.cache/ettools``) and must be loaded before ``import torch`` creates its CUDA hooks.

Nothing here imports torch: the library's location is found from the installed package.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

_SOURCE = Path(__file__).with_name("fake_cuda.cpp")


class EmulationUnavailable(RuntimeError):
    """The emulated device cannot be set up here (no torch, no compiler, a failed build)."""


def torch_root() -> Path:
    """The installed torch package folder, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise EmulationUnavailable("torch is not installed: pip install 'ettools[capture]'")
    return Path(spec.origin).parent


def cache_dir() -> Path:
    """Where compiled libraries are kept."""
    base = os.environ.get("ETTOOLS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ettools")
    return Path(base)


def _torch_version(root: Path) -> str:
    try:
        text = (root / "version.py").read_text()
    except OSError:
        return "unknown"
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("'\"")
    return "unknown"


def library_path() -> Path:
    """The compiled library for the installed torch, built when missing."""
    root = torch_root()
    key = hashlib.sha256(_SOURCE.read_bytes() + _torch_version(root).encode() + str(root).encode()).hexdigest()[:16]
    out = cache_dir() / f"fake_cuda-{key}.so"
    if out.exists():
        return out
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not compiler:
        raise EmulationUnavailable("no C++ compiler found (g++, c++ or clang++; or set CXX) to build the emulated device")
    include = [root / "include", root / "include" / "torch" / "csrc" / "api" / "include"]
    lib = root / "lib"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        cmd = [compiler, "-O1", "-std=c++20", "-shared", "-fPIC", "-w", *(f"-I{p}" for p in include),
               str(_SOURCE), f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}", "-o", str(part)]
        abi = sysconfig.get_config_var("GLIBCXX_USE_CXX11_ABI")
        if abi is not None:
            cmd.insert(1, f"-D_GLIBCXX_USE_CXX11_ABI={int(abi)}")
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            first = next((ln for ln in res.stderr.splitlines() if "error" in ln), res.stderr.strip()[:300])
            raise EmulationUnavailable(f"building the emulated device failed ({compiler}): {first}")
        os.replace(part, out)  # atomic: a concurrent build of the same key writes the same bytes
    return out


_LIB: ctypes.CDLL | None = None


def load() -> int:
    """Load the library (before ``import torch``); returns the emulated device count."""
    global _LIB
    _LIB = ctypes.CDLL(str(library_path()), mode=ctypes.RTLD_GLOBAL)
    return int(_LIB.ettools_emulated_cuda_devices())


def set_device(index: int) -> None:
    """Make ``index`` the current emulated device of this thread."""
    if _LIB is not None:
        _LIB.ettools_set_device(ctypes.c_int(int(index)))
