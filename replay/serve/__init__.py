"""Serving simulation (``ettools serve``): request arrivals, schedulers, KV cache, disaggregation and
speculative decoding over per-iteration costs replayed from synthesized inference steps.

:func:`simulate_serving` is the entry point; :mod:`.workload` makes or reads requests,
:mod:`.cost` times iterations (:class:`StepCost`), :mod:`.engine` runs one engine's scheduler.
"""

from .cost import StepCost, roofline_breakdown
from .engine import EngineConfig, EngineResult, run_engine
from .sim import ServeResult, simulate_serving
from .workload import Workload, draw_tokens, load_requests, synthetic

__all__ = ["EngineConfig", "EngineResult", "ServeResult", "StepCost", "Workload", "draw_tokens", "load_requests",
           "roofline_breakdown", "run_engine", "simulate_serving", "synthetic"]
