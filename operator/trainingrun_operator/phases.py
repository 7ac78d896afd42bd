"""Phases of a TrainingRun and the transitions between them. Pure; the decision core checks every change here.

    Pending ──> Starting ──> Running ──> Succeeded
       │           │ ▲          │
       │           │ │          │  attempt ended (Preempted, ApplicationFailure,
       │           ▼ │          ▼  InfrastructureFailure, FailedRestore)
       │        Restarting <────┘
       │           │
       ├───────────┴──> Failed            (budget exhausted, permanent error, invalid spec)
       │
       └──> Suspended <──> (any non-terminal phase; leaving it starts a new attempt via Starting)

Succeeded and Failed are terminal. `Restarting` always carries a reason (the failure class of the attempt
that ended) in `status.reason`.
"""

from __future__ import annotations

import enum

from trainingrun_operator import errors

__all__ = ["TERMINAL", "TRANSITIONS", "Phase", "check_transition"]


class Phase(str, enum.Enum):
    """The TrainingRun's phase (`status.phase`)."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL: frozenset[Phase] = frozenset({Phase.SUCCEEDED, Phase.FAILED})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.STARTING, Phase.SUSPENDED, Phase.FAILED}),
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.RESTARTING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}),
    Phase.RUNNING: frozenset({Phase.RESTARTING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}),
    Phase.RESTARTING: frozenset({Phase.STARTING, Phase.SUSPENDED, Phase.FAILED}),
    Phase.SUSPENDED: frozenset({Phase.STARTING, Phase.FAILED}),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
}
"""Allowed changes: TRANSITIONS[from] is the set of phases `from` may move to (staying put is always allowed)."""


def check_transition(current: Phase, target: Phase) -> None:
    """Raise IllegalTransition unless `current -> target` is in the table (or is no change)."""
    if current != target and target not in TRANSITIONS[current]:
        raise errors.IllegalTransition(f"phase {current.value} -> {target.value} is not allowed")
