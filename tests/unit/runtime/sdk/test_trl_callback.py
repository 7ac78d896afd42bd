"""The TRL callback at a Hugging Face Trainer's hooks, with the Trainer's real state objects and real files: its saves
become recorded checkpoints, the notice asks for one save and stops training, its logs become reports."""

from __future__ import annotations

import json
import pathlib

from transformers import TrainerControl, TrainerState, TrainingArguments

from support import waiting
from trainingrun_runtime import contract, sdk
from trainingrun_runtime.sdk import notice
from trainingrun_runtime.sdk.trl import TrainingRunCallback, metric_name


def attached(root: pathlib.Path) -> sdk.Run:
    value = contract.Attachment(
        run="trl", namespace="local", attempt=1, runUid="u", root=str(root), resume=None, fallback=[],
        manifestBlake3={}, reporter="file", savePeriod=5, keepLast=3, keepEvery=None, trainer={},
    )  # fmt: skip
    return sdk.attach({contract.ATTACH_ENV: json.dumps(value)})


def test_a_trainer_save_moves_into_a_recorded_step_that_the_trainer_can_resume_from(tmp_path: pathlib.Path) -> None:
    run = attached(tmp_path / "volume")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
    state, control = TrainerState(global_step=5, max_steps=20), TrainerControl()
    callback = TrainingRunCallback(run)
    assert callback.on_step_end(args, state, control).should_save  # a save period: the Trainer saves now
    saved = tmp_path / "out" / "checkpoint-5"
    saved.mkdir(parents=True)
    (saved / "trainer_state.json").write_text('{"global_step": 5}')
    (saved / "optimizer.pt").write_bytes(b"opt")
    callback.on_save(args, state, control)
    step = tmp_path / "volume" / "trl" / "step_5"
    assert sorted(p.name for p in step.iterdir()) == ["manifest.json", "optimizer.pt", "trainer_state.json"]
    assert not saved.exists()
    report = json.loads(contract.report_file(tmp_path / "volume" / "trl", 1).read_text())
    assert report["lastCheckpoint"]["step"] == 5


def test_on_the_notice_the_next_step_saves_and_training_stops(tmp_path: pathlib.Path) -> None:
    run = attached(tmp_path)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
    callback = TrainingRunCallback(run)
    control = callback.on_step_end(args, TrainerState(global_step=3, max_steps=20), TrainerControl())
    assert not control.should_save and not control.should_training_stop
    notice.request(tmp_path, "trl", 1, deadline=1e12, reason="evicted")
    waiting.wait(lambda: run.notice, timeout=5, what="the notice seen")
    control = callback.on_step_end(args, TrainerState(global_step=4, max_steps=20), TrainerControl())
    assert control.should_save and control.should_training_stop


def test_a_log_becomes_a_report_with_the_reward_first_and_identifier_names(tmp_path: pathlib.Path) -> None:
    run = attached(tmp_path)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
    logs = {"reward": 0.25, "loss": -0.1, "rewards/last_digit/mean": 0.25, "epoch": 1.0, "done": True, "note": "x"}
    logs |= {f"extra_{i:02d}": float(i) for i in range(20)}
    TrainingRunCallback(run).on_log(args, TrainerState(global_step=7), TrainerControl(), logs=logs)
    run.finish()
    report = json.loads(contract.report_file(tmp_path / "trl", 1).read_text())
    assert (report["step"], report["reward"]) == (7, 0.25)
    assert len(report["metrics"]) == contract.METRICS_MAX and report["metrics"]["loss"] == -0.1
    assert metric_name("rewards/last_digit/mean") == "rewards_last_digit_mean" and metric_name("1x") == "_1x"
