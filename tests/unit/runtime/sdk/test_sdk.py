"""The SDK's contract on real files: attach, resume_dir, checkpoint, report, the notice, stop and finish.

The reporter is the file reporter of local mode (runtime.json), as `trainingrun run` reads it; no Ray, no torch."""

from __future__ import annotations

import json
import pathlib
import threading
from typing import Any

import pytest

from support import waiting
from trainingrun_runtime import contract, sdk
from trainingrun_runtime.sdk import notice
from trainingrun_runtime.storage import checksum, fence, layout


def attachment(root: pathlib.Path, **changes: Any) -> contract.Attachment:
    base = contract.Attachment(
        run="demo", namespace="local", attempt=1, runUid="uid-1", root=str(root), resume=None, fallback=[],
        manifestBlake3={}, reporter="file", savePeriod=3, keepLast=2, keepEvery=None, trainer={"steps": 10},
    )  # fmt: skip
    return {**base, **changes}  # type: ignore[typeddict-item]


def attach(root: pathlib.Path, **changes: Any) -> sdk.Run:
    return sdk.attach({contract.ATTACH_ENV: json.dumps(attachment(root, **changes))})


def report(root: pathlib.Path, attempt: int = 1) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(contract.report_file(root / "demo", attempt).read_text())
    return value


def write_step(run: sdk.Run, step: int, text: str = "weights") -> None:
    with run.checkpoint(step) as directory:
        (directory / "state.txt").write_text(f"{text} {step}")


def test_outside_a_training_run_attach_says_which_variable_is_missing_and_how_to_run_the_program() -> None:
    with pytest.raises(sdk.NotAttached, match=r"TRAININGRUN_ATTACH is not set.*spec\.driver\.entrypoint"):
        sdk.attach({})


def test_an_attachment_from_another_version_names_the_fields_it_lacks() -> None:
    with pytest.raises(sdk.NotAttached, match=r"lacks \['attempt', .*'savePeriod'"):
        sdk.attach({contract.ATTACH_ENV: json.dumps({"run": "demo"})})


def test_a_fresh_run_has_nothing_to_resume_and_its_checkpoint_is_committed_then_reported(
    tmp_path: pathlib.Path,
) -> None:
    run = attach(tmp_path)
    assert run.resume_dir() is None
    write_step(run, 3)
    step_dir = tmp_path / "demo" / "step_3"
    assert (step_dir / "state.txt").read_text() == "weights 3"
    last = report(tmp_path)["lastCheckpoint"]
    assert (last["step"], last["attempt"], last["path"], last["reason"]) == (3, 1, str(step_dir), "Periodic")
    assert last["manifestBlake3"] == checksum.blake3_of_bytes((step_dir / layout.MANIFEST).read_bytes())
    assert not [p.name for p in (tmp_path / "demo").iterdir() if p.name.startswith(layout.TMP_PREFIX)]


def test_an_exception_while_writing_leaves_no_step_and_reports_nothing(tmp_path: pathlib.Path) -> None:
    run = attach(tmp_path)
    with pytest.raises(RuntimeError, match="disk full"), run.checkpoint(3) as directory:
        (directory / "half.txt").write_text("half")
        raise RuntimeError("disk full")
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["attempts", "owner.json"]  # the listener file
    assert not contract.report_file(tmp_path / "demo", 1).exists()


def test_a_manifest_written_by_the_program_is_refused_and_nothing_is_recorded(tmp_path: pathlib.Path) -> None:
    run = attach(tmp_path)
    with pytest.raises(Exception, match=r"manifest\.json is reserved"), run.checkpoint(3) as directory:
        (directory / layout.MANIFEST).write_text("{}")
    assert not (tmp_path / "demo" / "step_3").exists()


def test_the_next_attempt_resumes_from_the_pinned_step_as_recorded(tmp_path: pathlib.Path) -> None:
    first = attach(tmp_path)
    write_step(first, 3)
    write_step(first, 6)
    recorded = report(tmp_path)["lastCheckpoint"]
    second = attach(tmp_path, attempt=2, resume=6, manifestBlake3={"6": recorded["manifestBlake3"]})
    assert second.resume_dir() == tmp_path / "demo" / "step_6"
    assert second.resumed_step == 6


def test_a_pinned_step_that_fails_verification_falls_back_to_the_older_recorded_one_and_is_reported_bad(
    tmp_path: pathlib.Path,
) -> None:
    first = attach(tmp_path)
    write_step(first, 3)
    write_step(first, 6)
    (tmp_path / "demo" / "step_6" / "state.txt").write_text("weights 7")  # same size, other bytes
    second = attach(tmp_path, attempt=2, resume=6, fallback=[3])
    assert second.resume_dir() == tmp_path / "demo" / "step_3"
    second.report(4, loss=1.0)
    write_step(second, 6, "again")
    bad = report(tmp_path, 2)["badCheckpoints"]
    assert [b["step"] for b in bad] == [6] and "state.txt" in bad[0]["problem"]


