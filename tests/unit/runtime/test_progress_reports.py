"""Progress reports (status.runtime.step at most once per period, in order, never blocking a step) and the
operator's view of the run that the driver reads before retention."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from trainingrun_runtime import timestamps
from trainingrun_runtime.driver import reporting


class Recorder:
    """Records each delivered status; `gate` (when set) holds delivery until the test opens it."""

    def __init__(self) -> None:
        self.sent: list[reporting.RuntimeStatus] = []
        self.gate: threading.Event | None = None
        self.fail_next = False

    def report(self, status: reporting.RuntimeStatus) -> None:
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        self.sent.append(status)


class Training:
    """The controller's side: the newest finished step and the newest renamed checkpoint."""

    def __init__(self) -> None:
        self.step = 0
        self.checkpoint: int | None = None

    def status(self) -> reporting.RuntimeStatus:
        last = None if self.checkpoint is None else reporting.CheckpointReport(
            step=self.checkpoint, path=f"/c/run/step_{self.checkpoint}", attempt=1, replayDigest="d",
            weightsSha256="w", time="t")
        return reporting.RuntimeStatus(attempt=1, step=self.step, reward=None, updated=timestamps.now(),
                                      lastCheckpoint=last, restoreError=None, finished=False)


def make(period: float) -> tuple[reporting.ProgressReports, Recorder, Training]:
    rec, training = Recorder(), Training()
    return reporting.ProgressReports(rec, training.status, period_s=period), rec, training


async def test_the_first_step_is_reported_at_once_and_a_burst_of_steps_once_more_after_the_period() -> None:
    reports, rec, training = make(period=1.0)
    training.step = 1
    reports.step_done()
    await asyncio.sleep(0.1)
    assert [s["step"] for s in rec.sent] == [1]
    for step in (2, 3, 4):  # within the period: held back, then the newest one goes
        training.step = step
        reports.step_done()
        await asyncio.sleep(0.02)
    assert [s["step"] for s in rec.sent] == [1]
    await asyncio.sleep(1.2)
    assert [s["step"] for s in rec.sent] == [1, 4]


async def test_a_step_does_not_wait_for_a_slow_report_and_reports_never_overlap() -> None:
    reports, rec, training = make(period=0.0)
    rec.gate = threading.Event()
    training.step = 1
    reports.step_done()
    await asyncio.sleep(0.05)  # the report of step 1 is now blocked in its thread
    for step in (2, 3, 4):
        training.step = step
        reports.step_done()  # returns at once
    assert rec.sent == []
    rec.gate.set()
    await asyncio.sleep(0.1)
    await reports.drain()
    assert [s["step"] for s in rec.sent] == [1, 4]  # the steps finished meanwhile follow in one report


async def test_a_checkpoint_report_waits_for_the_progress_in_flight_and_carries_the_newest_state() -> None:
    reports, rec, training = make(period=0.0)
    rec.gate = threading.Event()
    training.step = 9
    reports.step_done()
    await asyncio.sleep(0.05)
    training.step, training.checkpoint = 11, 10  # step 10 renamed while training went on to 11
    done = asyncio.create_task(reports.checkpoint())
    await asyncio.sleep(0.05)
    assert not done.done(), "the checkpoint report must queue behind the one in flight"
    rec.gate.set()
    await done
    await reports.drain()
    assert [(s["step"], s["lastCheckpoint"] and s["lastCheckpoint"]["step"]) for s in rec.sent] == [(9, None), (11, 10)]


async def test_drain_sends_nothing_new_and_waits_for_the_report_in_flight() -> None:
    reports, rec, training = make(period=10.0)
    rec.gate = threading.Event()
    training.step = 1
    reports.step_done()
    await asyncio.sleep(0.05)
    training.step = 2
    reports.step_done()  # would go out in 10 s
    draining = asyncio.create_task(reports.drain())
    await asyncio.sleep(0.05)
    assert not draining.done()
    rec.gate.set()
    await asyncio.wait_for(draining, 2)
    assert [s["step"] for s in rec.sent] == [1]


async def test_a_failing_report_is_logged_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    reports, rec, training = make(period=0.0)
    rec.fail_next = True
    training.step = 1
    reports.step_done()
    await asyncio.sleep(0.05)
    training.step = 2
    await reports.checkpoint()
    assert [s["step"] for s in rec.sent] == [2]
    assert "status report at step 1 failed" in caplog.text


def test_a_negative_period_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="progress period must be >= 0"):
        reporting.ProgressReports(Recorder(), Training().status, period_s=-1)


def test_the_operator_view_pins_the_newest_recorded_step_not_marked_bad() -> None:
    view = reporting.OperatorView.of({
        "attempt": {"number": 3, "start": "t"},
        "checkpoints": {"latest": {"step": 30}, "history": [{"step": 10}, {"step": 20}, {"step": 30}], "bad": [30]},
    })
    assert view == reporting.OperatorView(attempt=3, attempt_ended=False, pinned=20)
    assert reporting.OperatorView.of({}) == reporting.OperatorView(attempt=None, attempt_ended=False, pinned=None)


@pytest.mark.parametrize(
    ("status", "mine", "ended"),
    [
        ({"attempt": {"number": 2}}, 2, False),
        ({"attempt": {"number": 2, "end": "t"}}, 2, True),
        ({"attempt": {"number": 3}}, 2, True),
        ({"attempt": {"number": 1}}, 2, False),  # the operator's status lags: not a reason to stop
        ({}, 2, False),
    ],
)
def test_an_attempt_has_ended_once_the_operator_ended_it_or_moved_past_it(
        status: dict[str, object], mine: int, ended: bool) -> None:
    assert reporting.OperatorView.of(status).ended(mine) is ended


def test_the_file_reporter_reads_the_local_supervisors_status_and_nothing_when_there_is_none(tmp_path: Path) -> None:
    rep = reporting.FileReporter(tmp_path, "run", 2)
    assert rep.operator_view() == reporting.OperatorView(attempt=None, attempt_ended=False, pinned=None)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "status.json").write_text(json.dumps({"attempt": {"number": 2}, "checkpoints": {"latest": {"step": 8}}}))
    assert rep.operator_view() == reporting.OperatorView(attempt=2, attempt_ended=False, pinned=8)
    (tmp_path / "run" / "status.json").write_text("{half")
    assert rep.operator_view() is None  # unreadable: the caller skips retention rather than guess
