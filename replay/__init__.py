"""Event-driven replay of a multi-rank graph on a described cluster (``ettools replay``).

``replay_trace(trace, system=None, network=None, collectives=None, timing="measured",
symmetric=False) -> ReplayResult`` — see :mod:`.api`; ``calibrate(trace) -> Fit`` — see
:mod:`.calibrate`; ``fit_network(trace) -> CommFit`` — see :mod:`.netfit`. Modules: :mod:`.engine` (the event loop), :mod:`.prepare` (trace → program),
:mod:`.compute` (measured / calibrated / roofline), :mod:`.network` (ASTRA-sim network and system
files, collective algorithms, flow-level sharing), :mod:`.memory`, :mod:`.report`.
"""

from importlib import import_module
from typing import Any

# ``calibrate`` is both a submodule and the function the package exports: imported here, so the
# name is bound to the function after the submodule's import sets it (a lazy name would stay the module)
from .calibrate import Fit, calibrate

# names -> the module defining them, imported on first use (PEP 562): a command that only needs one
# part of the replay (``ettools search``'s options, ``info``) does not pay for importing all of it
_HOMES = {"replay_trace": ".api", "ReplayDeadlock": ".engine",
          "CommFit": ".netfit", "fit_network": ".netfit", "load_network": ".network", "load_system": ".network",
          "ReplayResult": ".report"}

__all__ = ["CommFit", "Fit", "fit_network", "ReplayDeadlock", "ReplayResult", "calibrate", "load_network", "load_system", "replay_trace"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value
    return value
