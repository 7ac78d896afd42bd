"""Goodput from journeys with known costs: each cause where the journey caused it, and the pieces tile the run.

Times are seconds after T0; a step takes 1 s unless said."""

from __future__ import annotations

import datetime

import pytest

from support.decisions import T0 as D0
from support.decisions import Store, failed, running, start_and_run
from trainingrun_operator.core import goodput, model
from trainingrun_runtime import timestamps

T0 = datetime.datetime(2026, 12, 7, 10, 0, 0, tzinfo=datetime.UTC)


def at(seconds: float | None) -> str | None:
    return None if seconds is None else timestamps.rfc3339(T0 + datetime.timedelta(seconds=seconds))


def attempt(
    number: int,
    start: float,
    *,
    running: float | None = None,
    first: float | None = None,
    end: float | None = None,
    reason: str | None = None,
    steps_lost: int | None = None,
    step_seconds: float | None = 1.0,
    checkpoint: float | None = None,
    last_report: float | None = None,
    admitted: float | None = None,
    resumed_from: int | None = None,
) -> model.AttemptRecord:
    return model.AttemptRecord(
        number=number, start=at(start), running_since=at(running), first_step=at(first), end=at(end), reason=reason,
        steps_lost=steps_lost, step_seconds=step_seconds, checkpoint_seconds=checkpoint, last_report=at(last_report),
        admitted=at(admitted), resumed_from=resumed_from,
    )  # fmt: skip


def run(*attempts: model.AttemptRecord, **status: object) -> model.TrainingRunStatus:
    """A run whose attempts are these, the last one current, as the operator keeps it: the ended ones in the
    history, and each one's time folded into `goodput.earlier` when the next one started (`goodput.total`)."""
    earlier: model.Spent | None = None
    for i, current in enumerate(attempts):
        ended = [a for a in attempts[: i + 1] if a.end is not None]
        built = model.TrainingRunStatus(
            start_time=attempts[0].start, attempt=current, attempts=ended or None,
            goodput=None if earlier is None else model.Goodput(earlier=earlier), **status,
        )  # fmt: skip
        if i + 1 < len(attempts):
            folded = goodput.total(built)
            assert folded is not None
            earlier = folded[0]
    return built


def summary(status: model.TrainingRunStatus, *, queued: bool = False) -> model.Goodput:
    found = goodput.summarise(status, queued=queued)
    assert found is not None
    return found


def tiles(g: model.Goodput, status: model.TrainingRunStatus) -> None:
    """elapsed + queued is the run's start to asOf: every second is in one piece."""
    assert g.as_of is not None and status.start_time is not None
    whole = (timestamps.parse(g.as_of) - timestamps.parse(status.start_time)).total_seconds()
    assert g.elapsed_seconds + g.queued_seconds == pytest.approx(whole, abs=0.2)


def test_an_undisturbed_run_loses_only_its_start_and_its_saves() -> None:
    status = run(attempt(1, 0, running=20, first=30, end=130, reason="Succeeded", checkpoint=5, last_report=130))
    g = summary(status)
    assert g.lost_seconds == model.LostSeconds(start=30, checkpoint=5)
    assert (g.productive_seconds, g.elapsed_seconds, g.ratio) == (95, 130, round(95 / 130, 3))
    tiles(g, status)


def test_a_preemption_with_notice_costs_the_restart_split_by_part_and_recomputes_nothing() -> None:
    status = run(
        attempt(1, 0, running=20, first=30, end=100, reason="Preempted", steps_lost=0, last_report=99),
        attempt(2, 105, running=125, first=140, end=200, reason="Succeeded", last_report=200, resumed_from=70),
    )
    g = summary(status)
    assert g.lost_seconds == model.LostSeconds(start=30, restart=40)
    assert g.restart_seconds == model.RestartSeconds(operator=5, cluster=20, driver=15)
    assert g.productive_seconds == 70 + 60
    tiles(g, status)


def test_a_kill_recomputes_the_steps_past_the_checkpoint_at_the_step_time_before_the_loss() -> None:
    status = run(
        attempt(1, 0, running=10, first=20, end=100, reason="InfrastructureFailure", steps_lost=8, step_seconds=2.0),
        attempt(2, 101, running=111, first=121, resumed_from=32, last_report=161),
    )
    g = summary(status)
    assert g.lost_seconds.recompute == 16
    assert g.lost_seconds.restart == 21
    assert g.productive_seconds == (80 - 16) + 40
    assert g.as_of is not None and timestamps.parse(g.as_of) == T0 + datetime.timedelta(seconds=161)
    tiles(g, status)


