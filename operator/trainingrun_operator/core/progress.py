"""What `kubectl get trun` and `kubectl describe trun` show about a run's progress. Pure.

Called by the decision core (`decision.py`) at the end of every pass, once the phase and the attempt records are
settled. Printer columns can only point at fields (JSONPath, no arithmetic), so what they show is written here
into fields of the status that the operator owns:

    status.progress      "63/120"   the step shown / spec.trainer.steps                     PROGRESS
    status.reward        0.812      the current attempt's newest reported reward, 3 decimals  REWARD  (-o wide)
    status.eta           "4m"       steps left at the recent rate, rounded (Running only)     ETA     (-o wide)
    status.rate          the report the rate was last measured at, and the rate (steps per second)
    status.attemptTable  one aligned line per attempt under a header: `kubectl describe` prints it as a table; an
                         ended attempt's LOST cell is its lost seconds by cause (`goodput`)

The step shown is the current attempt's newest reported step (`status.runtime.step`, fenced like every report:
only the current attempt's, and not once it ended unless it succeeded); without one, the newest recorded checkpoint
(where the next attempt resumes), else 0.

The rate. A measurement takes two of the driver's reports at least `RATE_WINDOW_SECONDS` apart by the driver's own
clock (`status.runtime.updated`): (steps between them) / (seconds between them), smoothed into the previous rate
(half each). A new attempt starts a new pair and keeps the old rate (same hardware) until it measures its own.

What keeps the status writes small: nothing here moves with the clock alone. The ETA is counted from the rate and
the step shown, not from `now`, and rounded (`duration`); the running attempt's line in the table says `running`,
not an age. So a pass that learns no new step writes nothing, and one that does writes a few short fields. The
operator's passes that follow the driver's steps are bounded by `wakeups.PROGRESS_REFRESH_SECONDS`.
"""

from __future__ import annotations

import datetime
import math

from trainingrun_operator.core import goodput, model
from trainingrun_operator.core.phases import Phase
from trainingrun_runtime import timestamps
from trainingrun_runtime.config import TrainerConfig

__all__ = [
    "MAX_TABLE_LINES",
    "RATE_WINDOW_SECONDS",
    "STALE_REPORT_SECONDS",
    "attempt_table",
    "duration",
    "summarise",
]

RATE_WINDOW_SECONDS = 30.0
"""The shortest span between two reports that measures a rate (shorter spans are mostly the noise of step times)."""
STALE_REPORT_SECONDS = 120.0
"""No ETA once the newest report is older than this: a driver that stopped reporting has no rate worth showing."""
SMOOTHING = 0.5
"""Weight of a new measurement against the previous rate."""
MAX_TABLE_LINES = 102
"""The header, the attempt history (at most decision.MAX_ATTEMPT_HISTORY) and the running attempt (the CRD's
maxItems)."""
_DEFAULT_STEPS: int = TrainerConfig.model_fields["steps"].default


def summarise(
    spec: model.TrainingRunSpec, status: model.TrainingRunStatus, now: datetime.datetime, *, in_queue: bool = False
) -> model.TrainingRunStatus:
    """`status` with its progress fields brought up to date (see the module docstring). `in_queue`: the run waits in a
    queue for its attempts."""
    report = _current_report(status)
    target = _target_steps(spec)
    step = _shown_step(status, report)
    rate = _measure(status.rate, report, status.attempt.number if status.attempt else 0)
    reward = status.reward
    if report is not None and report.reward is not None and math.isfinite(report.reward):
        reward = round(report.reward, 3)
    eta = None
    if status.phase == Phase.RUNNING.value and target is not None and step < target and _fresh(report, now):
        speed = rate.steps_per_second if rate is not None else None
        eta = duration((target - step) / speed) if speed else None
    return status.model_copy(
        update={
            "progress": f"{step}/{target}" if target is not None else str(step),
            "reward": reward,
            "eta": eta,
            "rate": rate,
            "attempt_table": attempt_table(status, in_queue=in_queue) or None,
        }
    )


def _current_report(status: model.TrainingRunStatus) -> model.RuntimeReport | None:
    """The driver's report if it is the current attempt's, and that attempt is running or succeeded."""
    report, attempt = status.runtime, status.attempt
    if report is None or attempt is None or report.attempt != attempt.number:
        return None
    if attempt.end is not None and attempt.reason != "Succeeded":
        return None
    return report


def _target_steps(spec: model.TrainingRunSpec) -> int | None:
    """spec.trainer.steps, or the runtime's default; None if it is no step count (the run fails anyway)."""
    steps = spec.trainer.get("steps", _DEFAULT_STEPS)
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else None


def _shown_step(status: model.TrainingRunStatus, report: model.RuntimeReport | None) -> int:
    if report is not None and report.step is not None:
        return report.step
    latest = status.checkpoints.latest if status.checkpoints else None
    return latest.step if latest is not None else 0


