"""The structural proof every pass runs on its result (:func:`ettools.checks.verify`)."""

from __future__ import annotations

from ettools.checks import Problem, StructuralError, verify
from ettools.graph import Trace


class PassError(StructuralError):
    """A rewrite produced a trace that fails the structural proof; the message names the pass, rank and node."""

    def __init__(self, pass_name: str, problems: list[Problem]) -> None:
        self.pass_name = pass_name
        super().__init__(problems)
        self.args = (f"{pass_name}: {self.args[0]}",)


def prove(trace: Trace, pass_name: str, device_bytes: int | None = None) -> Trace:
    """``trace`` if it passes the structural proof (acyclic, matched collectives and send/recv,
    no dangling dependency, memory within ``device_bytes``); else :class:`PassError`."""
    problems = verify(trace, device_bytes)
    if problems:
        raise PassError(pass_name, problems)
    return trace


__all__ = ["PassError", "prove"]
