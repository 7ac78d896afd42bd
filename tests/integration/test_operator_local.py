"""The local backend (local.py) with the real driver: `trainingrun run` on the shipped tiny example (shortened)
(`python -m trainingrun_runtime`: real Ray, TransferQueue, torch; no cluster, hence `integration`, not `e2e`).

- --chaos: the driver is killed at random; the run must resume from its recorded checkpoints and finish, and its
  status file must show every attempt and checkpoint.
- A frozen driver (SIGSTOP to the driver and to the controller actor that runs its train loop): the stall
  watchdog ends the attempt as Stalled and the next one resumes from the recorded checkpoint.
- `trainingrun run` SIGKILLed mid-training: no process of its attempt is left moments later (the driver's parent-
  death signal, Ray's own fate sharing, the reaper); the run directory is then moved back to the layout before the
  namespace level, and the same command run again moves it into place, resumes and finishes.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml

from support import waiting
from trainingrun_operator.localmode import driver_process, local, processes
from trainingrun_runtime import timestamps

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "tiny.yaml"


def trainingrun(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "trainingrun_operator.cli", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "120"}
    )


def start_trainingrun(*args: str, log: pathlib.Path) -> subprocess.Popen[bytes]:
    """`trainingrun ARGS` in the background, its output in `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "trainingrun_operator.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "120"},
        )


def shortened(tmp_path: pathlib.Path, *, steps: int, save_period: int, **restart_policy: Any) -> pathlib.Path:
    """The tiny example with fewer steps, another save period and `restart_policy` fields, as a file to run."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["trainer"]["steps"] = steps
    doc["spec"]["checkpoint"]["savePeriod"] = save_period
    doc["spec"]["restartPolicy"].update(restart_policy)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def read_json(path: pathlib.Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def attempt_processes(run_dir: pathlib.Path, attempt: int, supervisor: int) -> dict[int, str]:
    """pid -> command line of every process of a local attempt (the marker `local.LocalRun.spawn` gives them)."""
    found = {}
    for pid in processes.carrying(driver_process.MARKER_ENV, local.marker(run_dir, supervisor, attempt)):
        try:
            found[pid] = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def recorded_before_the_end(status_path: pathlib.Path, attempt: int, steps: int) -> int | None:
    """The step of a checkpoint that `attempt` recorded while it is still training (before step `steps`).

    Not "once a step past it is reported": a checkpoint report resets the driver's progress period, so when
    checkpoints come less than a period apart (a fast machine) the status never shows a step past the newest one.
    """
    status = read_json(status_path)
    latest = (status.get("checkpoints") or {}).get("latest") or {}
    runtime = status.get("runtime") or {}
    if latest.get("attempt") != attempt or runtime.get("attempt") != attempt or runtime.get("finished"):
        return None
    return int(latest["step"]) if int(latest["step"]) < steps else None


@pytest.mark.timeout(1500)
def test_trainingrun_run_with_chaos_resumes_from_recorded_checkpoints_and_finishes(tmp_path: pathlib.Path) -> None:
    steps = 40  # room for both of --chaos's kills, each a few seconds after a save (every 5 steps)
    run_file = shortened(tmp_path, steps=steps, save_period=5)
    result = trainingrun("run", str(run_file), "--root", str(tmp_path), "--chaos", "--chaos-seed", "3", timeout=1400)
    assert result.returncode == 0, result.stderr[-4000:]

    status = json.loads((tmp_path / "local" / "tiny" / "status.json").read_text())
    assert status["phase"] == "Succeeded"
    attempts = status["attempts"]
    assert len(attempts) >= 2, "--chaos killed at least one attempt"
    assert [a["reason"] for a in attempts[:-1]] == ["Preempted"] * (len(attempts) - 1)
    assert attempts[-1]["reason"] == "Succeeded"
    assert status["restarts"]["preempted"] == len(attempts) - 1
    assert status["restarts"]["applicationFailure"] == 0

    recorded = {c["step"] for c in status["checkpoints"]["history"]}
    for attempt in attempts[1:]:
        assert attempt["resumedFrom"] in recorded, f"attempt {attempt['number']} resumed from a recorded checkpoint"
    assert status["checkpoints"]["latest"]["step"] == steps
    # Written by the last attempt, or by the one before it when the kill came after its final save (the last one
    # then resumed from that step and had nothing left to train).
    latest_by = status["checkpoints"]["latest"]["attempt"]
    assert latest_by == attempts[-1]["number"] or attempts[-1]["resumedFrom"] == steps, (latest_by, attempts)
    assert (tmp_path / "local" / "tiny" / f"step_{steps}" / "manifest.json").is_file()
    assert (tmp_path / "local" / "tiny" / "reward.png").stat().st_size > 0
    events = [
        json.loads(line)["reason"] for line in (tmp_path / "local" / "tiny" / "events.jsonl").read_text().splitlines()
    ]
    assert "ChaosKill" in events and "Succeeded" in events

    again = trainingrun("run", str(run_file), "--root", str(tmp_path), timeout=120)
    assert again.returncode == 0 and "already succeeded" in again.stderr


@pytest.mark.timeout(1200)
def test_a_frozen_driver_is_ended_as_stalled_and_the_next_attempt_resumes_from_the_recorded_checkpoint(
    tmp_path: pathlib.Path,
) -> None:
    deadline = 20
    steps = 60  # long enough, at any speed, to freeze it before it ends
    run_file = shortened(tmp_path, steps=steps, save_period=5, progressDeadlineSeconds=deadline)
    root = tmp_path / "runs"
    supervisor = start_trainingrun("run", str(run_file), "--root", str(root), log=tmp_path / "trainingrun.log")
    run_dir = root / "local" / "tiny"

    def diagnostics() -> str:
        return (tmp_path / "trainingrun.log").read_text(errors="replace")[-4000:]

    try:
        waiting.wait(lambda: recorded_before_the_end(run_dir / "status.json", 1, steps), timeout=600,
                     what="attempt 1's recorded checkpoint before its last step", diagnostics=diagnostics)  # fmt: skip
        found = attempt_processes(run_dir, 1, supervisor.pid)
        frozen = [
            pid for pid, cmd in found.items() if "-m trainingrun_runtime" in cmd or "ray::SingleController" in cmd
        ]
        assert len(frozen) == 2, found  # the driver, and the controller actor that runs its train loop and reports
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        last = read_json(run_dir / "attempts" / "1" / "runtime.json")  # nothing writes it any more
        assert supervisor.wait(900) == 0, diagnostics()
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(30)

    status = read_json(run_dir / "status.json")
    assert status["phase"] == "Succeeded"
    first, *others = status["attempts"]
    assert first["reason"] == "Stalled", status["attempts"]
    assert f"its last report was step {last['step']} at" in first["message"], first
    assert f"progressDeadlineSeconds: {deadline}" in first["message"]
    assert [a["reason"] for a in others] == ["Succeeded"], status["attempts"]
    recorded_by_1 = max(c["step"] for c in status["checkpoints"]["history"] if c["attempt"] == 1)
    assert others[0]["resumedFrom"] == recorded_by_1, (others, status["checkpoints"])
    assert status["restarts"]["stalled"] == 1 and status["restarts"]["total"] == 1, status["restarts"]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    stalled = [e for e in events if e["reason"] == "Stalled"]
    assert len(stalled) == 1 and f"step {last['step']}" in stalled[0]["message"], events
    assert attempt_processes(run_dir, 1, supervisor.pid) == {}, "the frozen attempt's processes were killed"
    quiet = (timestamps.parse(first["end"]) - timestamps.parse(last["updated"])).total_seconds()
    assert deadline - 1 <= quiet < deadline + 10, f"ended {quiet:.1f}s after the last report"  # `end`: to the second
    print(
        f"\nFIGURES stall_deadline_s={deadline} stalled_after_last_report_s={quiet:.1f} "
        f"run_after_freeze_s={time.monotonic() - stopped_at:.1f}"
    )


@pytest.mark.timeout(1200)
def test_a_killed_trainingrun_takes_its_attempt_down_and_the_same_command_moves_an_older_layout_into_place_and_resumes(
    tmp_path: pathlib.Path,
) -> None:
    """SIGKILL `trainingrun run` mid-training: no process of its attempt is left moments later. The interrupted run is
    then left as an older version kept it (DIR/<run>/, before the namespace level): the same command moves it to
    DIR/local/<run>/ and resumes from its recorded checkpoint. (One run for both claims: the resume after the move is
    the resume after a killed supervisor.)"""
    steps = 40  # long enough, at any speed, to kill it before it ends
    run_file = shortened(tmp_path, steps=steps, save_period=5)
    root = tmp_path / "runs"
    run_dir = root / "local" / "tiny"
    supervisor = start_trainingrun("run", str(run_file), "--root", str(root), log=tmp_path / "first.log")
    try:
        waiting.wait(lambda: recorded_before_the_end(run_dir / "status.json", 1, steps), timeout=600,
                     what="attempt 1 training past a recorded checkpoint",
                     diagnostics=lambda: (tmp_path / "first.log").read_text(errors="replace")[-4000:])  # fmt: skip
        training = attempt_processes(run_dir, 1, supervisor.pid)
        assert any("-m trainingrun_runtime" in cmd for cmd in training.values()), training
        assert any("ray::SingleController" in cmd for cmd in training.values()), training
        supervisor.kill()  # SIGKILL: no finally, no atexit in the supervisor
        supervisor.wait(30)
        killed_at = time.monotonic()
        waiting.wait(
            lambda: attempt_processes(run_dir, 1, supervisor.pid) == {},
            timeout=15,
            what="no process of attempt 1 left",
            diagnostics=lambda: repr(attempt_processes(run_dir, 1, supervisor.pid)),
        )
        gone_after = time.monotonic() - killed_at
        trace = (run_dir / "attempts" / "1" / "events.jsonl").read_text()
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait(30)
    recorded = (read_json(run_dir / "status.json").get("checkpoints") or {}).get("latest") or {}
    os.rename(run_dir, root / "tiny")  # the old layout (the reaper, if it still runs, logs through its open file)
    (root / "local").rmdir()

    again = trainingrun("run", str(run_file), "--root", str(root), timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert f"moved the run directory {root / 'tiny'} (layout before the namespace level) to {run_dir}" in again.stderr
    assert not (root / "tiny").exists()
    status = read_json(run_dir / "status.json")
    first, second = status["attempts"]
    assert first["reason"] == "Preempted" and "SupervisorRestarted" in first["message"], first
    assert second["reason"] == "Succeeded" and second["resumedFrom"] >= recorded["step"] > 0, (second, recorded)
    assert status["checkpoints"]["latest"]["step"] == steps and status["checkpoints"]["latest"]["attempt"] == 2
    assert (run_dir / f"step_{steps}" / "manifest.json").is_file()
    assert (run_dir / "attempts" / "1" / "events.jsonl").read_text() == trace, "attempt 1 trained on after the kill"
    reaped = (run_dir / "reaper.log").read_text().strip()  # the first supervisor's reaper has finished by now
    print(f"\nFIGURES attempt_gone_after_supervisor_kill_s={gone_after:.2f} reaper_log={reaped!r}")
