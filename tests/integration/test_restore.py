"""The driver on real local Ray with real TransferQueue: train, checkpoint, get killed, resume in a new process.

One attempt trains a tiny run and is SIGKILLed (its whole process group, as a pod dies) right after step_4 was
committed and reported. Then, in new processes:
- a resume whose config changes the math (lr; or the group size, which the saved index would not fit either) is
  refused with exit code 6 (ConfigMismatch, not a bad step) before Ray starts, naming the field old -> new;
- a pinned step that fails verification, or whose manifest does not hash as recorded, is passed over for an older
  recorded one in the same attempt and reported bad; with none valid the restore fails naming each.

That a resume whose config changes only fields that are not math (the log period, the step limit) continues, and
restores the step, the loader's place and the replay index exactly, in the order restore -> client -> buffer ->
index -> pumps, is shown for each of the five resumes of tests/e2e/test_exact_resume.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import blake3
import pytest

from support import bundles, launcher
from trainingrun_runtime.driver import events
from trainingrun_runtime.storage import layout, verification

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

RUN = "resume"
CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": 6,
        "promptsPerStep": 4,
        "generationWorkers": 1,
        "logEvery": 1,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 64},
    },
    "checkpoint": {"savePeriod": 2, "keepLast": 5},
}


@pytest.fixture(scope="module")
def killed_after_step_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grpo-resume")
    first = launcher.start(
        run=RUN, attempt=1, root=root, config=CONFIG, crash_at="reported@4", event_log=root / "attempt1.jsonl"
    )
    first.wait_for_marker("reported", 4, timeout=600)
    first.kill()
    return root


@pytest.mark.parametrize(
    ("field", "value", "change"),
    [("lr", 0.01, "spec.trainer.grpo.lr: 0.003 -> 0.01"), ("groupSize", 8, "spec.trainer.grpo.groupSize: 4 -> 8")],
    ids=["lr", "group size"],
)
def test_a_resume_that_changes_the_math_is_refused_with_exit_code_6_naming_the_field(
    killed_after_step_4: Path, field: str, value: float, change: str
) -> None:
    root = killed_after_step_4
    changed = json.loads(json.dumps(CONFIG))
    changed["trainer"]["grpo"][field] = value
    log = root / f"attempt2-{field}.jsonl"
    proc = launcher.start(run=RUN, attempt=2, root=root, config=changed, event_log=log)
    assert proc.wait(300) == 6, proc.output()[-3000:]
    last = proc.output().strip().splitlines()[-1]
    assert last.startswith(f"ConfigMismatch: {change} (changed since step_4 was trained"), last
    assert "set it back" in last
    status = json.loads((root / RUN / "attempts" / "2" / "runtime.json").read_text())
    assert status["restoreError"] == last and not status["badCheckpoints"]
    assert "ray_started" not in [e["event"] for e in events.read(log)]


def test_a_pinned_step_that_does_not_exist_is_refused_with_exit_code_3(killed_after_step_4: Path) -> None:
    root = killed_after_step_4
    proc = launcher.start(run=RUN, attempt=2, root=root, config=CONFIG, resume="3")
    assert proc.wait(300) == 3
    last = proc.output().strip().splitlines()[-1]
    assert last.startswith("RestoreFailed: NoRecordedCheckpointVerifies") and "step_3" in last, last
    assert "does not exist" in last


def copy_with_a_flipped_byte(root: Path, into: Path, step: int) -> Path:
    """The run directory copied to `into`, one byte of step_`step`'s policy weights flipped; the file's path."""
    shutil.copytree(root / RUN, into / RUN, ignore=shutil.ignore_patterns("attempts", "owner.json", "crash-markers"))
    bundle = into / RUN / f"step_{step}"
    target = next(p for p in sorted((bundle / layout.POLICY).rglob("*")) if p.is_file() and p.stat().st_size > 64)
    bundles.flip_middle_byte(target)
    return target


def test_a_pinned_step_that_fails_verification_is_passed_over_for_an_older_recorded_one_in_the_same_attempt(
    killed_after_step_4: Path, tmp_path: Path
) -> None:
    flipped = copy_with_a_flipped_byte(killed_after_step_4, tmp_path, 4)
    proc = launcher.start(
        run=RUN, attempt=2, root=tmp_path, config=CONFIG, resume="4", fallback="2", event_log=tmp_path / "a2.jsonl"
    )
    assert proc.wait(600) == 0, proc.output()[-3000:]
    log = events.read(tmp_path / "a2.jsonl")
    rejected = [e for e in log if e["event"] == "checkpoint_rejected"]
    assert [e["step"] for e in rejected] == [4] and flipped.name in rejected[0]["problem"]
    assert next(e for e in log if e["event"] == "checkpoint_selected")["step"] == 2
    status = json.loads((tmp_path / RUN / "attempts" / "2" / "runtime.json").read_text())
    assert status["finished"] is True and status["step"] == CONFIG["trainer"]["steps"]
    assert [b["step"] for b in status["badCheckpoints"]] == [4] and flipped.name in status["badCheckpoints"][0][
        "problem"
    ]


def test_a_re_signed_step_whose_manifest_does_not_hash_as_recorded_is_passed_over_and_marked_bad(
    killed_after_step_4: Path, tmp_path: Path
) -> None:
    """Issue 24, item 9: whoever can write the volume can change a file and its checksum in the manifest, so the
    files verify; the manifest's BLAKE3 as the driver reported it (status.runtime.lastCheckpoint) cannot be."""
    reported = json.loads((killed_after_step_4 / RUN / "attempts" / "1" / "runtime.json").read_text())
    recorded = reported["lastCheckpoint"]
    assert recorded["step"] == 4
    assert (
        recorded["manifestBlake3"]
        == blake3.blake3((killed_after_step_4 / RUN / "step_4" / "manifest.json").read_bytes()).hexdigest()
    )
    step_2 = blake3.blake3((killed_after_step_4 / RUN / "step_2" / "manifest.json").read_bytes()).hexdigest()
    copy_with_a_flipped_byte(killed_after_step_4, tmp_path, 4)
    bundles.resign(tmp_path / RUN / "step_4")
    verification.verify(tmp_path / RUN / "step_4")  # every checksum of the re-signed step holds
    proc = launcher.start(
        run=RUN, attempt=2, root=tmp_path, config=CONFIG, resume="4", fallback="2",
        manifest_blake3=f"2={step_2},4={recorded['manifestBlake3']}", event_log=tmp_path / "a2.jsonl",
    )  # fmt: skip
    assert proc.wait(600) == 0, proc.output()[-3000:]
    log = events.read(tmp_path / "a2.jsonl")
    rejected = [e for e in log if e["event"] == "checkpoint_rejected"]
    assert [e["step"] for e in rejected] == [4], rejected
    assert "manifest.json: BLAKE3" in rejected[0]["problem"] and recorded["manifestBlake3"] in rejected[0]["problem"]
    assert next(e for e in log if e["event"] == "checkpoint_selected")["step"] == 2  # its recorded hash held
    status = json.loads((tmp_path / RUN / "attempts" / "2" / "runtime.json").read_text())
    assert status["finished"] is True and [b["step"] for b in status["badCheckpoints"]] == [4]


def test_a_step_newer_than_the_pinned_one_is_never_used_and_with_none_valid_the_restore_fails_naming_each(
    killed_after_step_4: Path, tmp_path: Path
) -> None:
    copy_with_a_flipped_byte(killed_after_step_4, tmp_path, 2)
    proc = launcher.start(run=RUN, attempt=2, root=tmp_path, config=CONFIG, resume="2", fallback="4")
    assert proc.wait(300) == 3, proc.output()[-3000:]
    assert proc.output().strip().splitlines()[-1].startswith("RestoreFailed: NoRecordedCheckpointVerifies")
    status = json.loads((tmp_path / RUN / "attempts" / "2" / "runtime.json").read_text())
    assert [b["step"] for b in status["badCheckpoints"]] == [2] and status["restoreError"]
