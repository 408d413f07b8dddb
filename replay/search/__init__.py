"""Plan search (``ettools search``): the fastest parallel plan of a model on a cluster.

:func:`~.search.search` enumerates (or samples) plans of a :class:`~.space.Space`, prunes invalid
ones, those over the device's memory (the synthesizer's memory model) and those whose lower bound
cannot beat the best found so far, and replays the rest — one rank per pipeline stage, the ranks of a
stage being symmetric by construction — on a local process pool or Ray (:mod:`.engines`), caching
every finished trial on disk (:mod:`.cache`). The result ranks the plans and writes JSON, CSV, a
Pareto plot and the best plan's Chakra traces.
"""

from .evaluate import Context, evaluate_plan
from .search import OBJECTIVES, STRATEGIES, SearchResult, search
from .space import DEFAULTS, Space, canonical, parse_values, plan_key, plan_label

__all__ = ["DEFAULTS", "OBJECTIVES", "STRATEGIES", "Context", "SearchResult", "Space", "canonical",
           "evaluate_plan", "parse_values", "plan_key", "plan_label", "search"]
