"""Deterministic names and labels of a run's children. Pure; the same inputs always give the same names, so a
retried reconcile finds (and adopts) what an earlier one created instead of creating a duplicate.
"""

from __future__ import annotations

__all__ = [
    "LABEL_ATTEMPT",
    "LABEL_MANAGED_BY",
    "LABEL_RUN",
    "MANAGED_BY",
    "attempt_labels",
    "identity_name",
    "rayjob_name",
]

LABEL_RUN = "trainingrun.dev/run"
LABEL_ATTEMPT = "trainingrun.dev/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainingrun-operator"


def rayjob_name(run: str, attempt: int) -> str:
    """`<run>-a<attempt>`: at most 47 characters for a run name of at most 40 (the CRD enforces it)."""
    return f"{run}-a{attempt}"


def identity_name(run: str) -> str:
    """Name of the driver's per-run ServiceAccount, Role and RoleBinding."""
    return f"{run}-driver"


def attempt_labels(run: str, attempt: int) -> dict[str, str]:
    """Labels on an attempt's RayJob and on every pod of its Ray cluster."""
    return {LABEL_RUN: run, LABEL_ATTEMPT: str(attempt), LABEL_MANAGED_BY: MANAGED_BY}
