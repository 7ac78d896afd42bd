"""The stall watchdog: whether a Running attempt's driver has stopped making progress, and when it would count as
stalled. Pure; `decision` builds the `Watch` of a Running attempt, `classification` applies it as its last rule
(a stall is what is left when nothing else explains the silence), and `decision` asks for its next pass at the
moment the deadline would pass (`Watch.left`): the driver's progress reports wake no one (`wakeups.PROGRESS_ONLY`).

    attempt Running ──(Ray start, restore, first step)──► report ──► report ── ... ──► report ──────────► now
    |<─────────── startupDeadlineSeconds ───────────>|                        |<─ progressDeadlineSeconds ─>|

- `spec.restartPolicy.progressDeadlineSeconds` unset or 0: no watchdog at all.
- Before the attempt's first report the bound is `startupDeadlineSeconds`, counted from the moment the attempt
  reached Running (`status.attempt.runningSince`; its `start` in a status written before that field existed): a
  slow start (Ray, the restore, the first rollouts) is not a stall. 0: no bound before the first report.
- After it, `progressDeadlineSeconds` from the last report (`status.runtime.updated`: the driver reports after a
  step, at most once a second, and after each checkpoint).
- An attempt that lost a worker pod gets at least `workerReplacementSeconds`: the driver itself waits that long for
  a generation worker before it gives up (GenerationLost, a preemption), and may train nothing meanwhile.

`updated` is written with the driver's clock and judged with the operator's: their skew counts against the
deadline (seconds, against a deadline of a minute or more).
"""

from __future__ import annotations

import dataclasses
import datetime

from trainingrun_operator.core import model
from trainingrun_runtime import timestamps

__all__ = ["Watch", "watch"]


@dataclasses.dataclass(frozen=True)
class Watch:
    """The deadlines that apply to one Running attempt, and what its driver last reported."""

    progress_seconds: float
    """The longest time between two reports (progressDeadlineSeconds, or workerReplacementSeconds if higher after a
    worker loss)."""
    startup_seconds: float
    """The longest time from Running to the first report (0: no bound)."""
    running_since: datetime.datetime
    step: int | None = None
    """The newest step this attempt's driver reported (None: no report yet)."""
    reported: datetime.datetime | None = None
    """When it last reported (`status.runtime.updated`), if it did."""
    raised_by_worker_loss: bool = False

    def verdict(self, now: datetime.datetime) -> str:
        """Why the attempt counts as stalled at `now`, or "" while it does not."""
        left = self.left(now)
        if left is None or left > 0:
            return ""
        if self.reported is None:
            waited = (now - self.running_since).total_seconds()
            return (
                f"the driver reported no step in the {waited:.0f}s since the attempt started running at "
                f"{_time(self.running_since)} (spec.restartPolicy.startupDeadlineSeconds: {self.startup_seconds:g})"
            )
        quiet = (now - self.reported).total_seconds()
        bound = f"spec.restartPolicy.progressDeadlineSeconds: {self.progress_seconds:g}"
        if self.raised_by_worker_loss:
            bound = f"spec.restartPolicy.workerReplacementSeconds: {self.progress_seconds:g}, after a worker loss"
        return (
            f"the driver reported no new step for {quiet:.0f}s: its last report was step {self.step} at "
            f"{_time(self.reported)} ({bound})"
        )

    def left(self, now: datetime.datetime) -> float | None:
        """Seconds until the deadline that applies now passes (0 once it has; None: no deadline applies)."""
        if self.reported is None:
            if not self.startup_seconds:
                return None
            due = self.running_since + datetime.timedelta(seconds=self.startup_seconds)
        else:
            due = self.reported + datetime.timedelta(seconds=self.progress_seconds)
        return max(0.0, (due - now).total_seconds())


def watch(
    policy: model.RestartPolicy, attempt: model.AttemptRecord, report: model.RuntimeReport | None
) -> Watch | None:
    """The Watch of the Running `attempt`, given the driver's last report (any attempt's; only this attempt's
    counts). None: no watchdog (progressDeadlineSeconds unset or 0), or no time the attempt started."""
    deadline = policy.progress_deadline_seconds or 0.0
    since = _parse(attempt.running_since) or _parse(attempt.start)
    if not deadline or since is None:
        return None
    raised = bool(attempt.workers_lost) and policy.worker_replacement_seconds > deadline
    mine = report if report is not None and report.attempt == attempt.number else None
    return Watch(
        progress_seconds=policy.worker_replacement_seconds if raised else deadline,
        startup_seconds=policy.startup_deadline_seconds,
        running_since=since,
        step=mine.step if mine else None,
        reported=_parse(mine.updated) if mine else None,
        raised_by_worker_loss=raised,
    )


def _parse(text: str | None) -> datetime.datetime | None:
    try:
        return timestamps.parse(text) if text else None
    except ValueError:
        return None


def _time(when: datetime.datetime) -> str:
    return timestamps.rfc3339(when, timespec="seconds")
