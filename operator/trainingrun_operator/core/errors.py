"""The operator's error vocabulary. kopf-free: only `handlers.py` turns these into kopf errors.

Each class says what went wrong and whether retrying the same reconcile can help (`retryable`, read by
`handlers.supervise` to choose the delay before the next pass). `InvalidInput` never reaches a reconcile: the
command line (`cli.main`) prints it and exits 2.
"""

from __future__ import annotations

__all__ = ["ApiError", "ForeignObject", "IllegalTransition", "InvalidInput", "OperatorError"]


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


class InvalidInput(OperatorError):
    """What a user handed a command (a TrainingRun file, a kubeconfig) cannot be used; fix it and run it again.

    The message is complete as it is: it names the file, and the line and column or the invalid fields.
    """

    @classmethod
    def in_yaml(cls, path: str, error: Exception) -> InvalidInput:
        """A file that is not valid YAML: `path:line:column: not valid YAML: <the parser's words>`."""
        mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
        if mark is None or problem is None:
            return cls(f"{path}: not valid YAML: {str(error).splitlines()[0]}")
        context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
        where = f" ({context} at line {context_mark.line + 1})" if context and context_mark is not None else ""
        return cls(f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}{where}")


class ForeignObject(OperatorError):
    """An object under one of the run's names is not the run's own; it is never adopted: delete it or rename the run.

    Its owner references name another owner, or none (or, for the driver's Role and RoleBinding, its rules or
    binding are not the ones the operator writes). The message names the object, its owner and the fix. Retried:
    the object may be an earlier run's of the same name that the garbage collector is still removing.
    """

    retryable = True
