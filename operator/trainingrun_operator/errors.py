"""The operator's error vocabulary. kopf-free: only `handlers.py` turns these into kopf errors.

Each class says what went wrong and whether retrying the same reconcile can help (`retryable`, read by
`handlers.supervise` to choose the delay before the next pass).
"""

from __future__ import annotations

__all__ = ["ApiError", "IllegalTransition", "OperatorError"]


class OperatorError(Exception):
    """Base of every operator error."""

    retryable: bool = False


class IllegalTransition(OperatorError):
    """The decision core tried a phase change the transition table forbids; a bug, retrying is useless."""

    retryable = False


class ApiError(OperatorError):
    """An API call failed in a way a later retry may fix (timeout, 5xx, 429, conflict on status)."""

    retryable = True

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
