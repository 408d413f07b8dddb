"""Python objects between emulated ranks: ``send_object_list`` / ``recv_object_list`` /
``broadcast_object_list`` / ``all_gather_object`` through a mailbox folder.

Emulated ranks run as separate processes and move no tensor data, but some programs exchange
*Python objects* that decide what they do next — ``torch.distributed.pipelining``'s stages send
their output shapes to the next stage before the first step; a launcher broadcasts a config. Such
an object is a value the receiver cannot invent, so it travels for real: the sender pickles it into
``<state>/objects/<src>-<dst>-<n>.pkl`` (the n-th object from ``src`` to ``dst``; broadcasts and
all-gathers under their own names), the receiver waits for that file. A rank that is not running
yet is asked for: the waiting rank writes ``need.<src>`` and ``ettools capture`` starts that rank at
once (:func:`ettools.capture_emulate._run_all`). A wait longer than :data:`WAIT_S` fails with one
line naming both ranks. The exchanges are not recorded as operations (they carry a few hundred
bytes before the captured steps).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

WAIT_S = 300.0  # a sender that has not written after this long is not coming (deadlock, crash)
_POLL_S = 0.02


class ObjectWaitTimeout(RuntimeError):
    """The object a rank waits for did not arrive."""


class Mailbox:
    """One rank's side of the object mailbox (module doc)."""

    def __init__(self, folder: str | os.PathLike, rank: int) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.sent: dict[str, int] = {}
        self.read: dict[str, int] = {}

    def _next(self, table: dict[str, int], key: str) -> str:
        n = table.get(key, 0)
        table[key] = n + 1
        return f"{key}-{n}.pkl"

    def put(self, key: str, value: Any) -> None:
        """Write the next object under ``key`` (atomically: the reader never sees half a file)."""
        path = self.folder / self._next(self.sent, key)
        tmp = path.with_suffix(f".part{self.rank}")
        tmp.write_bytes(pickle.dumps(value))
        os.replace(tmp, path)

    def get(self, key: str, src: int, what: str) -> Any:
        """Wait for the next object under ``key``, written by rank ``src``."""
        path = self.folder / self._next(self.read, key)
        deadline = time.monotonic() + WAIT_S
        asked = False
        while not path.exists():
            if not asked:  # the sender may not have been started yet: ask for it
                (self.folder / f"need.{src}").touch()
                asked = True
            if time.monotonic() > deadline:
                raise ObjectWaitTimeout(f"rank {self.rank} waited {WAIT_S:.0f} s for a Python object from rank {src} "
                                        f"({what}) that never came")
            time.sleep(_POLL_S)
        return pickle.loads(path.read_bytes())


def _global(group: Any, group_rank: int | None, rank: int | None) -> int:
    if group_rank is not None:
        return int(dist.get_global_rank(group, group_rank)) if group is not None else int(group_rank)
    return int(rank if rank is not None else 0)


def install(folder: str | os.PathLike, rank: int) -> None:
    """Route the object collectives through a :class:`Mailbox` in ``folder`` (module doc)."""
    box = Mailbox(folder, rank)

    def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None, device: Any = None,
                         group_dst: int | None = None, **_how: Any) -> None:
        box.put(f"{rank}-{_global(group, group_dst, dst)}", list(object_list))

    def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None,
                         group_src: int | None = None, **_how: Any) -> int:
        if src is None and group_src is None:
            raise ValueError("recv_object_list from any source cannot be emulated: name src")
        s = _global(group, group_src, src)
        got = box.get(f"{s}-{rank}", s, "recv_object_list")
        object_list[:len(got)] = got
        return s

    def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None,
                              group_src: int | None = None, **_how: Any) -> None:
        s = _global(group, group_src, src)
        members = sorted(dist.get_process_group_ranks(group)) if group is not None else None
        key = f"b{s}-{'.'.join(map(str, members)) if members else 'world'}"
        if rank == s:
            box.put(key, list(object_list))
        else:
            object_list[:] = box.get(key, s, "broadcast_object_list")

    def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
        members = sorted(dist.get_process_group_ranks(group)) if group is not None else \
            list(range(dist.get_world_size()))
        tag = ".".join(map(str, members))
        box.put(f"g{rank}-{tag}", obj)
        for i, m in enumerate(members):
            object_list[i] = obj if m == rank else box.get(f"g{m}-{tag}", m, "all_gather_object")

    new = {"send_object_list": send_object_list, "recv_object_list": recv_object_list,
           "broadcast_object_list": broadcast_object_list, "all_gather_object": all_gather_object}
    c10d = dist.distributed_c10d
    originals = {name: getattr(c10d, name) for name in new}
    for mod in [dist, c10d, *list(sys.modules.values())]:
        if not getattr(mod, "__name__", "").startswith("torch"):
            continue
        for name, fn in new.items():
            if getattr(mod, name, None) is originals[name]:
                setattr(mod, name, fn)