def _measure(
    previous: model.ProgressRate | None, report: model.RuntimeReport | None, attempt: int
) -> model.ProgressRate | None:
    """The rate after `report`: unchanged until the report is RATE_WINDOW_SECONDS past the last measured one."""
    if report is None or report.step is None or not report.updated:
        return previous
    try:
        when = timestamps.parse(report.updated)
    except ValueError:
        return previous
    sample = model.ProgressRate(attempt=attempt, step=report.step, time=report.updated)
    if previous is None:
        return sample
    kept = sample.model_copy(update={"steps_per_second": previous.steps_per_second})
    if previous.attempt != attempt or report.step < previous.step:
        return kept  # a new attempt: a new pair, the old rate
    try:
        elapsed = (when - timestamps.parse(previous.time)).total_seconds()
    except ValueError:
        return kept
    if elapsed < RATE_WINDOW_SECONDS:
        return previous
    measured = (report.step - previous.step) / elapsed
    old = previous.steps_per_second
    smoothed = measured if old is None else SMOOTHING * measured + (1 - SMOOTHING) * old
    return sample.model_copy(update={"steps_per_second": float(f"{smoothed:.3g}")})


def _fresh(report: model.RuntimeReport | None, now: datetime.datetime) -> bool:
    if report is None or not report.updated:
        return False
    try:
        return (now - timestamps.parse(report.updated)).total_seconds() <= STALE_REPORT_SECONDS
    except ValueError:
        return False


def duration(seconds: float) -> str:
    """A remaining time, rounded so that it changes rarely: `<1m`, `4m`, `2h35m` (5 min steps), `3d4h`."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "<1m"
    if minutes < 60:
        return f"{minutes}m"
    if minutes < 24 * 60:
        hours, rest = divmod(5 * round(minutes / 5), 60)
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    days, hours = divmod(round(minutes / 60), 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def _span(start: str | None, end: str | None) -> str:
    """How long an ended attempt ran, exactly (it never changes): `45s`, `5m12s`, `2h03m`, `1d04h`."""
    if start is None or end is None:
        return "-"
    try:
        return _exact((timestamps.parse(end) - timestamps.parse(start)).total_seconds())
    except ValueError:
        return "-"


def _exact(seconds: float) -> str:
    """`45s`, `5m12s`, `2h03m`, `1d04h`."""
    minutes, secs = divmod(max(0, int(seconds)), 60)
    hours, mins = divmod(minutes, 60)
    days, hrs = divmod(hours, 24)
    if days:
        return f"{days}d{hrs:02d}h"
    if hours:
        return f"{hours}h{mins:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


_HEADER = ("ATTEMPT", "STARTED", "RAN", "RESUMED-FROM", "ENDED-AS", "STEPS-LOST", "WORKERS-LOST", "LOST")


def _lost(spent: model.Spent | None) -> str:
    """An ended attempt's lost seconds by cause (`goodput`), e.g. `restart=40s,recompute=16s`; `-` for none."""
    if spent is None:
        return "-"
    causes = [(k, getattr(spent.lost, k)) for k in model.LostSeconds.model_fields]
    return ",".join(f"{k}={_exact(v)}" for k, v in causes if v >= 1) or "-"


def _row(record: model.AttemptRecord, queued: bool = False, spent: model.Spent | None = None) -> tuple[str, ...]:
    """One attempt's cells; the current one ran (or waits in a queue, `queued`) until now. `spent`: where an ended
    attempt's time went."""
    running = record.end is None

    def shown(value: int | str | None) -> str:
        return "-" if value is None else str(value)

    return (
        str(record.number),
        shown(record.start),
        ("queued" if queued else "running") if running else _span(record.start, record.end),
        shown(record.resumed_from) if record.resumed_from is not None else "fresh",
        "-" if running else shown(record.reason),
        "-" if running else shown(record.steps_lost),
        str(record.workers_lost or 0),
        "-" if running else _lost(spent),
    )


def attempt_table(status: model.TrainingRunStatus, *, in_queue: bool = False) -> list[str]:
    """Every attempt, oldest first, the running one last, as aligned lines under a header; [] before the first.
    `in_queue`: the run waits in a queue for its attempts (`goodput.attempt_spent`)."""
    records = list(status.attempts or [])
    current = status.attempt
    if current is not None and current.end is None:
        records.append(current)
    if not records:
        return []
    queued = status.phase == Phase.QUEUED.value
    shown = records[-(MAX_TABLE_LINES - 1) :]
    before = {r.number: r for r in records}

    def spent(r: model.AttemptRecord) -> model.Spent | None:
        if r.end is None or r.start is None or status.start_time is None:
            return None
        previous = before.get(r.number - 1)
        run_start = status.start_time if r.number == 1 else r.start  # an older attempt trimmed from the history
        return goodput.attempt_spent(r, previous, run_start=run_start, until=r.end, queued=in_queue)

    rows = [_HEADER, *(_row(r, queued and r is current, spent(r)) for r in shown)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
