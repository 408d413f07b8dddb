"""What is known of a run as a whole: :class:`TraceMeta` (world size, process groups, device
properties, source) and its :class:`ProcessGroup` communicators, ranks bounded by
:data:`MAX_WORLD_SIZE`. See :mod:`ettools.graph`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The most ranks a trace may name: above every real job (today's largest are ~10^5 GPUs), and low
# enough that a per-rank table of the world fits in memory. A rank or world size beyond it is bad input.
MAX_WORLD_SIZE = 2**22


@dataclass(frozen=True)
class ProcessGroup:
    """A communicator: its name, its members as global ranks (in group-rank order)."""

    name: str
    ranks: tuple[int, ...]
    desc: str = ""
    backend: str = ""

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.ranks)


@dataclass
class TraceMeta:
    """What is known of the run as a whole."""

    world_size: int = 1
    process_groups: dict[str, ProcessGroup] = field(default_factory=dict)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    # Free-form facts a reader keeps (schema versions, Chakra GlobalMetadata attributes, ...).
    extra: dict[str, Any] = field(default_factory=dict)

    def add_group(self, group: ProcessGroup) -> ProcessGroup:
        """Register ``group`` (a group of the same name must have the same members)."""
        if group.ranks and (max(group.ranks) >= MAX_WORLD_SIZE or min(group.ranks) < 0):
            bad = max(group.ranks) if max(group.ranks) >= MAX_WORLD_SIZE else min(group.ranks)
            raise ValueError(f"process group {group.name!r} names rank {bad}: ranks must be in "
                             f"0..{MAX_WORLD_SIZE - 1}")
        old = self.process_groups.get(group.name)
        if old is not None and old.ranks != group.ranks:
            raise ValueError(
                f"process group {group.name!r} given twice with different ranks: "
                f"{list(old.ranks)} and {list(group.ranks)}"
            )
        self.process_groups.setdefault(group.name, group)
        return self.process_groups[group.name]
