"""What the operator's /metrics says about each run, computed from the run's status. Pure.

`metrics.py` serves these figures (prometheus_client); the reconciler hands it, after each status write, the
status the pass read and the one it wrote. Two things are computed here:

    gauges(status)                          the run's figures now: phase, attempt, newest recorded checkpoint
                                            (step and time; its age is counted at scrape time), the driver's
                                            newest reported step
    tally(memory, old, new, now, created)   what that one pass changed: an attempt ended (its class), steps and
                                            worker pods lost, a checkpoint recorded, an attempt started (how
                                            long after the apply, or after the failure), the attempt's first
                                            report (how long after its start), the seconds status.goodput
                                            counted as elapsed or lost (by cause) since the status read

Counting on the transition. Every count comes from a difference between the status read and the status written,
the same differences that make decision.py emit its events (AttemptStarted, CheckpointRecorded, WorkerLost, the
failure class). A pass that runs again over the status it already wrote finds no difference and counts nothing,
and an operator restart (counters start again from 0, as Prometheus expects) counts nothing twice: the status is
the memory.

Steps lost are counted once final, and never for an attempt that succeeded (the run lost nothing). An attempt's
`stepsLost` is set when it ends, and counted then; but a Preempted attempt's may still shrink while the run is
Restarting (the checkpoint its driver saved on the head's notice is read after the attempt ended:
`decision._recount_steps_lost`). Its steps are counted when that can no longer happen: the next attempt starts,
or the run leaves Restarting.

The durations, in seconds:
    first RayJob     metadata.creationTimestamp (the apply) -> the decision that starts attempt 1 (whose RayJob
                     is created right after the status write); only for a run that went straight from Pending
    restart          the decision that ended an attempt with a failure class -> the one that starts the next
                     (out of Restarting: not across a suspension)
    first report     the decision that started the attempt -> the driver's first report of it (its `updated`,
                     by the driver's clock: Ray's start-up and the restore included); a queued attempt's from its
                     admission (`status.attempt.admitted`: the wait in Kueue's queue is neither the operator's nor
                     the driver's)
Status times are written to the second. `Memory` keeps the exact moments of the decisions this process made
(where the status keeps seconds only), so the restart and first-report durations are exact unless the operator
restarted in between (then they are counted from the status, at most a second long). The apply's time is the
API server's, to the second.
"""

from __future__ import annotations

import dataclasses
import datetime

from trainingrun_operator.core import model
from trainingrun_operator.core.classification import FailureClass
from trainingrun_operator.core.phases import Phase
from trainingrun_runtime import timestamps

__all__ = ["CLASSES", "FAILURE_CLASSES", "LOST_CAUSES", "PHASES", "Gauges", "Memory", "Tally", "gauges", "tally"]

PHASES: tuple[str, ...] = tuple(p.value for p in Phase)
FAILURE_CLASSES: tuple[str, ...] = tuple(c.value for c in FailureClass)
SUCCEEDED = "Succeeded"
CLASSES: tuple[str, ...] = (*FAILURE_CLASSES, SUCCEEDED, "Suspended", "InvalidSpec")
"""Every reason an attempt ends with (`decision.end_attempt`): the failure classes, then the other endings."""


@dataclasses.dataclass(frozen=True)
class Gauges:
    """One run's figures at the moment of its last pass."""

    phase: str
    attempt: int
    """The current attempt's number; 0 before the first."""
    checkpoint_step: int | None
    checkpoint_time: datetime.datetime | None
    """When the newest recorded checkpoint was written (its manifest's time); its age is counted at scrape time."""
    driver_step: int | None
    """The driver's newest reported step (`status.runtime.step`), of whichever attempt reported last."""
    goodput_ratio: float | None = None
    """`status.goodput.ratio` (`goodput`)."""


def gauges(status: model.TrainingRunStatus) -> Gauges:
    latest = status.checkpoints.latest if status.checkpoints else None
    return Gauges(
        phase=status.phase or Phase.PENDING.value,
        attempt=status.attempt.number if status.attempt else 0,
        checkpoint_step=latest.step if latest else None,
        checkpoint_time=_time(latest.time) if latest else None,
        driver_step=status.runtime.step if status.runtime else None,
        goodput_ratio=status.goodput.ratio if status.goodput else None,
    )


@dataclasses.dataclass(frozen=True)
class Memory:
    """Exact moments of this process's own decisions about one run: (attempt number, when)."""

    ended: tuple[int, datetime.datetime] | None = None
    """The attempt that ended last with a failure class, and the decision's moment."""
    started: tuple[int, datetime.datetime] | None = None
    """The attempt started last, and the decision's moment."""


@dataclasses.dataclass(frozen=True)
class Tally:
    """What one pass changed (nothing: the defaults)."""

    ended: str | None = None
    """The class (the reason) of the attempt that ended in this pass."""
    steps_lost: int = 0
    workers_lost: int = 0
    checkpoints_recorded: int = 0
    first_rayjob_seconds: float | None = None
    restart_seconds: float | None = None
    first_report_seconds: float | None = None
    lost_seconds: tuple[tuple[str, float], ...] = ()
    """Seconds the pass added to `status.goodput.lostSeconds`, by cause (the causes that grew)."""
    elapsed_seconds: float = 0.0
    """Seconds the pass added to `status.goodput.elapsedSeconds` (the run's time, queues left out): with the lost
    seconds, the goodput of any window (productive time is the rest, and may still turn out lost: a counter
    of it could not shrink back)."""


