"""An independent Chakra decoder for tests: its own varint frame splitter and the schema classes
only, so the files ettools writes are checked by something other than ettools' own reader."""

from __future__ import annotations

import gzip
from pathlib import Path

from ettools.schema import et_def_pb2 as pb


def split_frames(data: bytes) -> list[bytes]:
    """Frames of a Chakra stream; asserts no zero-length frame and none running past the end."""
    out, pos = [], 0
    while pos < len(data):
        length = shift = 0
        while True:
            b = data[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        assert length > 0, "writer emitted a zero-length frame"
        assert pos + length <= len(data), "frame runs past the end"
        out.append(data[pos : pos + length])
        pos += length
    return out


def decode(path: Path) -> tuple[object, list[object]]:
    """(GlobalMetadata, [Node]) of an .et file (plain or gzip), decoded with the pb classes only."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    frames = split_frames(data)
    return pb.GlobalMetadata.FromString(frames[0]), [pb.Node.FromString(f) for f in frames[1:]]


def decode_nodes(path: Path) -> list[object]:
    """The Node messages of an .et file."""
    return decode(path)[1]
