"""Event-driven replay of a multi-rank graph on a described cluster (``ettools replay``).

``replay_trace(trace, system=None, network=None, collectives=None, timing="measured",
symmetric=False) -> ReplayResult`` — see :mod:`.api`; ``calibrate(trace) -> Fit`` — see
:mod:`.calibrate`; ``fit_network(trace) -> CommFit`` — see :mod:`.netfit`. Modules: :mod:`.engine` (the event loop), :mod:`.prepare` (trace → program),
:mod:`.compute` (measured / calibrated / roofline), :mod:`.network` (ASTRA-sim network and system
files, collective algorithms, flow-level sharing), :mod:`.memory`, :mod:`.report`.
"""

from .api import replay_trace
from .calibrate import Fit, calibrate
from .engine import ReplayDeadlock
from .netfit import CommFit, fit_network
from .network import load_network, load_system
from .report import ReplayResult

__all__ = ["CommFit", "Fit", "fit_network", "ReplayDeadlock", "ReplayResult", "calibrate", "load_network", "load_system", "replay_trace"]
