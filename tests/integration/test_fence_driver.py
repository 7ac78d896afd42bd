"""The run directory's owner on a real driver: once a newer attempt claims the directory, the old driver stops.

This is what a partitioned node's zombie meets when the next attempt's driver starts: its next save is
refused before it begins, it writes no further checkpoint and exits 1 naming the owner.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from support import bundles, launcher, waiting
from trainingrun_runtime.storage import fence, layout, verification

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": 60,
        "promptsPerStep": 4,
        "generationWorkers": 1,
        "logEvery": 1,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 64},
    },
    "checkpoint": {"savePeriod": 2, "keepLast": 100},
}


def steps_on_disk(run_dir: Path) -> set[int]:
    return {json.loads(p.read_text())["step"] for p in run_dir.glob("step_*/manifest.json")}


def wait_for_step(proc: launcher.Driver, run_dir: Path, step: int, timeout: float = 400) -> None:
    def saved() -> bool:
        assert proc.exit_code() is None, proc.output()[-3000:]
        return step in steps_on_disk(run_dir)

    waiting.wait(saved, timeout=timeout, what=f"step_{step} on disk", diagnostics=lambda: proc.output()[-3000:])


def test_a_driver_stops_writing_once_a_newer_attempt_claims_the_run_directory(tmp_path: Path) -> None:
    run_dir = layout.run_dir(tmp_path, "fenced")
    proc = launcher.start(run="fenced", attempt=1, root=tmp_path, config=CONFIG, run_uid="uid-1")
    try:
        wait_for_step(proc, run_dir, 4)
        assert fence.owner(run_dir) == fence.Owner("uid-1", 1)
        fence.claim(run_dir, "uid-1", 2)  # what attempt 2's driver does first
        claimed = steps_on_disk(run_dir)
        code = proc.wait(120)
    finally:
        proc.kill()
    output = proc.output()
    assert code == 1, output[-3000:]
    assert "Superseded: attempt 2 of run uid uid-1 owns" in output
    # A save whose check passed just before the claim may still finish (the documented window); nothing after it.
    assert len(steps_on_disk(run_dir) - claimed) <= 1, (sorted(claimed), sorted(steps_on_disk(run_dir)))
    assert max(steps_on_disk(run_dir)) < CONFIG["trainer"]["steps"]
    assert fence.owner(run_dir) == fence.Owner("uid-1", 2)


def test_an_older_attempt_is_refused_at_start_and_touches_nothing(tmp_path: Path) -> None:
    run_dir = layout.run_dir(tmp_path, "late")
    fence.claim(run_dir, "uid-1", 3)
    proc = launcher.start(run="late", attempt=2, root=tmp_path, config=CONFIG, run_uid="uid-1")
    assert proc.wait(120) == 1
    assert "Superseded: attempt 3 of run uid uid-1 owns" in proc.output()
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([fence.OWNER_FILE, "attempts"])


def test_retention_keeps_the_step_the_operator_pinned_and_an_ended_attempt_stops(tmp_path: Path) -> None:
    """The local supervisor's status.json plays the operator here (the Kubernetes reporter reads the CR's status)."""
    run_dir = layout.run_dir(tmp_path, "pinned")
    run_dir.mkdir(parents=True)
    status = {
        "attempt": {"number": 1, "start": "t"},
        "checkpoints": {"latest": {"step": 2, "path": str(run_dir / "step_2"), "attempt": 1, "time": "t"}},
    }
    (run_dir / "status.json").write_text(json.dumps(status))
    config = json.loads(json.dumps(CONFIG))
    config["checkpoint"] = {"savePeriod": 2, "keepLast": 1}
    proc = launcher.start(run="pinned", attempt=1, root=tmp_path, config=config, run_uid="uid-1")
    try:
        wait_for_step(proc, run_dir, 10)
        # Step 10's retention ran once steps 4 to 8 are gone (keepLast 1); what it kept is the point.
        kept = waiting.wait(
            lambda: on_disk if not (on_disk := steps_on_disk(run_dir)) & {4, 6, 8} else None,
            timeout=60,
            what="retention after step 10",
            diagnostics=lambda: str(sorted(steps_on_disk(run_dir))),
        )
        assert 2 in kept, kept  # the pinned step survives keepLast 1
        assert 4 not in kept and 6 not in kept, kept  # the others go as usual
        status["attempt"]["end"] = "t2"  # the operator ends attempt 1 (say, its pod is being evicted)
        (run_dir / "status.json").write_text(json.dumps(status))
        code = proc.wait(120)
    finally:
        proc.kill()
    assert code == 1
    assert "the operator ended attempt 1" in proc.output()
    assert 2 in steps_on_disk(run_dir)


def test_a_zombie_held_in_its_commit_neither_replaces_a_newer_attempts_step_nor_cleans_its_save(
    tmp_path: Path,
) -> None:
    """The fence holds for the whole commit: the driver is held after writing step 4's manifest (where hashing and
    fsyncs can take minutes), attempt 2 claims the directory meanwhile and has a step 4 of its own and a save in
    progress; the held driver, going on, stops right before its rename."""
    run_dir = layout.run_dir(tmp_path, "held")
    proc = launcher.start(
        run="held", attempt=1, root=tmp_path, config=CONFIG, run_uid="uid-1", crash_at="manifest_written@4~20"
    )
    try:
        proc.wait_for_marker("manifest_written", 4, timeout=400, held=True)
        fence.claim(run_dir, "uid-1", 2)
        theirs = bundles.save_as(tmp_path / "elsewhere", "held", 4, attempt=2, run_uid="uid-1")
        os.rename(theirs, run_dir / "step_4")
        in_progress = run_dir / layout.tmp_dirname(6, 2)
        in_progress.mkdir()
        (in_progress / "policy").write_bytes(b"attempt 2 is writing this")
        code = proc.wait(120)
    finally:
        proc.kill()
    output = proc.output()
    assert code == 1, output[-3000:]
    assert "(attempt 1 was about to rename tmp_step_4.attempt_1 to step_4)" in output, output[-3000:]
    assert verification.verify(run_dir / "step_4", run="held").attempt == 2
    assert (in_progress / "policy").read_bytes() == b"attempt 2 is writing this"
    assert not (run_dir / "tmp_step_4.attempt_1").exists() and not (run_dir / "old_step_4").exists()


def test_a_run_pinned_below_steps_on_disk_trains_on_keeps_what_it_saved_and_sets_aside_the_unrecorded(
    tmp_path: Path,
) -> None:
    """Retention counts only the current lineage: attempt 2 resumes from step 4, below attempt 1's recorded step 8
    (with keepLast 1 the old rule counted step 8 as the newest and deleted every step attempt 2 saved); attempt 1's
    step 12, which the status never recorded, is set aside as orphan_step_12, not deleted, not counted."""
    run_dir = layout.run_dir(tmp_path, "lineage")
    first = json.loads(json.dumps(CONFIG))
    first["trainer"]["steps"], first["checkpoint"] = 12, {"savePeriod": 4, "keepLast": 100}
    proc = launcher.start(run="lineage", attempt=1, root=tmp_path, config=first, run_uid="uid-1")
    assert proc.wait(400) == 0, proc.output()[-3000:]
    assert steps_on_disk(run_dir) == {4, 8, 12}
    recorded = [{"step": s, "path": str(run_dir / f"step_{s}"), "attempt": 1, "time": "t"} for s in (4, 8)]
    status = {"attempt": {"number": 2, "start": "t"}, "checkpoints": {"latest": recorded[1], "history": recorded}}
    (run_dir / "status.json").write_text(json.dumps(status))  # the operator's view: step 12 was never recorded
    second = json.loads(json.dumps(CONFIG))
    second["trainer"]["steps"], second["checkpoint"] = 6, {"savePeriod": 1, "keepLast": 1}
    proc = launcher.start(run="lineage", attempt=2, root=tmp_path, config=second, resume="4", run_uid="uid-1")
    assert proc.wait(400) == 0, proc.output()[-3000:]
    # Its last step stays (keepLast 1 took 4 and 5); attempt 1's recorded step 8 is not its to count or delete.
    assert steps_on_disk(run_dir) == {6, 8}
    assert manifest_of(run_dir, 6)["attempt"] == 2 and manifest_of(run_dir, 8)["attempt"] == 1
    assert json.loads((run_dir / "orphan_step_12" / layout.MANIFEST).read_text())["step"] == 12
    runtime = json.loads((run_dir / "attempts" / "2" / "runtime.json").read_text())
    assert runtime["lastCheckpoint"]["step"] == 6
    assert runtime["orphanedCheckpoints"] == [12]


def manifest_of(run_dir: Path, step: int) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((run_dir / f"step_{step}" / layout.MANIFEST).read_text())
    return manifest
