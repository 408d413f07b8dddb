"""The one error type for bad input: the CLI prints its message on one line and exits 2."""

from __future__ import annotations


class TraceError(Exception):
    """Bad input: ``str(err)`` names the file and what is wrong (offset, frame or event where known)."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