def test_when_no_recorded_step_verifies_the_program_exits_restore_failed_and_says_why(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = attach(tmp_path)
    write_step(first, 3)
    second = attach(tmp_path, attempt=2, resume=3, manifestBlake3={"3": "0" * 64})
    with pytest.raises(SystemExit) as ended:
        second.resume_dir()
    assert ended.value.code == sdk.RESTORE_FAILED
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith("RestoreFailed: no recorded checkpoint verifies (step_3:")
    status = report(tmp_path, 2)
    assert "step_3" in status["restoreError"] and [b["step"] for b in status["badCheckpoints"]] == [3]


def test_saves_come_every_save_period_and_retention_keeps_the_newest_of_this_lineage(tmp_path: pathlib.Path) -> None:
    run = attach(tmp_path)
    saved = []
    for step in range(1, 11):
        if run.should_save(step):
            write_step(run, step)
            saved.append(step)
    assert saved == [3, 6, 9]
    assert sorted(p.name for p in (tmp_path / "demo").iterdir() if p.name.startswith("step_")) == ["step_6", "step_9"]


def test_a_report_carries_the_step_reward_and_metrics_and_leaves_out_a_nan(tmp_path: pathlib.Path) -> None:
    run = attach(tmp_path)
    run.report(5, reward=0.5, loss=float("nan"), kl=0.1)
    run.finish()
    status = report(tmp_path)
    assert (status["step"], status["reward"], status["metrics"], status["finished"]) == (5, 0.5, {"kl": 0.1}, True)
    with pytest.raises(ValueError, match="metric name 'a-b'"):
        run.report(6, **{"a-b": 1.0})


def test_a_notice_asks_for_one_save_and_stop_answers_it_with_that_step_and_exits_preempted(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = attach(tmp_path)
    assert notice.listening(tmp_path, "demo", 1)
    run.report(4)
    assert not run.should_save(4) and run.notice is None
    notice.request(tmp_path, "demo", 1, deadline=1e12, reason="evicted")
    answered: list[notice.Answer | None] = []
    waiter = threading.Thread(target=lambda: answered.append(notice.wait_for_answer(tmp_path, "demo", 1, 1e12)))
    waiter.start()
    waiting.wait(lambda: run.notice, timeout=5, what="the program to see the notice (read every POLL_S)")
    assert run.should_save(4)  # not a save period: the notice asks for it
    write_step(run, 4)
    assert not run.should_save(4) and run.notice is not None
    with pytest.raises(SystemExit) as ended:
        run.stop()
    waiter.join(10)
    assert ended.value.code == sdk.PREEMPTED
    assert answered == [notice.Answer(4, "step 4 is this attempt's newest checkpoint")]
    assert report(tmp_path)["lastCheckpoint"]["reason"] == "PreemptionNotice"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "Preempted: stopped at step 4 on the head pod's notice; saved step 4"
    )
    assert not notice.listening(tmp_path, "demo", 1)


def test_an_attempt_whose_directory_a_newer_one_claimed_stops_writing_and_says_superseded(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = attach(tmp_path)
    fence.claim(tmp_path / "demo", "uid-1", 2)  # attempt 2 started: attempt 1 lives on after its node was cut off
    with pytest.raises(SystemExit) as ended:
        write_step(old, 3)
    assert ended.value.code == sdk.FAILED
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("Superseded:")
    assert not (tmp_path / "demo" / "step_3").exists()
    with pytest.raises(SystemExit):
        attach(tmp_path)  # a zombie of attempt 1 that starts again


def status_file(root: pathlib.Path, status: dict[str, Any]) -> None:
    (root / "demo" / "status.json").write_text(json.dumps(status))


def test_retention_keeps_the_step_the_operator_would_resume_from_though_keep_last_would_drop_it(
    tmp_path: pathlib.Path,
) -> None:
    run = attach(tmp_path, keepLast=1)
    write_step(run, 3)
    status_file(tmp_path, {"attempt": {"number": 1}, "checkpoints": {"latest": {"step": 3}}})
    write_step(run, 6)
    write_step(run, 9)
    assert sorted(p.name for p in (tmp_path / "demo").iterdir() if p.name.startswith("step_")) == ["step_3", "step_9"]


def test_an_attempt_the_operator_ended_deletes_nothing_and_stops_unless_its_checkpoint_answers_a_notice(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = attach(tmp_path, keepLast=1)
    write_step(run, 3)
    status_file(tmp_path, {"attempt": {"number": 2}, "checkpoints": {"latest": {"step": 3}}})  # attempt 2 is current
    with pytest.raises(SystemExit) as ended:
        write_step(run, 6)
    assert ended.value.code == sdk.FAILED
    assert "the operator ended attempt 1" in capsys.readouterr().err
    assert (tmp_path / "demo" / "step_3").is_dir() and (tmp_path / "demo" / "step_6").is_dir()  # complete, reported

    noticed = attach(tmp_path, keepLast=1)
    notice.request(tmp_path, "demo", 1, deadline=1e12, reason="evicted")
    waiting.wait(lambda: noticed.notice, timeout=5, what="the notice seen")
    write_step(noticed, 9)  # the operator ended it on the head's deletion: this save still answers the notice
    assert {p.name for p in (tmp_path / "demo").iterdir() if p.name.startswith("step_")} == {
        "step_3",
        "step_6",
        "step_9",
    }
