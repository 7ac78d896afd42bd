"""The local backend's own pieces: the chaos schedule, reward parsing, process tracking and the observation it
hands the decision core. (The whole loop with the real driver is tests/integration/test_operator_local.py.)

Processes here are plain `python -c` / `sleep` children: what is under test is how the supervisor sees and
kills processes, not training (which needs Ray, kept out of unit tests).
"""

from __future__ import annotations

import datetime
import os
import pathlib
import random
import subprocess
import sys

import pytest

from trainingrun_operator import driver_process, local, runfile
from trainingrun_operator.classification import Context, FailureClass, classify

RUNNING = Context(now=datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC), node_not_ready_seconds=60.0, running=True)


def spawn(tmp_path: pathlib.Path, code: str, marker: str = "test") -> driver_process.DriverProcess:
    """A stand-in driver running `code`, carrying `marker` as a real one does (`driver_process.spawn`)."""
    log = tmp_path / "driver.log"
    env = {**os.environ, driver_process.MARKER_ENV: marker}
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            [sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    return driver_process.DriverProcess(1, popen, log, marker)


def test_chaos_kills_only_after_the_attempt_saved_a_checkpoint_and_at_most_max_kills(tmp_path: pathlib.Path) -> None:
    proc = spawn(tmp_path, "import time; time.sleep(30)")
    try:
        chaos = local.Chaos(random.Random(0), max_kills=1, min_delay=1.0, max_delay=1.0)
        no_ckpt = {"attempt": 1, "lastCheckpoint": None}
        old_ckpt = {"attempt": 1, "lastCheckpoint": {"attempt": 0, "step": 5}}
        saved = {"attempt": 1, "lastCheckpoint": {"attempt": 1, "step": 10}}
        assert not chaos.tick(proc, no_ckpt, now=100.0)
        assert not chaos.tick(proc, old_ckpt, now=100.0), "a restored checkpoint is not progress of this attempt"
        assert not chaos.tick(proc, saved, now=100.0), "armed, not yet due"
        assert chaos.tick(proc, saved, now=101.5)
        assert not chaos.tick(proc, saved, now=200.0), "max_kills reached"
    finally:
        proc.kill("test")
        proc.popen.wait(10)


def test_rewards_are_read_per_attempt_from_the_driver_logs(tmp_path: pathlib.Path) -> None:
    for attempt, lines in {
        1: ["step 2: reward 0.250 loss 0.1", "noise"],
        2: ["(pid=1) step 4: reward 1e-3 loss 0"],
    }.items():
        path = tmp_path / "attempts" / str(attempt)
        path.mkdir(parents=True)
        (path / "driver.log").write_text("\n".join(lines))
    assert local.read_rewards(tmp_path) == {1: [(2, 0.25)], 2: [(4, 0.001)]}


@pytest.fixture
def tiny(tmp_path: pathlib.Path) -> local.LocalRun:
    repo = pathlib.Path(__file__).resolve().parents[3]
    run = runfile.load(repo / "manifests" / "examples" / "tiny.yaml")
    return local.LocalRun(run, tmp_path)


def test_a_chaos_killed_driver_is_observed_as_a_preempted_attempt(tiny: local.LocalRun, tmp_path: pathlib.Path) -> None:
    tiny.status = {"phase": "Running", "attempt": {"number": 1}}
    proc = spawn(tmp_path, "import time; time.sleep(30)")
    tiny.procs[1] = proc
    assert tiny.observe().pods[0].phase == "Running"
    proc.kill("ChaosKill")
    proc.popen.wait(10)
    observed = tiny.observe()
    assert observed.exit_code is None and observed.departed[0].disruption == "ChaosKill"
    outcome = classify(observed, RUNNING)
    assert outcome is not None and outcome.failure is FailureClass.PREEMPTED


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (0, None),
        (1, FailureClass.APPLICATION_FAILURE),
        (3, FailureClass.FAILED_RESTORE),
        (4, FailureClass.PREEMPTED),  # GenerationLost: no generation worker came back in time
    ],
)
def test_a_driver_that_exits_by_itself_is_classified_by_its_exit_code(
    tiny: local.LocalRun, tmp_path: pathlib.Path, code: int, expected: FailureClass | None
) -> None:
    tiny.status = {"phase": "Running", "attempt": {"number": 1}}
    last = {3: "RestoreFailed: x", 4: "GenerationLost: no generation worker for 300 s"}.get(code, "bye")
    proc = spawn(tmp_path, f"import sys; print({last!r}, file=sys.stderr); sys.exit({code})")
    tiny.procs[1] = proc
    proc.popen.wait(10)
    observed = tiny.observe()
    assert observed.exit_code == code and observed.pods == ()
    outcome = classify(observed, RUNNING)
    assert outcome is not None and outcome.failure is expected
    if code == 4:
        assert "GenerationLost" in observed.stderr_tail and "workerReplacementSeconds" in outcome.detail


def test_an_attempt_left_running_by_a_previous_supervisor_ends_as_preempted(tiny: local.LocalRun) -> None:
    tiny.status = {"phase": "Running", "attempt": {"number": 4}}
    observed = tiny.observe()
    outcome = classify(observed, RUNNING)
    assert outcome is not None and outcome.failure is FailureClass.PREEMPTED


def test_status_file_is_written_atomically_and_read_back_after_a_failure_as_a_new_try(tiny: local.LocalRun) -> None:
    tiny.status = {
        "phase": "Failed",
        "reason": "BudgetExhausted",
        "attempts": [{"number": 1}],
        "consecutiveFailures": 3,
    }
    tiny.save_status()
    assert not list(tiny.dir.glob("*.tmp"))
    tiny.load_status()
    assert tiny.status == {"attempts": [{"number": 1}]}


def test_a_rerun_kills_what_a_dead_supervisor_of_the_same_run_left_and_nothing_else(
    tiny: local.LocalRun, tmp_path: pathlib.Path
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(10)  # a supervisor pid that is no more
    orphan = spawn(tmp_path, "import time; time.sleep(60)", marker=local.marker(tiny.dir, gone.pid, 3))
    live = spawn(tmp_path, "import time; time.sleep(60)", marker=local.marker(tiny.dir, os.getppid(), 1))
    other_run = spawn(tmp_path, "import time; time.sleep(60)", marker=local.marker(tmp_path / "other", gone.pid, 1))
    try:
        assert tiny.sweep_orphans() == [orphan.pid]
        assert orphan.popen.wait(10) == -9
        assert live.popen.poll() is None and other_run.popen.poll() is None
    finally:
        for proc in (orphan, live, other_run):
            proc.kill("test")
            proc.popen.wait(10)
