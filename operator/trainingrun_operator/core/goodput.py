"""Goodput: the share of a run's time that went into training it kept, and where the rest went. Pure.

Each attempt's time is cut at its first trained step (`AttemptRecord.firstStep`, the driver's first report of a step
past the one it resumed from):

    before it   from the previous attempt's end (the run's start for the first attempt) to the first step:
                queued     a suspension before the attempt (the previous one ended Suspended), and Kueue's queue
                           (its start to its admission; never admitted: all of it)
                start      the first attempt's: Ray's start, the restore, the driver's start
                restart    a later attempt's, split by whose part it is:
                             operator  the previous end to this attempt's RayJob (the backoff included)
                             cluster   the RayJob (or its admission) to the RayJob running (KubeRay, the pods, Ray)
                             driver    running to the first step (the restore, the driver's start)
                An attempt that ends before a first step spends all of its time here.
    after it    to its end (the current attempt: to `asOf`):
                stall      a Stalled attempt: its newest report to its end (the watchdog's deadline)
                recompute  an attempt that ended badly: the steps it lost (`stepsLost`: past the checkpoint the next
                           attempt resumes from), each at the step time measured before the loss (`stepSeconds`:
                           the run's rate; before one is measured, the attempt's own steps so far)
                checkpoint time training waited for saves (the driver's `checkpointSeconds`)
                productive the rest: steps the run keeps

The pieces tile the run from its start to `asOf`, so elapsed = productive + queued + the lost seconds, and
ratio = productive / (elapsed - queued). `asOf` is the newest time the status holds (the current attempt's newest
report, its start, admission, running or end): the figure moves with what the operator learns, never with the clock
alone, so a pass that learns nothing writes nothing. The attempts before the current one are summed into `earlier`
when it starts (`fold`): the attempt history is bounded, the sum is not.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TypeVar

from trainingrun_operator.core import events, model
from trainingrun_operator.core.classification import FailureClass
from trainingrun_runtime import timestamps

__all__ = ["attempt_spent", "fold", "keep", "line", "seen", "summarise", "total"]

_M = TypeVar("_M", model.LostSeconds, model.RestartSeconds)


def seen(
    attempt: model.AttemptRecord, report: model.RuntimeReport | None, rate: model.ProgressRate | None
) -> model.AttemptRecord:
    """`attempt` with what its driver's reports say so far: its first trained step's time, its newest report's, its
    saves' seconds, and the step time at the recent rate. `report` is ignored unless it is this attempt's."""
    if report is None or report.attempt != attempt.number or report.updated is None or report.restore_error:
        return attempt
    update: dict[str, object] = {"last_report": report.updated}
    base = attempt.resumed_from or 0
    if attempt.first_step is None and report.step is not None and report.step > base:
        update["first_step"] = report.updated
    if report.checkpoint_seconds is not None:
        update["checkpoint_seconds"] = report.checkpoint_seconds
    step_s = _step_seconds(attempt.number, report, rate)
    if step_s is not None:
        update["step_seconds"] = step_s
    changed = {k: v for k, v in update.items() if getattr(attempt, k) != v}
    return attempt.model_copy(update=changed) if changed else attempt


def _step_seconds(number: int, report: model.RuntimeReport, rate: model.ProgressRate | None) -> float | None:
    """Seconds a step takes: the run's measured rate (`progress`); before one is measured, this attempt's own steps
    since the report its rate's measurement started from (a short attempt, ended before the rate's window)."""
    if rate is None:
        return None
    if rate.steps_per_second:
        return round(1.0 / rate.steps_per_second, 6)
    start, now = _t(rate.time), _t(report.updated)
    if rate.attempt != number or start is None or now is None or report.step is None or report.step <= rate.step:
        return None
    seconds = _s(start, now)
    return round(seconds / (report.step - rate.step), 6) if seconds > 0 else None  # no time passed: no measure


def attempt_spent(
    attempt: model.AttemptRecord,
    previous: model.AttemptRecord | None,
    *,
    run_start: str,
    until: str,
    queued: bool = False,
) -> model.Spent:
    """Where `attempt`'s time went, from the previous attempt's end (or `run_start`) to its end or `until` (see the
    module docstring). `queued`: the run waits in a queue (an attempt never admitted waited all along)."""
    end = _t(attempt.end) or timestamps.parse(until)
    start = min(_t(attempt.start) or end, end)
    begin = min((_t(previous.end) if previous is not None else _t(run_start)) or start, start)
    first = max(start, min(_t(attempt.first_step) or end, end))  # a driver's clock a little behind: not before it

    suspended = 0.0
    if previous is not None and previous.reason == events.Reason.SUSPENDED.value:
        suspended, begin = _s(begin, start), start
    waited = 0.0
    admitted = _t(attempt.admitted)
    running = _t(attempt.running_since)
    if admitted is not None:
        waited += _s(start, min(admitted, first))
        cluster_from = min(admitted, first)
    elif queued and running is None:
        waited += _s(start, first)
        cluster_from = first
    else:
        cluster_from = start
    before = max(0.0, _s(begin, first) - waited)
    lost = {"start": 0.0, "restart": 0.0, "recompute": 0.0, "stall": 0.0, "checkpoint": 0.0}
    split = {"operator": 0.0, "cluster": 0.0, "driver": 0.0}
    if previous is None:
        lost["start"] = before
    else:
        lost["restart"] = before
        split["operator"] = _s(begin, start)
        up = min(running, first) if running is not None else first
        split["cluster"] = _s(cluster_from, up)
        split["driver"] = _s(up, first)

    productive = 0.0
    if attempt.first_step is not None:
        left = _s(first, end)
        if attempt.end is not None and attempt.reason == FailureClass.STALLED.value:
            last = max(_t(attempt.last_report) or first, first)
            lost["stall"] = min(left, _s(last, end))
            left -= lost["stall"]
        if attempt.end is not None and attempt.reason != events.Reason.SUCCEEDED.value:
            lost["recompute"] = min(left, (attempt.steps_lost or 0) * (attempt.step_seconds or 0.0))
            left -= lost["recompute"]
        lost["checkpoint"] = min(left, attempt.checkpoint_seconds or 0.0)
        productive = left - lost["checkpoint"]
    return model.Spent(
        productive=productive,
        queued=suspended + waited,
        lost=model.LostSeconds(**lost),
        restart=model.RestartSeconds(**split),
    )


def fold(a: model.Spent, b: model.Spent) -> model.Spent:
    """The two summed, field by field."""
    return model.Spent(
        productive=a.productive + b.productive,
        queued=a.queued + b.queued,
        lost=_each(lambda k: getattr(a.lost, k) + getattr(b.lost, k), model.LostSeconds),
        restart=_each(lambda k: getattr(a.restart, k) + getattr(b.restart, k), model.RestartSeconds),
    )


def _each(value: Callable[[str], float], kind: type[_M]) -> _M:
    """A `kind` whose every field is `value(field name)`."""
    return kind(**{k: value(k) for k in kind.model_fields})


def total(status: model.TrainingRunStatus, *, queued: bool = False) -> tuple[model.Spent, datetime.datetime] | None:
    """Where the run's time went up to the newest time its status holds (returned with it): `status.goodput.earlier`
    and the current attempt, with its driver's reports (`seen`). None before the first attempt. When the next attempt
    starts, this is its `earlier`."""
    attempt = status.attempt
    if attempt is None or status.start_time is None:
        return None
    current = seen(attempt, status.runtime, status.rate)
    previous = next((a for a in reversed(status.attempts or []) if a.number < current.number), None)
    times = [current.start, current.admitted, current.running_since, current.end, current.last_report]
    known = [t for t in (_t(x) for x in times) if t is not None]
    if not known:
        return None
    as_of = max(known)
    now = attempt_spent(current, previous, run_start=status.start_time, until=timestamps.rfc3339(as_of), queued=queued)
    earlier = status.goodput.earlier if status.goodput is not None else None
    return (now if earlier is None else fold(earlier, now)), as_of


def summarise(status: model.TrainingRunStatus, *, queued: bool = False) -> model.Goodput | None:
    """`status.goodput` as of the newest time the status holds (see `total`); None before the first attempt."""
    found = total(status, queued=queued)
    if found is None:
        return None
    spent, as_of = found
    lost = spent.lost
    counted = spent.productive + sum(lost.model_dump().values())
    return model.Goodput(
        ratio=round(spent.productive / counted, 3) if counted > 0 else None,
        elapsed_seconds=round(counted, 1),
        productive_seconds=round(spent.productive, 1),
        queued_seconds=round(spent.queued, 1),
        lost_seconds=_each(lambda k: round(getattr(lost, k), 1), model.LostSeconds),
        restart_seconds=_each(lambda k: round(getattr(spent.restart, k), 1), model.RestartSeconds),
        as_of=timestamps.rfc3339(as_of, timespec="seconds"),
        earlier=status.goodput.earlier if status.goodput is not None else None,
    )


def _t(text: str | None) -> datetime.datetime | None:
    if text is None:
        return None
    try:
        return timestamps.parse(text)
    except ValueError:
        return None


def _s(a: datetime.datetime, b: datetime.datetime) -> float:
    """Seconds from a to b, never negative (clocks of the driver and the operator may disagree a little)."""
    return max(0.0, (b - a).total_seconds())


def keep(status: model.TrainingRunStatus, *, queued: bool = False) -> model.TrainingRunStatus:
    """`status` with the current attempt's first trained step kept (once its driver reported one) and
    `status.goodput` as of now (`summarise`): what every reconcile pass writes."""
    attempt = status.attempt
    if attempt is not None and attempt.end is None and attempt.first_step is None:
        first = seen(attempt, status.runtime, status.rate).first_step
        if first is not None:
            status = status.model_copy(update={"attempt": attempt.model_copy(update={"first_step": first})})
    found = summarise(status, queued=queued)
    return status if found is None or found == status.goodput else status.model_copy(update={"goodput": found})


def line(found: model.Goodput | None) -> str:
    """`goodput 0.931 (lost: start 30s, restart 40s; queued 5s)`, for a person; '' without a figure."""
    if found is None or found.ratio is None:
        return ""
    lost = found.lost_seconds.model_dump().items()
    said = ", ".join(f"{k} {v:.0f}s" for k, v in lost if v >= 1) or "nothing"
    queued = f"; queued {found.queued_seconds:.0f}s" if found.queued_seconds >= 1 else ""
    return f"goodput {found.ratio:.3f} (lost: {said}{queued})"
