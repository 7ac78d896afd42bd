"""What kubectl shows about progress: PROGRESS, REWARD and ETA, the rate behind the ETA, and the attempt table."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from trainingrun_operator.core import model, progress
from trainingrun_runtime import timestamps

T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
SPEC = model.TrainingRunSpec.model_validate(
    {
        "image": "runtime:1",
        "ray": {"head": {}},
        "trainer": {"steps": 120},
        "checkpoint": {"pvc": {"claimName": "c"}, "savePeriod": 10},
    }
)


def at(seconds: float) -> str:
    return timestamps.rfc3339(T0 + datetime.timedelta(seconds=seconds))


def status(phase: str = "Running", attempt: int = 1, **fields: Any) -> model.TrainingRunStatus:
    return model.TrainingRunStatus.model_validate(
        {"phase": phase, "attempt": {"number": attempt, "start": at(0)}, **fields}
    )


def reported(st: model.TrainingRunStatus, step: int, seconds: float, reward: float | None = None) -> Any:
    """`st` after the driver's report of `step` at T0 + `seconds` (its own attempt)."""
    number = st.attempt.number if st.attempt else 1
    report = model.RuntimeReport(attempt=number, step=step, reward=reward, updated=at(seconds))
    return st.model_copy(update={"runtime": report})


def summarise(st: model.TrainingRunStatus, seconds: float) -> model.TrainingRunStatus:
    return progress.summarise(SPEC, st, T0 + datetime.timedelta(seconds=seconds))


# ---------------------------------------------------------------------------------------------- PROGRESS


def test_a_run_before_its_first_report_shows_zero_of_the_steps_and_no_eta_reward_or_table() -> None:
    shown = summarise(model.TrainingRunStatus(phase="Pending"), 0)
    assert (shown.progress, shown.eta, shown.reward, shown.attempt_table) == ("0/120", None, None, None)


def test_the_steps_default_to_the_runtimes_default_when_the_trainer_does_not_say() -> None:
    spec = SPEC.model_copy(update={"trainer": {}})
    assert progress.summarise(spec, model.TrainingRunStatus(), T0).progress == "0/200"


@pytest.mark.parametrize("steps", [-5, "many", True])
def test_a_trainer_without_a_step_count_shows_the_step_alone(steps: object) -> None:
    spec = SPEC.model_copy(update={"trainer": {"steps": steps}})
    assert progress.summarise(spec, reported(status(), 7, 0), T0).progress == "7"


def test_the_current_attempts_report_gives_the_step_and_the_reward_to_three_decimals() -> None:
    shown = summarise(reported(status(), 63, 10, reward=0.81234567), 10)
    assert (shown.progress, shown.reward) == ("63/120", 0.812)


def test_a_stale_attempts_report_is_not_shown_the_recorded_checkpoint_is() -> None:
    st = status(attempt=2, checkpoints={"latest": {"step": 60, "path": "p", "attempt": 1, "time": at(0)}})
    stale = st.model_copy(update={"runtime": model.RuntimeReport(attempt=1, step=77, reward=0.9, updated=at(5))})
    shown = summarise(stale, 5)
    assert (shown.progress, shown.reward) == ("60/120", None)


def test_an_attempt_that_ended_shows_the_step_the_next_one_resumes_from() -> None:
    st = reported(status(phase="Restarting"), 63, 10, reward=0.5)
    ended = st.model_copy(update={"attempt": st.attempt.model_copy(update={"end": at(11), "reason": "Preempted"})})
    ended = ended.model_copy(
        update={
            "checkpoints": model.CheckpointsStatus.model_validate(
                {"latest": {"step": 60, "path": "p", "attempt": 1, "time": at(9)}}
            )
        }
    )
    assert summarise(ended, 12).progress == "60/120"


def test_a_succeeded_run_shows_every_step_done_and_no_eta() -> None:
    st = reported(status(phase="Succeeded"), 120, 100, reward=1.0)
    st = st.model_copy(update={"attempt": st.attempt.model_copy(update={"end": at(101), "reason": "Succeeded"})})
    st = st.model_copy(update={"rate": model.ProgressRate(attempt=1, step=100, time=at(60), steps_per_second=0.5)})
    shown = summarise(st, 101)
    assert (shown.progress, shown.eta, shown.reward) == ("120/120", None, 1.0)


# --------------------------------------------------------------------------------------------- the rate


def test_the_rate_is_measured_between_reports_at_least_the_window_apart_and_gives_the_eta() -> None:
    first = summarise(reported(status(), 10, 0), 0)
    assert first.rate == model.ProgressRate(attempt=1, step=10, time=at(0))
    assert first.eta is None, "one report measures no rate"
    soon = summarise(reported(first, 14, 20), 20)
    assert soon.rate == first.rate and soon.eta is None, "20 s is under the window: no measurement yet"
    later = summarise(reported(soon, 25, 30), 30)
    assert later.rate == model.ProgressRate(attempt=1, step=25, time=at(30), steps_per_second=0.5)
    assert later.eta == "3m"  # 95 steps at 0.5 per second: 190 s


