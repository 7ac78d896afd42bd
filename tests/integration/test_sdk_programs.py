"""spec.driver programs under `trainingrun run`: the SDK's contract kept by the local backend, with real processes,
real torch and the real supervisor (no Ray: the programs use none; `integration` for torch and the processes).

- The plain PyTorch example, killed at random moments (--chaos, seeded), resumes from its recorded steps and ends
  with the weights of an uninterrupted run.
- A notice (the head's preStop request) is answered with a checkpoint of the step reached: no step lost, counted as
  a preemption, and the next attempt resumes from it.
- The TRL example (GRPOTrainer with the SDK's callback), killed at random, resumes the Trainer from its recorded
  steps and finishes; on a notice it saves the step reached, and the Trainer resumes from that step.
- A hung program is ended as Stalled at its progress deadline; the next attempt resumes.
- A program that crashes again and again before it saves anything spends the failure budget and the run fails; a
  preemption before them spends none.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
import yaml

from support import waiting
from trainingrun_runtime.sdk import notice

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "plain-torch.yaml"
SCRIPTED = pathlib.Path(__file__).resolve().parent / "programs" / "scripted.py"


def run_file(tmp_path: pathlib.Path, name: str, **changes: Any) -> pathlib.Path:
    """The plain-torch example as `name`, with `changes` merged into its spec (a dict merges one level down)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    for key, value in changes.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def scripted(tmp_path: pathlib.Path, name: str, script: str, *, steps: int, **changes: Any) -> pathlib.Path:
    """A run of tests/integration/programs/scripted.py: `script` says how each attempt misbehaves."""
    driver = {"entrypoint": ["python", str(SCRIPTED)], "env": [{"name": "SCRIPT", "value": script}]}
    return run_file(tmp_path, name, driver=driver, trainer={"steps": steps}, **changes)


def trainingrun(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainingrun_operator.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def status_of(root: pathlib.Path, name: str) -> dict[str, Any]:
    try:
        value = json.loads((root / "local" / name / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def newest_reported(root: pathlib.Path, name: str, attempt: int) -> int:
    """The newest checkpoint `attempt` reported (its runtime.json's lastCheckpoint): what the next one resumes from
    after a kill (status.checkpoints.history loses the steps that retention deleted)."""
    report = json.loads((root / "local" / name / "attempts" / str(attempt) / "runtime.json").read_text())
    step: int = report["lastCheckpoint"]["step"]
    return step


def final_state(root: pathlib.Path, name: str, step: int) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(root / "local" / name / f"step_{step}" / "state.pt", weights_only=True)
    return state


@pytest.mark.timeout(600)
def test_the_plain_torch_example_killed_at_random_resumes_and_ends_with_the_uninterrupted_weights(
    tmp_path: pathlib.Path,
) -> None:
    changes = {"trainer": {"steps": 6000, "seed": 0, "grpo": {"lr": 0.001}}}
    reference = trainingrun("run", str(run_file(tmp_path, "reference", **changes)), "--root", str(tmp_path),
                            timeout=300)  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-3000:]
    chaos = trainingrun("run", str(run_file(tmp_path, "chaos", **changes)), "--root", str(tmp_path), "--chaos",
                        "--chaos-seed", "5", timeout=300)  # fmt: skip
    assert chaos.returncode == 0, chaos.stderr[-3000:]

    status = status_of(tmp_path, "chaos")
    attempts = status["attempts"]
    assert len(attempts) >= 2, "--chaos killed at least one attempt"
    assert [a["reason"] for a in attempts] == ["Preempted"] * (len(attempts) - 1) + ["Succeeded"]
    for attempt in attempts[1:]:
        assert attempt["resumedFrom"] == newest_reported(tmp_path, "chaos", attempt["number"] - 1), attempt
    assert status["restarts"]["applicationFailure"] == 0

    got, want = final_state(tmp_path, "chaos", 6000), final_state(tmp_path, "reference", 6000)
    for part in ("model", "optimizer"):
        assert torch.equal(
            torch.cat([t.flatten() for t in _tensors(got[part])]),
            torch.cat([t.flatten() for t in _tensors(want[part])]),
        ), f"the resumed run's {part} state differs from the uninterrupted run's"


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.float()]
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in _tensors(value[key])]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return [torch.tensor(float(value))] if isinstance(value, int | float) else []


def notice_during(tmp_path: pathlib.Path, path: pathlib.Path, name: str, *, after: int) -> notice.Answer:
    """Runs `path` with `trainingrun run` and, once attempt 1 has reported step `after`, makes the head's request
    (`notice.request`, as the preStop hook does); returns the answer, after the run ended."""
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "trainingrun_operator.cli", "run", str(path), "--root", str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        root = tmp_path / "local"
        waiting.wait(
            lambda: notice.listening(root, name, 1)
            and (status_of(tmp_path, name).get("runtime") or {}).get("step", 0) >= after,
            timeout=180, what=f"attempt 1 to listen and report step {after}", diagnostics=log.read_text,
        )  # fmt: skip
        notice.request(root, name, 1, deadline=time.time() + 60, reason="the test deletes the head")
        answer = notice.wait_for_answer(root, name, 1, deadline=time.time() + 60)
        assert answer is not None and answer.step is not None and answer.step >= after, answer
        assert supervisor.wait(timeout=400) == 0, log.read_text()[-3000:]
    finally:
        supervisor.kill()
    return answer


def assert_resumed_from_the_notice(status: dict[str, Any], answer: notice.Answer) -> None:
    first, second = status["attempts"][:2]
    assert (first["reason"], first.get("stepsLost", 0)) == ("Preempted", 0)
    assert second["resumedFrom"] == answer.step
    assert any(c["step"] == answer.step and c["reason"] == "PreemptionNotice" for c in status["checkpoints"]["history"])
    assert (status["phase"], status["restarts"]["preempted"], status["restarts"]["applicationFailure"]) == (
        "Succeeded", 1, 0,
    )  # fmt: skip


