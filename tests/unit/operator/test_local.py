"""The local backend's own pieces: the chaos schedule, reward parsing, process tracking and the observation it
hands the decision core. (The whole loop with the real driver is tests/integration/test_operator_local.py.)

Processes here are plain `python -c` / `sleep` children: what is under test is how the supervisor sees and
kills processes, not training (which needs Ray, kept out of unit tests).
"""

from __future__ import annotations

import datetime
import io
import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from support import waiting
from trainingrun_operator.core import decision
from trainingrun_operator.core.classification import Context, FailureClass, classify
from trainingrun_operator.localmode import driver_process, local, processes, runfile
from trainingrun_runtime import contract
from trainingrun_runtime.sdk import reporting

RUNNING = Context(now=datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC), node_not_ready_seconds=60.0, running=True)


def spawn(tmp_path: pathlib.Path, code: str, marker: str = "test") -> driver_process.DriverProcess:
    """A stand-in driver running `code`, carrying `marker` as a real one does (`driver_process.spawn`), once its
    marker shows in /proc (what a sweep reads)."""
    log = tmp_path / "driver.log"
    env = {**os.environ, driver_process.MARKER_ENV: marker}
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            [sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    waiting.wait(
        lambda: processes.marked(driver_process.MARKER_ENV).get(popen.pid) == marker or popen.poll() is not None,
        timeout=10,
        what=f"pid {popen.pid}'s marker in /proc",
    )
    return driver_process.DriverProcess(1, popen, log, marker)


def dead_pid() -> int:
    """A supervisor pid that is no more: past the kernel's largest, so no process can have it (an exited process's
    pid can be taken again while the test runs, on a machine busy starting processes)."""
    return int(pathlib.Path("/proc/sys/kernel/pid_max").read_text()) + 1


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


def test_the_supervisor_folds_in_the_report_the_drivers_file_reporter_wrote_for_the_current_attempt(
    tiny: local.LocalRun,
) -> None:
    def written(attempt: int, step: int) -> contract.RuntimeStatus:
        status = contract.RuntimeStatus(
            attempt=attempt, step=step, reward=0.5, updated="2025-01-01T00:00:00Z", lastCheckpoint=None,
            restoreError=None, finished=False, badCheckpoints=[],
        )  # fmt: skip
        reporting.FileReporter(tiny.namespace_root, tiny.name, attempt).report(status)  # the driver's --root
        return status

    written(1, 7)
    second = written(2, 3)
    tiny.status = {"phase": "Running", "attempt": {"number": 2}}
    tiny.fold_report()
    assert tiny.status[contract.REPORT_FIELD] == second


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


def test_a_pass_writes_its_events_to_the_event_log_and_the_console_with_their_wire_values(
    tiny: local.LocalRun,
) -> None:
    """Local mode's events say what the API server would keep: `Warning Preempted`, never `Reason.PREEMPTED`."""
    console = io.StringIO()
    tiny.console = console
    tiny.status = {"phase": "Running", "attempt": {"number": 4, "rayJobName": "tiny-4"}}
    tiny.step()  # the attempt's process is not this supervisor's: it ends as Preempted, the run is Restarting
    logged = [json.loads(line) for line in (tiny.dir / "events.jsonl").read_text().splitlines()]
    assert [(e["type"], e["reason"]) for e in logged] == [("Warning", "Preempted"), ("Normal", "Restarting")]
    lines = console.getvalue().splitlines()
    assert [line.split(" ", 1)[1].split(":", 1)[0] for line in lines] == ["Warning Preempted", "Normal  Restarting"]


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
    gone = dead_pid()
    orphan = spawn(tmp_path, "import time; time.sleep(60)", marker=local.marker(tiny.dir, gone, 3))
    live = spawn(tmp_path, "import time; time.sleep(60)", marker=local.marker(tiny.dir, os.getppid(), 1))
    other_run = spawn(tmp_path, "import time; time.sleep(60)", marker=local.marker(tmp_path / "other", gone, 1))
    try:
        assert tiny.sweep_orphans() == [orphan.pid]
        assert orphan.popen.wait(10) == -9
        assert live.popen.poll() is None and other_run.popen.poll() is None
    finally:
        for proc in (orphan, live, other_run):
            proc.kill("test")
            proc.popen.wait(10)


# ------------------------------------------------------------------ the layout: DIR/local/<run>/, and the old one


def old_run_dir(root: pathlib.Path, run: str, status: dict[str, object] | None = None) -> pathlib.Path:
    """DIR/<run>/ as the layout before the namespace level left it: a status file and a checkpoint."""
    run_dir = root / run
    (run_dir / "step_10").mkdir(parents=True)
    (run_dir / "step_10" / "manifest.json").write_text("{}")
    (run_dir / "status.json").write_text(json.dumps(status or {"phase": "Running", "attempts": [{"number": 1}]}))
    return run_dir


def test_a_run_keeps_its_files_under_the_local_namespace_and_the_driver_gets_that_root(
    tiny: local.LocalRun, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[driver_process.DriverArgs] = []

    def spawn_driver(
        args: driver_process.DriverArgs, log: pathlib.Path, *, marker: str, env: dict[str, str]
    ) -> driver_process.DriverProcess:
        assert env == {}  # no YAML file's directory to import a reward function from
        spawned.append(args)
        return driver_process.DriverProcess(args.attempt, subprocess.Popen(["true"]), log, marker)

    monkeypatch.setattr(driver_process, "spawn", spawn_driver)
    assert tiny.dir == tmp_path / "local" / "tiny"
    tiny.status = {"startTime": "t"}
    tiny.save_status()
    assert (tmp_path / "local" / "tiny" / "status.json").is_file()
    tiny.spawn(decision.CreateAttempt(number=1, ray_job_name="tiny-a1", resume=None))
    tiny.procs[1].popen.wait(10)
    (args,) = spawned
    assert (args.root, args.run) == (str(tmp_path / "local"), "tiny")


def test_an_old_layout_run_directory_is_moved_into_place_and_its_status_read_back(
    tiny: local.LocalRun, tmp_path: pathlib.Path
) -> None:
    old_run_dir(tmp_path, "tiny")
    console = io.StringIO()
    tiny.console = console
    tiny.adopt_old_layout()
    assert not (tmp_path / "tiny").exists()
    assert (tiny.dir / "step_10" / "manifest.json").is_file()
    assert console.getvalue() == (
        f"moved the run directory {tmp_path / 'tiny'} (layout before the namespace level) to {tiny.dir}\n"
    )
    tiny.load_status()
    assert tiny.status == {"phase": "Running", "attempts": [{"number": 1}]}


def test_an_already_succeeded_old_layout_run_is_found_by_trainingrun_run(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old_run_dir(tmp_path, "tiny", {"phase": "Succeeded"})
    repo = pathlib.Path(__file__).resolve().parents[3]
    assert local.run_file(repo / "manifests" / "examples" / "tiny.yaml", root=tmp_path) == 0
    err = capsys.readouterr().err
    assert f"to {tmp_path / 'local' / 'tiny'}" in err
    assert f"tiny already succeeded (see {tmp_path / 'local' / 'tiny' / 'status.json'})" in err


def test_an_old_layout_run_named_local_moves_aside_first_so_no_run_lands_inside_it(tmp_path: pathlib.Path) -> None:
    old_run_dir(tmp_path, "local", {"phase": "Succeeded"})
    old_run_dir(tmp_path, "tiny")
    moved = local.adopt_old_layout(tmp_path, "tiny")
    assert moved == [
        (tmp_path / "local", tmp_path / "local" / "local"),
        (tmp_path / "tiny", tmp_path / "local" / "tiny"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local"]
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["local", "tiny"]
    assert json.loads((tmp_path / "local" / "local" / "status.json").read_text()) == {"phase": "Succeeded"}
    assert (tmp_path / "local" / "tiny" / "step_10").is_dir()
    assert local.adopt_old_layout(tmp_path, "local") == [], "done once"


def test_a_move_of_the_run_named_local_cut_short_is_finished_by_the_next_start(tmp_path: pathlib.Path) -> None:
    old_run_dir(tmp_path, "local.moving")
    assert local.adopt_old_layout(tmp_path, "local") == [(tmp_path / "local", tmp_path / "local" / "local")]
    assert (tmp_path / "local" / "local" / "step_10").is_dir() and not (tmp_path / "local.moving").exists()


def test_a_directory_without_a_status_file_or_with_a_run_in_place_already_is_not_moved(tmp_path: pathlib.Path) -> None:
    (tmp_path / "other" / "step_3").mkdir(parents=True)
    old_run_dir(tmp_path, "tiny")
    (tmp_path / "local" / "tiny").mkdir(parents=True)
    assert local.adopt_old_layout(tmp_path, "other") == []
    assert local.adopt_old_layout(tmp_path, "tiny") == []
    assert (tmp_path / "other" / "step_3").is_dir() and (tmp_path / "tiny" / "step_10").is_dir()
    assert list((tmp_path / "local" / "tiny").iterdir()) == []


def test_a_rerun_also_kills_what_a_dead_supervisor_of_the_old_layout_left(
    tiny: local.LocalRun, tmp_path: pathlib.Path
) -> None:
    orphan = spawn(tmp_path, "import time; time.sleep(60)", marker=local.marker(tmp_path / "tiny", dead_pid(), 2))
    try:
        assert tiny.sweep_orphans() == [orphan.pid]
        assert orphan.popen.wait(10) == -9
    finally:
        orphan.kill("test")
        orphan.popen.wait(10)
