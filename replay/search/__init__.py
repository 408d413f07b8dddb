"""Plan search (``ettools search``): the fastest parallel plan of a model on a cluster.

:func:`~.search.search` enumerates (or samples) plans of a :class:`~.space.Space`, prunes invalid
ones, those over the device's memory (the synthesizer's memory model) and those whose lower bound
cannot beat the best found so far, and replays the rest — one rank per pipeline stage, the ranks of a
stage being symmetric by construction — on a local process pool or Ray (:mod:`.engines`), caching
every finished trial on disk (:mod:`.cache`). The result ranks the plans and writes JSON, CSV, a
Pareto plot and the best plan's Chakra traces.
"""

from importlib import import_module
from typing import Any

# imported on first use (PEP 562): registering the ``search`` command imports none of the search
_HOMES = {"Context": ".evaluate", "evaluate_plan": ".evaluate", "OBJECTIVES": ".search", "STRATEGIES": ".search",
          "SearchResult": ".search", "search": ".search", "DEFAULTS": ".space", "Space": ".space",
          "canonical": ".space", "parse_values": ".space", "plan_key": ".space", "plan_label": ".space"}

__all__ = ["DEFAULTS", "OBJECTIVES", "STRATEGIES", "Context", "SearchResult", "Space", "canonical",
           "evaluate_plan", "parse_values", "plan_key", "plan_label", "search"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value
    return value