def test_a_stall_costs_its_last_report_to_its_detection_and_the_steps_it_lost() -> None:
    status = run(
        attempt(1, 0, running=10, first=20, end=200, reason="Stalled", steps_lost=3, last_report=80),
        attempt(2, 200, running=210, first=220, end=300, reason="Succeeded", last_report=300),
    )
    g = summary(status)
    assert (g.lost_seconds.stall, g.lost_seconds.recompute, g.lost_seconds.restart) == (120, 3, 20)
    assert g.productive_seconds == (180 - 120 - 3) + 80
    tiles(g, status)


def test_a_queue_wait_is_reported_apart_and_does_not_lower_the_ratio() -> None:
    waited = run(attempt(1, 0, admitted=50, running=60, first=70, end=170, reason="Succeeded", last_report=170))
    straight = run(attempt(1, 0, running=10, first=20, end=120, reason="Succeeded", last_report=120))
    g, h = summary(waited, queued=True), summary(straight)
    assert (g.queued_seconds, g.lost_seconds.start, g.ratio) == (50, 20, h.ratio)
    tiles(g, waited)


def test_an_attempt_suspended_before_its_admission_has_only_waited() -> None:
    status = run(attempt(1, 0, end=300, reason="Suspended"))
    g = summary(status, queued=True)
    assert (g.queued_seconds, g.elapsed_seconds, g.ratio) == (300, 0, None)
    tiles(g, status)


def test_a_suspension_between_attempts_is_queued_time_and_the_resume_a_restart() -> None:
    status = run(
        attempt(1, 0, running=10, first=20, end=100, reason="Suspended", steps_lost=0, last_report=100),
        attempt(2, 400, running=410, first=430, last_report=500),
    )
    g = summary(status)
    assert (g.queued_seconds, g.lost_seconds.restart, g.restart_seconds.operator) == (300, 30, 0)
    tiles(g, status)


def test_an_attempt_that_never_trained_spends_all_its_time_restarting() -> None:
    status = run(
        attempt(1, 0, running=10, first=20, end=100, reason="Preempted", steps_lost=0, last_report=100),
        attempt(2, 110, running=150, end=400, reason="FailedRestore"),
        attempt(3, 410, running=420, first=440, last_report=540),
    )
    g = summary(status)
    assert g.lost_seconds.restart == (400 - 100) + (440 - 400)
    assert g.productive_seconds == 80 + 100
    tiles(g, status)


def test_earlier_attempts_are_folded_so_a_trimmed_history_loses_nothing() -> None:
    first = run(
        attempt(1, 0, running=10, first=20, end=100, reason="InfrastructureFailure", steps_lost=5, last_report=95)
    )
    folded = goodput.total(first)
    assert folded is not None
    second = attempt(2, 110, running=120, first=130, last_report=230, resumed_from=70)
    trimmed = model.TrainingRunStatus(  # the history no longer holds attempt 1, only the fold does
        start_time=at(0), attempt=second, goodput=model.Goodput(earlier=folded[0])
    )
    full = run(first.attempt or second, second)
    assert summary(trimmed).productive_seconds == summary(full).productive_seconds == (80 - 5) + 100
    assert summary(trimmed).lost_seconds.recompute == 5


def test_the_figure_moves_with_the_drivers_reports_and_not_with_the_clock() -> None:
    running = attempt(1, 0, running=10)
    report = model.RuntimeReport(attempt=1, step=40, updated=at(60), checkpoint_seconds=2.0)
    rate = model.ProgressRate(attempt=1, step=40, time=at(60) or "", steps_per_second=0.5)
    g = summary(run(running, runtime=report, rate=rate))
    assert g.as_of is not None and timestamps.parse(g.as_of) == T0 + datetime.timedelta(seconds=60)
    assert (g.lost_seconds.start, g.lost_seconds.checkpoint, g.productive_seconds) == (60, 0, 0)  # first report seen
    later = model.RuntimeReport(attempt=1, step=60, updated=at(100), checkpoint_seconds=3.0)
    seen = goodput.seen(running.model_copy(update={"first_step": at(60)}), later, rate)
    assert (seen.last_report, seen.checkpoint_seconds, seen.step_seconds) == (at(100), 3.0, 2.0)