def tally(
    memory: Memory,
    old: model.TrainingRunStatus,
    new: model.TrainingRunStatus,
    now: datetime.datetime,
    created: str | None = None,
) -> tuple[Memory, Tally]:
    """What the pass that read `old` and wrote `new` at `now` changed; `created`: the run's creationTimestamp."""
    before, current = old.attempt, new.attempt
    ended = _ended_here(old, new)
    started = current is not None and (before is None or before.number != current.number)
    first_rayjob = restart = None
    if started and current is not None:
        if before is None and (old.phase or Phase.PENDING.value) == Phase.PENDING.value and created:
            first_rayjob = _seconds(_time(created), now)
        elif before is not None and before.end and before.reason in FAILURE_CLASSES and _restarting(old):
            exact = memory.ended[1] if memory.ended and memory.ended[0] == before.number else None
            restart = _seconds(exact or _time(before.end), now)
        memory = dataclasses.replace(memory, started=(current.number, now))
    if ended and current is not None and current.reason in FAILURE_CLASSES:
        memory = dataclasses.replace(memory, ended=(current.number, now))
    return memory, Tally(
        ended=(current.reason or "Unknown") if ended and current is not None else None,
        steps_lost=_steps_lost(old, new, ended) or 0,
        workers_lost=_workers_lost(before, current),
        checkpoints_recorded=int(_checkpoint_recorded(old, new)),
        first_rayjob_seconds=first_rayjob,
        restart_seconds=restart,
        first_report_seconds=_first_report(memory, old, new, now),
        lost_seconds=_lost_seconds(old.goodput, new.goodput),
        elapsed_seconds=_grown(old.goodput, new.goodput, "elapsed_seconds"),
    )


LOST_CAUSES: tuple[str, ...] = tuple(model.LostSeconds.model_fields)
"""The causes of `status.goodput.lostSeconds`, the label values of trainingrun_lost_seconds_total."""


def _lost_seconds(old: model.Goodput | None, new: model.Goodput | None) -> tuple[tuple[str, float], ...]:
    if new is None:
        return ()
    before = old.lost_seconds if old is not None else model.LostSeconds()
    grown = ((k, getattr(new.lost_seconds, k) - getattr(before, k)) for k in LOST_CAUSES)
    return tuple((k, v) for k, v in grown if v > 0)  # recompute shrinks when a notice's checkpoint is read late


def _grown(old: model.Goodput | None, new: model.Goodput | None, field: str) -> float:
    """How much `field` of the goodput grew in the pass; a figure that shrank counts nothing: counters only grow."""
    if new is None:
        return 0.0
    return max(0.0, float(getattr(new, field)) - (float(getattr(old, field)) if old is not None else 0.0))


# ------------------------------------------------------------------------------------------------- parts


def _ended_here(old: model.TrainingRunStatus, new: model.TrainingRunStatus) -> bool:
    before, current = old.attempt, new.attempt
    if current is None or not current.end:
        return False
    return before is None or before.number != current.number or not before.end


def _restarting(status: model.TrainingRunStatus) -> bool:
    return status.phase == Phase.RESTARTING.value


def _may_shrink(status: model.TrainingRunStatus) -> bool:
    """Whether the current attempt's stepsLost may still be recounted (`decision._late_notice_checkpoint`)."""
    attempt = status.attempt
    return (
        attempt is not None
        and bool(attempt.end)
        and attempt.reason == FailureClass.PREEMPTED.value
        and _restarting(status)
    )


def _steps_lost(old: model.TrainingRunStatus, new: model.TrainingRunStatus, ended: bool) -> int | None:
    """The steps lost that became final in this pass: the attempt that ended (unless they may still shrink), or
    the Preempted attempt whose count could shrink until now."""
    current = new.attempt
    if ended and current is not None:
        if current.reason == SUCCEEDED or _may_shrink(new):
            return None  # a run that finished lost nothing
        return current.steps_lost
    before = old.attempt
    if before is None or not _may_shrink(old):
        return None
    if current is not None and current.number == before.number:
        return None if _may_shrink(new) else current.steps_lost
    final = next((a for a in reversed(new.attempts or []) if a.number == before.number), before)
    return final.steps_lost


def _workers_lost(before: model.AttemptRecord | None, current: model.AttemptRecord | None) -> int:
    if current is None:
        return 0
    counted = (before.workers_lost or 0) if before is not None and before.number == current.number else 0
    return max(0, (current.workers_lost or 0) - counted)


def _checkpoint_key(status: model.TrainingRunStatus) -> tuple[int, int, str] | None:
    latest = status.checkpoints.latest if status.checkpoints else None
    return (latest.step, latest.attempt, latest.path) if latest else None


def _checkpoint_recorded(old: model.TrainingRunStatus, new: model.TrainingRunStatus) -> bool:
    key = _checkpoint_key(new)
    return key is not None and key != _checkpoint_key(old)


def _reported(status: model.TrainingRunStatus) -> bool:
    """Whether the current attempt's driver has reported a step: `status.rate` (progress.py) is measured from the
    current attempt's reports only, and names the attempt of the newest one it took."""
    return status.attempt is not None and status.rate is not None and status.rate.attempt == status.attempt.number


def _first_report(
    memory: Memory, old: model.TrainingRunStatus, new: model.TrainingRunStatus, now: datetime.datetime
) -> float | None:
    attempt, report = new.attempt, new.runtime
    if attempt is None or report is None or _reported(old) or not _reported(new):
        return None
    exact = memory.started[1] if memory.started and memory.started[0] == attempt.number else None
    start = _time(attempt.admitted) or exact or _time(attempt.start)
    if start is None:
        return None
    when = _time(report.updated)
    if when is None or when < start:
        when = now  # the driver's clock disagrees: when this pass saw the report, a bound from above
    return _seconds(start, when)


def _time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    try:
        return timestamps.parse(text)
    except ValueError:
        return None


def _seconds(start: datetime.datetime | None, end: datetime.datetime) -> float | None:
    return None if start is None else max(0.0, (end - start).total_seconds())
