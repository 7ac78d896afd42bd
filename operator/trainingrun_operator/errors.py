"""The operator's error vocabulary. kopf-free: only `handlers.py` turns these into kopf errors.

Each class says what went wrong and whether retrying the same reconcile can help (`retryable`).
"""

from __future__ import annotations

__all__ = ["ApiError", "IllegalTransition", "InvalidSpec", "OperatorError", "ReportError"]


class OperatorError(Exception):
    """Base of every operator error."""

    retryable: bool = False


class InvalidSpec(OperatorError):
    """The TrainingRun's spec cannot run (e.g. spec.trainer fails RuntimeConfig); retrying is useless until edited."""

    retryable = False

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class IllegalTransition(OperatorError):
    """The decision core tried a phase change the transition table forbids; a bug, retrying is useless."""

    retryable = False


class ApiError(OperatorError):
    """An API call failed in a way a later retry may fix (timeout, 5xx, 429, conflict on status)."""

    retryable = True

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ReportError(OperatorError):
    """A driver's runtime report could not be read (local backend: a torn or malformed runtime.json); retry."""

    retryable = True