@pytest.mark.timeout(600)
def test_a_notice_is_answered_with_a_checkpoint_of_the_step_reached_and_the_next_attempt_resumes_from_it(
    tmp_path: pathlib.Path,
) -> None:
    path = scripted(tmp_path, "noticed", "", steps=200, checkpoint={"savePeriod": 1000})  # no save but the notice's
    answer = notice_during(tmp_path, path, "noticed", after=10)
    assert_resumed_from_the_notice(status_of(tmp_path, "noticed"), answer)


TRL_EXAMPLE = REPO / "manifests" / "examples" / "trl-grpo.yaml"


def trl_run(tmp_path: pathlib.Path, name: str, *, steps: int, save_period: int) -> pathlib.Path:
    doc = yaml.safe_load(TRL_EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["trainer"]["steps"] = steps
    doc["spec"]["checkpoint"]["savePeriod"] = save_period
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def first_reported(tmp_path: pathlib.Path, name: str, attempt: int) -> int:
    """The first step an attempt of the TRL example reported (its log's first `step N:` line: the SDK logs the first
    report at once, and the Trainer logs every step)."""
    log = (tmp_path / "local" / name / "attempts" / str(attempt) / "driver.log").read_text()
    found = re.search(r"INFO step (\d+):", log)
    assert found is not None, log[-2000:]
    return int(found.group(1))


@pytest.mark.timeout(900)
def test_the_trl_example_killed_at_random_resumes_the_trainer_from_its_recorded_steps_and_finishes(
    tmp_path: pathlib.Path,
) -> None:
    steps = 300
    path = trl_run(tmp_path, "trl-chaos", steps=steps, save_period=10)
    result = trainingrun("run", str(path), "--root", str(tmp_path), "--chaos", "--chaos-seed", "7", timeout=800)
    assert result.returncode == 0, result.stderr[-3000:]
    status = status_of(tmp_path, "trl-chaos")
    attempts = status["attempts"]
    assert len(attempts) >= 2, "--chaos killed at least one attempt"
    assert [a["reason"] for a in attempts] == ["Preempted"] * (len(attempts) - 1) + ["Succeeded"]
    for attempt in attempts[1:]:
        assert attempt["resumedFrom"] == newest_reported(tmp_path, "trl-chaos", attempt["number"] - 1), attempt
        assert first_reported(tmp_path, "trl-chaos", attempt["number"]) == attempt["resumedFrom"] + 1, (
            "the Trainer resumed from the recorded step"
        )
    final = json.loads((tmp_path / "local" / "trl-chaos" / f"step_{steps}" / "trainer_state.json").read_text())
    assert final["global_step"] == steps


@pytest.mark.timeout(900)
def test_the_trl_example_saves_on_the_notice_and_the_trainer_resumes_from_that_step(tmp_path: pathlib.Path) -> None:
    path = trl_run(tmp_path, "trl-notice", steps=300, save_period=1000)  # no save but the notice's and the last
    answer = notice_during(tmp_path, path, "trl-notice", after=20)
    assert_resumed_from_the_notice(status_of(tmp_path, "trl-notice"), answer)
    assert first_reported(tmp_path, "trl-notice", 2) == answer.step + 1, "the Trainer resumed from the notice's step"


@pytest.mark.timeout(600)
def test_a_hung_program_is_ended_as_stalled_and_the_next_attempt_resumes_from_its_recorded_step(
    tmp_path: pathlib.Path,
) -> None:
    path = scripted(
        tmp_path, "hung", "1:hang", steps=12, checkpoint={"savePeriod": 3},
        restartPolicy={"progressDeadlineSeconds": 4, "startupDeadlineSeconds": 60},
    )  # fmt: skip
    result = trainingrun("run", str(path), "--root", str(tmp_path), timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    status = status_of(tmp_path, "hung")
    first, second = status["attempts"][:2]
    assert first["reason"] == "Stalled" and second["resumedFrom"] == 3  # it hung at step 5; step 3 was recorded
    assert (status["phase"], status["restarts"]["stalled"]) == ("Succeeded", 1)
    assert (tmp_path / "local" / "hung" / "step_12" / "step").read_text() == "12"


@pytest.mark.timeout(600)
def test_a_crash_loop_spends_the_failure_budget_and_a_preemption_before_it_spends_none(tmp_path: pathlib.Path) -> None:
    path = scripted(
        tmp_path, "crashing", "1:preempt,2:crash,3:crash", steps=40, checkpoint={"savePeriod": 2},
        restartPolicy={"failureBudget": 2, "backoff": {"initialSeconds": 0, "maxSeconds": 1, "factor": 1}},
    )  # fmt: skip
    result = trainingrun("run", str(path), "--root", str(tmp_path), timeout=400)
    assert result.returncode == 1, result.stderr[-3000:]
    status = status_of(tmp_path, "crashing")
    assert [a["reason"] for a in status["attempts"]] == ["Preempted", "ApplicationFailure", "ApplicationFailure"]
    assert [a.get("resumedFrom") for a in status["attempts"]] == [None, 4, 4]  # no step since: a crash loop
    assert (status["phase"], status["restarts"]["preempted"], status["restarts"]["applicationFailure"]) == (
        "Failed", 1, 2,
    )  # fmt: skip
    assert (
        "crashing at step 5 as scripted"
        in (tmp_path / "local" / "crashing" / "attempts" / "3" / "driver.log").read_text()
    )
    assert os.path.isdir(tmp_path / "local" / "crashing" / "step_4")
