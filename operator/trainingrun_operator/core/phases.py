"""Phases of a TrainingRun and the transitions between them. Pure; the decision core checks every change here.

    Pending ──┬─────────────────> Starting ──> Running ──> Succeeded
       │      │                    ▲   │ ▲         │
       │      └──> Queued ─────────┘   │ │         │  attempt ended (Preempted, ApplicationFailure,
       │             ▲    (admitted)   ▼ │         ▼  InfrastructureFailure, FailedRestore, Stalled)
       │             └────────────── Restarting <──┘
       │                                │
       ├────────────────────────────────┴──> Failed   (budget exhausted, permanent error, invalid spec)
       │
       └──> Suspended <──> (any non-terminal phase; leaving it starts a new attempt via Starting or Queued)

Queued: a run labelled with a Kueue queue (`queueing.py`) starts each attempt here instead of in Starting; its
RayJob exists, suspended, and waits for Kueue to admit it (no pods, no deadline, no budget charged). Admitted (the
RayJob unsuspended) -> Starting, or Running at once if the cluster already runs. A RayJob suspended by someone else
before it was ever admitted (a queue that manages unlabelled RayJobs) moves Starting back to Queued; one suspended
after it was admitted is a preemption (Restarting).

Succeeded and Failed are terminal. `Restarting` always carries a reason (the failure class of the attempt
that ended) in `status.reason`.
"""

from __future__ import annotations

import enum

from trainingrun_operator.core import errors

__all__ = ["TERMINAL", "TRANSITIONS", "Phase", "check_transition"]


class Phase(str, enum.Enum):
    """The TrainingRun's phase (`status.phase`)."""

    PENDING = "Pending"
    QUEUED = "Queued"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL: frozenset[Phase] = frozenset({Phase.SUCCEEDED, Phase.FAILED})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.QUEUED, Phase.STARTING, Phase.SUSPENDED, Phase.FAILED}),
    Phase.QUEUED: frozenset(
        {Phase.STARTING, Phase.RUNNING, Phase.RESTARTING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}
    ),
    Phase.STARTING: frozenset(
        {Phase.QUEUED, Phase.RUNNING, Phase.RESTARTING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}
    ),
    Phase.RUNNING: frozenset({Phase.RESTARTING, Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED}),
    Phase.RESTARTING: frozenset({Phase.QUEUED, Phase.STARTING, Phase.SUSPENDED, Phase.FAILED}),
    Phase.SUSPENDED: frozenset({Phase.QUEUED, Phase.STARTING, Phase.FAILED}),
    Phase.SUCCEEDED: frozenset(),
    Phase.FAILED: frozenset(),
}
"""Allowed changes: TRANSITIONS[from] is the set of phases `from` may move to (staying put is always allowed)."""


def check_transition(current: Phase, target: Phase) -> None:
    """Raise IllegalTransition unless `current -> target` is in the table (or is no change)."""
    if current != target and target not in TRANSITIONS[current]:
        raise errors.IllegalTransition(f"phase {current.value} -> {target.value} is not allowed")