def test_an_attempt_ended_before_the_rate_is_measured_takes_its_step_time_from_its_own_reports() -> None:
    running = attempt(1, 0, running=10, first=20, step_seconds=None)
    started = model.ProgressRate(attempt=1, step=100, time=at(20) or "")  # the pair's first report, no rate yet
    later = model.RuntimeReport(attempt=1, step=300, updated=at(24))
    assert goodput.seen(running, later, started).step_seconds == 0.02  # 4 s for 200 steps
    same = model.RuntimeReport(attempt=1, step=100, updated=at(20))
    assert goodput.seen(running, same, started).step_seconds is None, "no step since the pair began: no time"
    instant = model.RuntimeReport(attempt=1, step=104, updated=at(20))
    assert goodput.seen(running, instant, started).step_seconds is None, "no time passed: no step time, not 0"
    elsewhere = started.model_copy(update={"attempt": 2})
    assert goodput.seen(running, later, elsewhere).step_seconds is None, "another attempt's steps are not these"
    measured = started.model_copy(update={"steps_per_second": 25.0})
    assert goodput.seen(running, later, measured).step_seconds == 0.04, "a measured rate comes first"
    lost = summary(run(goodput.seen(running, later, started).model_copy(
        update={"end": at(25), "reason": "Preempted", "steps_lost": 50}
    ))).lost_seconds  # fmt: skip
    assert lost.recompute == 1.0  # 50 steps at 0.02 s


def test_only_a_report_of_this_attempt_past_its_resume_point_is_its_first_step() -> None:
    resumed = attempt(2, 100, running=110, resumed_from=40)
    assert goodput.seen(resumed, model.RuntimeReport(attempt=2, step=40, updated=at(120)), None).first_step is None
    assert goodput.seen(resumed, model.RuntimeReport(attempt=1, step=45, updated=at(120)), None).first_step is None
    broken = model.RuntimeReport(attempt=2, step=41, updated=at(120), restore_error="RestoreFailed: torn")
    assert goodput.seen(resumed, broken, None).first_step is None
    assert goodput.seen(resumed, model.RuntimeReport(attempt=2, step=41, updated=at(121)), None).first_step == at(121)


def test_the_line_for_a_person_names_each_cause_that_cost_a_second_and_the_queue_apart() -> None:
    status = run(
        attempt(1, 0, admitted=5, running=15, first=30, end=100, reason="Preempted", steps_lost=0, last_report=99),
        attempt(2, 105, running=125, first=140, end=200, reason="Succeeded", last_report=200, checkpoint=0.4),
    )
    said = goodput.line(summary(status, queued=True))
    assert said == "goodput 0.665 (lost: start 25s, restart 40s; queued 5s)"  # 129.6 of 195 s; 0.4 s saving
    assert goodput.line(None) == ""


def test_the_decision_core_keeps_the_first_step_the_ended_attempts_figures_and_the_fold_through_a_kill() -> None:
    """Through `decision.decide`: attempt 1 trains from 0:10 to 1:40 (step 50, checkpoint 40), is killed at 1:41;
    attempt 2 starts at once and trains from 2:00."""
    store = Store()
    start_and_run(store)

    def when(seconds: float) -> str:
        return timestamps.rfc3339(D0 + datetime.timedelta(seconds=seconds))

    def report(attempt: int, step: int, at_s: float, *, checkpoint: int) -> None:
        store.report(attempt, checkpoint, updated=when(at_s), checkpointSeconds=0.5)
        store.status["runtime"]["step"] = step
        store.now = D0 + datetime.timedelta(seconds=at_s)
        store.decide(running(attempt))

    report(1, 1, 10, checkpoint=1)
    report(1, 50, 100, checkpoint=40)
    store.status["rate"] = {"attempt": 1, "step": 50, "time": when(100), "stepsPerSecond": 0.5}
    store.now = D0 + datetime.timedelta(seconds=101)
    store.decide(failed(1))
    ended = store.status["attempt"]
    assert (ended["firstStep"], ended["lastReport"], ended["stepSeconds"], ended["checkpointSeconds"]) == (
        when(10), when(100), 2.0, 0.5
    )  # fmt: skip
    store.now = D0 + datetime.timedelta(seconds=111)  # the failure's backoff, then attempt 2
    start_and_run(store)
    assert store.status["goodput"]["earlier"]["lost"]["recompute"] == 20.0  # 10 steps past step 40, 2 s each
    report(2, 41, 120, checkpoint=40)
    g = store.status["goodput"]
    assert g["lostSeconds"]["start"] == 10.0
    assert g["lostSeconds"]["restart"] == 120 - 101
    assert g["lostSeconds"]["recompute"] == 20.0
    assert g["productiveSeconds"] == pytest.approx((101 - 10) - 20 - 0.5)  # first step to the end, less the losses
    assert g["asOf"] == "2025-01-01T00:02:00Z"
