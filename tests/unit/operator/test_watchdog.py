"""The stall watchdog: which deadline applies to a Running attempt (start-up before the driver's first report,
progress after it, raised after a worker loss), when it passes and what the verdict says (table-driven, with an
injected clock)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from trainingrun_operator.core import model, watchdog

T0 = datetime.datetime(2025, 1, 1, 12, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def policy(**fields: Any) -> model.RestartPolicy:
    return model.RestartPolicy.model_validate({"progressDeadlineSeconds": 60, "startupDeadlineSeconds": 300, **fields})


def attempt(**fields: Any) -> model.AttemptRecord:
    return model.AttemptRecord.model_validate(
        {"number": 2, "start": stamp(-30), "runningSince": stamp(0), "workersLost": 0, **fields}
    )


def report(step: int, seconds: float, number: int = 2) -> model.RuntimeReport:
    return model.RuntimeReport(attempt=number, step=step, updated=stamp(seconds))


# (case, restartPolicy, attempt, status.runtime, now in seconds after Running, stalled?, seconds left or None)
TABLE: list[tuple[str, model.RestartPolicy, model.AttemptRecord, model.RuntimeReport | None, float, bool, Any]] = [
    ("no report yet, within the start-up bound", policy(), attempt(), None, 299, False, 1.0),
    ("no report yet, the start-up bound passed", policy(), attempt(), None, 300, True, 0.0),
    (
        "a report of the previous attempt counts as none",
        policy(),
        attempt(),
        report(40, 250, number=1),
        299,
        False,
        1.0,
    ),
    (
        "the start-up bound off: no verdict before the first report",
        policy(startupDeadlineSeconds=0),
        attempt(),
        None,
        10_000,
        False,
        None,
    ),
    ("reported, within the progress deadline", policy(), attempt(), report(12, 100), 159, False, 1.0),
    ("reported, the progress deadline passed", policy(), attempt(), report(12, 100), 160, True, 0.0),
    ("a fresh report moves the deadline", policy(), attempt(), report(13, 150), 160, False, 50.0),
    ("a report ends the start-up bound even past it", policy(), attempt(), report(1, 400), 401, False, 59.0),
    (
        "a worker loss raises the deadline to workerReplacementSeconds",
        policy(workerReplacementSeconds=300),
        attempt(workersLost=1),
        report(12, 100),
        399,
        False,
        1.0,
    ),
    (
        "... and it passes too",
        policy(workerReplacementSeconds=300),
        attempt(workersLost=1),
        report(12, 100),
        400,
        True,
        0.0,
    ),
    (
        "a worker bound below the deadline changes nothing",
        policy(workerReplacementSeconds=10),
        attempt(workersLost=1),
        report(12, 100),
        160,
        True,
        0.0,
    ),
    (
        "no runningSince (an older status): counted from the start",
        policy(),
        attempt(runningSince=None),
        None,
        270,
        True,
        0.0,
    ),
]


@pytest.mark.parametrize(
    ("case", "restart_policy", "record", "runtime", "now", "stalled", "left"), TABLE, ids=[t[0] for t in TABLE]
)
def test_the_deadline_that_applies_and_when_it_passes(
    case: str,
    restart_policy: model.RestartPolicy,
    record: model.AttemptRecord,
    runtime: model.RuntimeReport | None,
    now: float,
    stalled: bool,
    left: float | None,
) -> None:
    watch = watchdog.watch(restart_policy, record, runtime)
    assert watch is not None, case
    assert bool(watch.verdict(at(now))) is stalled, case
    assert watch.left(at(now)) == (None if left is None else pytest.approx(left)), case


@pytest.mark.parametrize("deadline", [None, 0])
def test_no_deadline_means_no_watchdog(deadline: float | None) -> None:
    assert watchdog.watch(policy(progressDeadlineSeconds=deadline), attempt(), report(3, 0)) is None


def test_a_stall_names_the_last_step_when_it_was_reported_and_the_deadline() -> None:
    watch = watchdog.watch(policy(), attempt(), report(37, 100.25))
    assert watch is not None
    assert watch.verdict(at(175)) == (
        "the driver reported no new step for 75s: its last report was step 37 at 2025-01-01T12:01:40Z "
        "(spec.restartPolicy.progressDeadlineSeconds: 60)"
    )


def test_a_slow_start_names_when_the_attempt_started_running_and_the_start_up_bound() -> None:
    watch = watchdog.watch(policy(), attempt(), None)
    assert watch is not None
    assert watch.verdict(at(301)) == (
        "the driver reported no step in the 301s since the attempt started running at 2025-01-01T12:00:00Z "
        "(spec.restartPolicy.startupDeadlineSeconds: 300)"
    )


def test_after_a_worker_loss_the_verdict_names_the_raised_bound() -> None:
    watch = watchdog.watch(policy(workerReplacementSeconds=300), attempt(workersLost=2), report(5, 0))
    assert watch is not None
    assert "(spec.restartPolicy.workerReplacementSeconds: 300, after a worker loss)" in watch.verdict(at(300))


def test_an_unreadable_report_time_counts_as_no_report() -> None:
    watch = watchdog.watch(policy(), attempt(), model.RuntimeReport(attempt=2, step=4, updated="yesterday"))
    assert watch is not None and watch.reported is None and watch.left(at(0)) == pytest.approx(300)
