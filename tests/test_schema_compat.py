"""The Chakra bindings load and work on old and new protobuf runtimes, and match et_def.proto.

Chakra's own generated bindings refuse protobuf 4.25 and 5.29; ours are built at import time.
Each pinned runtime is pip-installed once into a cache (``~/.cache/ettools-pbcompat/<version>``,
or ``$ETTOOLS_PBCOMPAT_CACHE``) and put first on ``PYTHONPATH`` of a subprocess running this
interpreter, which imports ``ettools.schema.et_def_pb2``, round-trips a Node and writes the real
ResNet trace back out; its bytes must equal what the installed runtime writes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import google.protobuf
import pytest
from google.protobuf.descriptor import FieldDescriptor

from ettools.schema import et_def_pb2 as pb

PINNED = ["4.21.12", "5.29.5"]
CACHE = Path(os.environ.get("ETTOOLS_PBCOMPAT_CACHE", Path.home() / ".cache" / "ettools-pbcompat"))
_NETWORK_TROUBLE = (
    "NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
    "Network is unreachable", "ProxyError", "ConnectTimeout", "Read timed out", "Max retries exceeded",
)

CHILD = r"""
import hashlib, sys, tempfile
from pathlib import Path
import google.protobuf
want, target, resnet = sys.argv[1], sys.argv[2], sys.argv[3]
if want != "installed":
    assert google.protobuf.__version__ == want, google.protobuf.__version__
    assert google.protobuf.__file__.startswith(target), google.protobuf.__file__
from ettools.schema import et_def_pb2 as pb
n = pb.Node(id=7, name="allreduce", type=pb.COMM_COLL_NODE, data_deps=[1, 2], ctrl_deps=[3],
            duration_micros=5)