def test_a_new_measurement_is_smoothed_into_the_previous_rate() -> None:
    st = status(rate={"attempt": 1, "step": 25, "time": at(30), "stepsPerSecond": 0.5})
    shown = summarise(reported(st, 55, 60), 60)  # 1 step per second over the last 30 s
    assert shown.rate is not None and shown.rate.steps_per_second == 0.75
    assert shown.eta == "1m"  # 65 steps at 0.75 per second: 87 s


def test_a_new_attempt_starts_a_new_pair_of_reports_and_keeps_the_old_rate_meanwhile() -> None:
    st = status(attempt=2, rate={"attempt": 1, "step": 63, "time": at(100), "stepsPerSecond": 0.5})
    shown = summarise(reported(st, 60, 200), 200)
    assert shown.rate == model.ProgressRate(attempt=2, step=60, time=at(200), steps_per_second=0.5)
    assert shown.eta == "2m"


@pytest.mark.parametrize("phase", ["Starting", "Restarting", "Suspended", "Failed"])
def test_only_a_running_run_has_an_eta(phase: str) -> None:
    st = status(phase=phase, rate={"attempt": 1, "step": 25, "time": at(0), "stepsPerSecond": 0.5})
    assert summarise(reported(st, 30, 10), 10).eta is None


def test_a_driver_silent_for_longer_than_the_staleness_bound_has_no_eta() -> None:
    st = reported(status(rate={"attempt": 1, "step": 25, "time": at(0), "stepsPerSecond": 0.5}), 30, 10)
    assert summarise(st, 10 + progress.STALE_REPORT_SECONDS).eta is not None
    assert summarise(st, 11 + progress.STALE_REPORT_SECONDS).eta is None


def test_nothing_shown_moves_with_the_clock_alone() -> None:
    st = reported(status(rate={"attempt": 1, "step": 25, "time": at(0), "stepsPerSecond": 0.5}), 30, 10)
    once = summarise(st, 10)
    assert summarise(once, 70) == once


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "<1m"),
        (29, "<1m"),
        (31, "1m"),
        (190, "3m"),
        (59 * 60, "59m"),
        (3600, "1h"),
        (2 * 3600 + 33 * 60, "2h35m"),
        (2 * 3600 + 32 * 60, "2h30m"),
        (23 * 3600 + 58 * 60, "24h"),
        (86400 + 4 * 3600 + 10 * 60, "1d4h"),
        (3 * 86400, "3d"),
    ],
)
def test_the_eta_is_rounded_so_that_it_changes_rarely(seconds: float, shown: str) -> None:
    assert progress.duration(seconds) == shown


# ------------------------------------------------------------------------------------ the attempt table


def test_the_attempt_table_has_a_header_one_aligned_line_per_attempt_with_its_lost_seconds_the_running_one_last() -> (
    None
):
    ended = {
        "number": 1,
        "start": at(0),
        "end": at(312),
        "reason": "Preempted",
        "stepsLost": 3,
        "workersLost": 0,
        "firstStep": at(30),
        "stepSeconds": 2.0,
    }
    second = {
        "number": 2,
        "start": at(400),
        "end": at(400 + 3 * 3600 + 4 * 60),
        "resumedFrom": 60,
        "reason": "ApplicationFailure",
        "stepsLost": 0,
        "workersLost": 1,
    }
    st = model.TrainingRunStatus.model_validate(
        {
            "phase": "Running",
            "startTime": at(0),
            "attempts": [ended, second],
            "attempt": {"number": 3, "start": at(20000), "resumedFrom": 120, "workersLost": 2},
        }
    )
    table = progress.attempt_table(st)
    assert [line.split() for line in table] == [
        ["ATTEMPT", "STARTED", "RAN", "RESUMED-FROM", "ENDED-AS", "STEPS-LOST", "WORKERS-LOST", "LOST"],
        ["1", at(0), "5m12s", "fresh", "Preempted", "3", "0", "start=30s,recompute=6s"],
        ["2", at(400), "3h04m", "60", "ApplicationFailure", "0", "1", "restart=3h05m"],  # never trained: all of it
        ["3", at(20000), "running", "120", "-", "-", "2", "-"],
    ]
    starts = {line.index(word) for line, word in zip(table, ["STARTED", at(0), at(400), at(20000)], strict=True)}
    assert len(starts) == 1, "every column starts at the same offset on every line"


def test_an_ended_attempt_is_listed_once() -> None:
    record = {"number": 1, "start": at(0), "end": at(45), "reason": "Succeeded", "workersLost": 0}
    st = model.TrainingRunStatus.model_validate({"phase": "Succeeded", "attempts": [record], "attempt": record})
    assert [line.split()[:3] for line in progress.attempt_table(st)[1:]] == [["1", at(0), "45s"]]


def test_the_table_is_bounded_by_the_crds_max_items() -> None:
    records = [{"number": n, "start": at(n), "end": at(n + 1), "reason": "Preempted"} for n in range(1, 101)]
    st = model.TrainingRunStatus.model_validate(
        {"phase": "Running", "attempts": records, "attempt": {"number": 101, "start": at(200)}}
    )
    table = progress.attempt_table(st)
    assert len(table) == progress.MAX_TABLE_LINES
    assert table[-1].split()[0] == "101"
