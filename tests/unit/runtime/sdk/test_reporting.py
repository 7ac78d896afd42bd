"""Reporting: progress reports (status.runtime.step at most once per period, in order, never blocking a step), the
file and Kubernetes reporters, and the operator's view of the run that the driver reads before retention."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from support.loop import settle
from trainingrun_runtime import contract, timestamps
from trainingrun_runtime.sdk import reporting


class Recorder:
    """Records each delivered status; `gate` (when set) holds delivery until the test opens it.

    `entered(n)` and `delivered(n)` wait (in a thread) until the n-th report has begun or been recorded.
    """

    def __init__(self) -> None:
        self.sent: list[contract.RuntimeStatus] = []
        self.gate: threading.Event | None = None
        self.fail_next = False
        self.calls = 0
        self._changed = threading.Condition()

    def report(self, status: contract.RuntimeStatus) -> None:
        with self._changed:
            self.calls += 1
            self._changed.notify_all()
        if self.gate is not None:
            self.gate.wait(5)
        with self._changed:
            try:
                if self.fail_next:
                    self.fail_next = False
                    raise OSError("disk full")
                self.sent.append(status)
            finally:
                self._changed.notify_all()

    def operator_view(self) -> reporting.OperatorView | None:
        return None

    async def entered(self, n: int) -> None:
        await asyncio.to_thread(self._wait, lambda: self.calls >= n)

    async def delivered(self, n: int, reports: reporting.ProgressReports) -> None:
        """The n-th report is recorded and `reports` has taken its return (its time, its next turn)."""
        await asyncio.to_thread(self._wait, lambda: len(self.sent) >= n)
        while reports.sending:
            await asyncio.sleep(0)
        await settle()

    def _wait(self, done: Callable[[], bool]) -> None:
        with self._changed:
            assert self._changed.wait_for(done, timeout=5), f"waited 5 s: {self.calls} calls, {len(self.sent)} sent"


class Clock:
    """Monotonic time that moves only when the test says so; `sleep` waits until it has moved far enough."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + seconds, woken))
        await woken

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        for deadline, woken in [sw for sw in self.sleepers if sw[0] <= self.now]:
            self.sleepers.remove((deadline, woken))
            woken.set_result(None)
        await settle()


class Training:
    """The controller's side: the newest finished step and the newest renamed checkpoint."""

    def __init__(self) -> None:
        self.step = 0
        self.checkpoint: int | None = None

    def status(self) -> contract.RuntimeStatus:
        last = (
            None
            if self.checkpoint is None
            else contract.CheckpointReport(
                step=self.checkpoint,
                path=f"/c/run/step_{self.checkpoint}",
                attempt=1,
                replayDigest="d",
                weightsSha256="w",
                time="t",
            )
        )
        return contract.RuntimeStatus(
            attempt=1,
            step=self.step,
            reward=None,
            updated=timestamps.now(),
            lastCheckpoint=last,
            restoreError=None,
            finished=False,
            badCheckpoints=[],
        )


def make(period: float) -> tuple[reporting.ProgressReports, Recorder, Training, Clock]:
    rec, training, clock = Recorder(), Training(), Clock()
    reports = reporting.ProgressReports(rec, training.status, period_s=period, clock=clock, sleep=clock.sleep)
    return reports, rec, training, clock


async def test_the_first_step_is_reported_at_once_and_a_burst_of_steps_once_more_after_the_period() -> None:
    reports, rec, training, clock = make(period=1.0)
    training.step = 1
    reports.step_done()
    await rec.delivered(1, reports)
    for step in (2, 3, 4):  # within the period: held back, then the newest one goes
        training.step = step
        reports.step_done()
        await clock.advance(0.2)
    assert [s["step"] for s in rec.sent] == [1]
    assert len(clock.sleepers) == 1, "the sender waits for the end of the period (the work ran)"
    await clock.advance(0.4)  # 1.0 s after the first report
    await rec.delivered(2, reports)
    assert [s["step"] for s in rec.sent] == [1, 4]


async def test_a_step_does_not_wait_for_a_slow_report_and_reports_never_overlap() -> None:
    reports, rec, training, _ = make(period=0.0)
    rec.gate = threading.Event()
    training.step = 1
    reports.step_done()
    await rec.entered(1)  # the report of step 1 is now blocked in its thread
    for step in (2, 3, 4):
        training.step = step
        reports.step_done()  # returns at once
    await settle()
    assert rec.calls == 1 and rec.sent == []  # no second report began while the first is in flight
    rec.gate.set()
    await rec.delivered(2, reports)
    await reports.drain()
    assert [s["step"] for s in rec.sent] == [1, 4]  # the steps finished meanwhile follow in one report


