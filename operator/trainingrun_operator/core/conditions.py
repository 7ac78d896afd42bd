"""Standard conditions (type/status/reason/message/lastTransitionTime/observedGeneration). Pure.

`decision.py` derives every condition from the phase and the recorded checkpoints on each pass; this module
keeps lastTransitionTime stable while a condition's status does not change, as `kubectl wait` expects.

A False condition says only which phase the run is in, with one exception: while the run is Restarting, `Running`
says why the last attempt ended (its failure class as the reason, and the run's message: a stall names the last
step the driver reported and when), as a Deployment's `Progressing` does with `ProgressDeadlineExceeded`.

`Queued` is there only for a run queued by Kueue (or one whose attempt waits in a queue): True while an attempt
waits for admission, its message naming the LocalQueue (the run's message), False otherwise.
"""

from __future__ import annotations

from typing import Literal

from trainingrun_operator.core import model
from trainingrun_operator.core.phases import Phase

__all__ = ["CONDITION_TYPES", "derive"]

CONDITION_TYPES = ("Running", "CheckpointAvailable", "Succeeded", "Failed", "Suspended", "Queued")


def _set(
    old: dict[str, model.Condition], kind: str, true: bool, reason: str, message: str, now: str, generation: int
) -> model.Condition:
    """A condition; a False one says only which phase the run is in, not the run's reason."""
    status: Literal["True", "False"] = "True" if true else "False"
    before = old.get(kind)
    changed = before is None or before.status != status
    return model.Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now if changed or before is None else before.last_transition_time,
        observed_generation=generation,
    )


def derive(
    previous: list[model.Condition] | None,
    phase: Phase,
    reason: str,
    message: str,
    latest: model.CheckpointRecord | None,
    now: str,
    generation: int,
    queued: bool = False,
) -> list[model.Condition]:
    """The conditions of a run in `phase` with newest checkpoint `latest`: five, and `Queued` for a run that
    `queued` says waits in a queue (its attempts do) or whose phase is Queued."""
    old = {c.type: c for c in previous or []}
    why = reason or phase.value

    def state(kind: str, true: bool) -> model.Condition:
        if true:
            return _set(old, kind, True, why, message, now, generation)
        return _set(old, kind, False, phase.value, f"the run is {phase.value}", now, generation)

    ckpt_message = f"step {latest.step} at {latest.path}" if latest else "no checkpoint recorded yet"
    restarting = phase is Phase.RESTARTING and bool(reason)
    found = [
        _set(old, "Running", False, reason, message, now, generation)
        if restarting
        else state("Running", phase is Phase.RUNNING),
        _set(
            old,
            "CheckpointAvailable",
            latest is not None,
            "CheckpointRecorded" if latest else "NoCheckpoint",
            ckpt_message,
            now,
            generation,
        ),
        state("Succeeded", phase is Phase.SUCCEEDED),
        state("Failed", phase is Phase.FAILED),
        state("Suspended", phase is Phase.SUSPENDED),
    ]
    if queued or phase is Phase.QUEUED:
        found.append(state("Queued", phase is Phase.QUEUED))
    return found