n.attr.add(name="comm_type", int64_val=pb.ALL_REDUCE)
n.attr.add(name="pg_name", string_val="1")
n.attr.add(name="involved_dim").bool_list.values.extend([True, False])
n.inputs.values = "[[1, 2]]"
b = n.SerializeToString()
m = pb.Node.FromString(b)
assert m == n and m.SerializeToString() == b
assert m.attr[2].WhichOneof("value") == "bool_list"
from ettools.converters.chakra import read_chakra, write_chakra
from ettools.converters.chakra_json import read_chakra_json, write_chakra_json
out = Path(tempfile.mkdtemp())
t = read_chakra(Path(resnet))
write_chakra(t, out / "et", strict=False)
write_chakra(read_chakra_json(write_chakra_json(t, out / "js", strict=False)[0]), out / "et2", strict=False)
et = (out / "et" / "trace.0.et").read_bytes()
assert (out / "et2" / "trace.0.et").read_bytes() == et
print("VERSION", google.protobuf.__version__)
print("NODE", b.hex())
print("ET", hashlib.sha256(et).hexdigest())
"""


def _install(version: str) -> Path:
    """``protobuf==version`` in the cache (installed once); skips if the index is unreachable."""
    target = CACHE / version
    if (target / "google" / "protobuf" / "__init__.py").is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=CACHE))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
             "--target", str(tmp), f"protobuf=={version}"],
            capture_output=True, text=True, timeout=600,
        )
        if proc.returncode != 0:
            out = proc.stdout + proc.stderr
            if any(s in out for s in _NETWORK_TROUBLE):
                pytest.skip(f"pip cannot reach the package index to install protobuf=={version}")
            pytest.fail(f"pip install protobuf=={version} failed:\n{out[-2000:]}")
        try:
            os.replace(tmp, target)
        except OSError:  # another run installed it meanwhile
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _run_child(version: str, target: Path | None, resnet: Path) -> dict[str, str]:
    env = dict(os.environ)
    if target is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(target), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, version, str(target or ""), str(resnet)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


@pytest.fixture(scope="module")
def reference(shared_traces: Path) -> dict[str, str]:
    """What the installed (newest) runtime produces."""
    return _run_child("installed", None, shared_traces / "chakra" / "resnet_converted.0.et")


@pytest.mark.parametrize("version", PINNED)
def test_bindings_work_on_pinned_protobuf(version: str, reference: dict[str, str], shared_traces: Path):
    target = _install(version)
    got = _run_child(version, target, shared_traces / "chakra" / "resnet_converted.0.et")
    assert got["VERSION"] == version
    # the same bytes as the newest runtime: for one node and for the whole ResNet trace
    assert got["NODE"] == reference["NODE"]
    assert got["ET"] == reference["ET"]


def test_installed_runtime(reference: dict[str, str]):
    assert reference["VERSION"] == google.protobuf.__version__
    n = pb.Node.FromString(bytes.fromhex(reference["NODE"]))
    assert n.name == "allreduce" and list(n.data_deps) == [1, 2]


# ---- et_def.proto text vs the built descriptor ------------------------------------------------
_SCALARS = {
    "double": FieldDescriptor.TYPE_DOUBLE, "float": FieldDescriptor.TYPE_FLOAT,
    "int32": FieldDescriptor.TYPE_INT32, "int64": FieldDescriptor.TYPE_INT64,
    "uint32": FieldDescriptor.TYPE_UINT32, "uint64": FieldDescriptor.TYPE_UINT64,
    "sint32": FieldDescriptor.TYPE_SINT32, "sint64": FieldDescriptor.TYPE_SINT64,
    "fixed32": FieldDescriptor.TYPE_FIXED32, "fixed64": FieldDescriptor.TYPE_FIXED64,
    "sfixed32": FieldDescriptor.TYPE_SFIXED32, "sfixed64": FieldDescriptor.TYPE_SFIXED64,
    "bool": FieldDescriptor.TYPE_BOOL, "string": FieldDescriptor.TYPE_STRING, "bytes": FieldDescriptor.TYPE_BYTES,
}


def _repeated(fd: FieldDescriptor) -> bool:
    # protobuf 7 dropped FieldDescriptor.label in favour of is_repeated
    if hasattr(fd, "is_repeated"):
        return bool(fd.is_repeated)
    return fd.label == FieldDescriptor.LABEL_REPEATED


def _blocks(text: str, keyword: str) -> dict[str, str]:
    """``{name: body}`` of every top-level ``keyword name { ... }`` (braces matched)."""
    out = {}
    for m in re.finditer(rf"\b{keyword}\s+(\w+)\s*\{{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out[m.group(1)] = text[m.end() : i - 1]
    return out


def _proto_text() -> str:
    text = (Path(pb.__file__).with_name("et_def.proto")).read_text()
    return re.sub(r"//[^\n]*", "", text)


def test_proto_text_matches_descriptor():
    text = _proto_text()
    package = re.search(r"\bpackage\s+([\w.]+)\s*;", text).group(1)
    assert pb.Node.DESCRIPTOR.file.package == package == "ChakraProtoMsg"
    messages = _blocks(text, "message")
    assert len(messages) >= 20
    for name, body in messages.items():
        desc = getattr(pb, name).DESCRIPTOR
        oneofs = {o: set(re.findall(r"\b(\w+)\s*=\s*\d+\s*;", b)) for o, b in _blocks(body, "oneof").items()}
        fields = re.findall(r"(repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;", body)
        assert [(f[2], int(f[3])) for f in fields] == [(f.name, f.number) for f in desc.fields], name
        for repeated, ftype, fname, _number in fields:
            fd = desc.fields_by_name[fname]
            assert _repeated(fd) == bool(repeated), (name, fname)
            if ftype in _SCALARS:
                assert fd.type == _SCALARS[ftype], (name, fname)
            elif fd.type == FieldDescriptor.TYPE_ENUM:
                assert fd.enum_type.name == ftype, (name, fname)
            else:
                assert fd.type == FieldDescriptor.TYPE_MESSAGE and fd.message_type.name == ftype, (name, fname)
            in_oneof = [o for o, members in oneofs.items() if fname in members]
            assert (fd.containing_oneof.name if fd.containing_oneof else None) == (in_oneof[0] if in_oneof else None)
    for name, body in _blocks(text, "enum").items():
        values = [(v, int(n)) for v, n in re.findall(r"\b(\w+)\s*=\s*(\d+)\s*;", body)]
        desc = pb.Node.DESCRIPTOR.file.enum_types_by_name[name]
        assert values == [(v.name, v.number) for v in desc.values], name
    # every message of the built file is in the .proto
    assert set(pb.Node.DESCRIPTOR.file.message_types_by_name) == set(messages)