async def test_a_checkpoint_report_waits_for_the_progress_in_flight_and_carries_the_newest_state() -> None:
    reports, rec, training, _ = make(period=0.0)
    rec.gate = threading.Event()
    training.step = 9
    reports.step_done()
    await rec.entered(1)
    training.step, training.checkpoint = 11, 10  # step 10 renamed while training went on to 11
    done = asyncio.create_task(reports.checkpoint())
    await settle()
    assert not done.done() and rec.calls == 1, "the checkpoint report must queue behind the one in flight"
    rec.gate.set()
    await done
    await reports.drain()
    assert [(s["step"], s["lastCheckpoint"] and s["lastCheckpoint"]["step"]) for s in rec.sent] == [(9, None), (11, 10)]


async def test_drain_sends_nothing_new_and_waits_for_the_report_in_flight() -> None:
    reports, rec, training, clock = make(period=10.0)
    rec.gate = threading.Event()
    training.step = 1
    reports.step_done()
    await rec.entered(1)
    training.step = 2
    reports.step_done()  # would go out 10 s after the first
    draining = asyncio.create_task(reports.drain())
    await settle()
    assert not draining.done() and rec.calls == 1
    rec.gate.set()
    await asyncio.wait_for(draining, 5)
    await clock.advance(10.0)  # the period passes: nothing more goes out
    assert rec.calls == 1 and [s["step"] for s in rec.sent] == [1]


async def test_a_failing_report_is_logged_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    reports, rec, training, _ = make(period=0.0)
    rec.fail_next = True
    training.step = 1
    reports.step_done()
    await rec.entered(1)
    await reports.drain()
    training.step = 2
    await reports.checkpoint()
    assert [s["step"] for s in rec.sent] == [2]
    assert "status report at step 1 failed" in caplog.text


def test_a_negative_period_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="progress period must be >= 0"):
        reporting.ProgressReports(Recorder(), Training().status, period_s=-1)


def test_the_operator_view_pins_the_newest_recorded_step_not_marked_bad_and_knows_every_recorded_one() -> None:
    view = reporting.OperatorView.of(
        {
            "attempt": {"number": 3, "start": "t"},
            "checkpoints": {"latest": {"step": 30}, "history": [{"step": 10}, {"step": 20}, {"step": 30}], "bad": [30]},
        }
    )
    assert view == reporting.OperatorView(attempt=3, attempt_ended=False, pinned=20, recorded=frozenset({10, 20, 30}))
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
    status: dict[str, object], mine: int, ended: bool
) -> None:
    assert reporting.OperatorView.of(status).ended(mine) is ended


def test_the_file_reporter_reads_the_local_supervisors_status_and_nothing_when_there_is_none(tmp_path: Path) -> None:
    rep = reporting.FileReporter(tmp_path, "run", 2)
    assert rep.operator_view() == reporting.OperatorView(
        attempt=None, attempt_ended=False, pinned=None, supervised=False
    )
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "status.json").write_text(
        json.dumps({"attempt": {"number": 2}, "checkpoints": {"latest": {"step": 8}}})
    )
    assert rep.operator_view() == reporting.OperatorView(
        attempt=2, attempt_ended=False, pinned=8, recorded=frozenset({8})
    )
    (tmp_path / "run" / "status.json").write_text("{half")
    assert rep.operator_view() is None  # unreadable: the caller skips retention rather than guess


def _status(step: int) -> contract.RuntimeStatus:
    return contract.RuntimeStatus(
        attempt=2,
        step=step,
        reward=0.5,
        updated=timestamps.now(),
        lastCheckpoint=contract.CheckpointReport(
            step=step, path=f"/r/run/step_{step}", attempt=2, replayDigest="d", weightsSha256="w", time="t"
        ),
        restoreError=None,
        finished=False,
        badCheckpoints=[],
    )


def test_the_file_reporter_replaces_runtime_json_with_the_latest_status(tmp_path: Path) -> None:
    rep = reporting.build("file", root=str(tmp_path), run="run", namespace="ns", attempt=2)
    rep.report(_status(10))
    rep.report(_status(20))
    path = tmp_path / "run" / "attempts" / "2" / "runtime.json"
    assert json.loads(path.read_text())["lastCheckpoint"]["step"] == 20
    assert [p.name for p in path.parent.iterdir()] == ["runtime.json"]


def test_an_unknown_reporter_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown reporter"):
        reporting.build("carrier-pigeon", root=str(tmp_path), run="r", namespace="n", attempt=1)


def test_the_kubernetes_reporter_pickles_without_its_client() -> None:
    import pickle

    rep = reporting.KubernetesReporter("run", "ns", kubeconfig="/nowhere")
    rep._api = object()
    clone = pickle.loads(pickle.dumps(rep))
    assert clone._api is None and clone.kubeconfig == "/nowhere"
