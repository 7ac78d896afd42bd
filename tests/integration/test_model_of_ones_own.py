"""A user's own model, data and reward, run as a user runs them: `trainingrun run` on a YAML file beside a model
directory written with `save_pretrained` (a tiny Llama and its tokenizer), a JSONL with field names of its own and a
reward function in a module of its own, all named by paths relative to the YAML file (real Ray, TransferQueue,
torch and transformers; no cluster, hence `integration`).

- The run trains to a rising reward, and `trainingrun export` gives a directory that transformers loads and
  generates from, with the weights of the run's last checkpoint.
- A reward function that raises fails the attempt at once as a bad spec, naming the function and the sample.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import yaml

from support import hfmodels
from trainingrun_operator.localmode import local
from trainingrun_runtime.grpo import dataset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = 20
REWARD_MODULE = '''
def score(prompt, completion, answer):
    """The share of the completion's three places that say the answer."""
    return sum(word == answer for word in completion.split()) / 3


def broken(prompt, completion, answer):
    raise KeyError("no such place")
'''


def trainingrun(*args: str, cwd: pathlib.Path, timeout: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "trainingrun_operator.cli", *args]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def user_directory(where: pathlib.Path, *, function: str) -> pathlib.Path:
    """What a user brings, under `where`: model/, problems.jsonl, rewards_of_mine.py and run.yaml; returns the YAML."""
    hfmodels.llama_dir(where / "model", hidden=32, layers=2, heads=2)
    with open(where / "problems.jsonl", "w") as f:
        for i in range(48):  # prompts of 2 to 5 words: rows of several lengths in one batch
            digits = " ".join(str((i * 7 + k) % 10) for k in range(1 + i % 4))
            f.write(json.dumps({"question": f"{digits} =", "solution": "answer", "id": i}) + "\n")
    (where / "rewards_of_mine.py").write_text(REWARD_MODULE)
    run: dict[str, Any] = {
        "apiVersion": "trainingrun.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "mine"},
        "spec": {
            "image": "ghcr.io/trainingrun/runtime:0.1.0",
            "ray": {"head": {"rayStartParams": {"num-cpus": "8"}}},
            "trainer": {
                "steps": STEPS,
                "promptsPerStep": 4,
                "generationWorkers": 1,
                "logEvery": 1,
                "model": {"path": "model"},
                "data": {"path": "problems.jsonl", "promptField": "question", "answerField": "solution"},
                "reward": {"kind": "function", "function": function},
                "generation": {"maxNewTokens": 3, "chatTemplate": True},
                "grpo": {"groupSize": 4, "lr": 0.01},
            },
            "checkpoint": {"pvc": {"claimName": "mine"}, "savePeriod": 10},
        },
    }
    (where / "run.yaml").write_text(yaml.safe_dump(run))
    return where / "run.yaml"


def test_a_users_model_data_and_reward_train_to_a_rising_reward_and_export_to_a_model_transformers_loads(
    tmp_path: pathlib.Path,
) -> None:
    yaml_file = user_directory(tmp_path / "mine", function="rewards_of_mine:score")
    root = tmp_path / "runs"
    elsewhere = tmp_path  # the command runs from another directory: relative paths are the YAML file's
    result = trainingrun("run", str(yaml_file), "--root", str(root), cwd=elsewhere, timeout=800)
    run_dir = root / "local" / "mine"
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(run_dir.glob("attempts/*/driver.log")))
    assert result.returncode == 0, result.stderr[-3000:] + logs

    saved = json.loads((run_dir / f"step_{STEPS}" / "manifest.json").read_text())
    assert (
        saved["extra"]["data_fingerprint"]
        == dataset.load(yaml_file.parent / "problems.jsonl", "question", "solution").fingerprint
    )
    assert saved["extra"]["config_math"]["trainer.model.path"] == str(yaml_file.parent / "model")

    rewards = [r for _, r in local.read_rewards(run_dir, 1)[1]]
    assert len(rewards) == STEPS, logs
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.4 and last > first + 0.3, rewards

    out = tmp_path / "exported"
    exported = trainingrun("export", str(run_dir), str(out), cwd=elsewhere, timeout=300)
    assert exported.returncode == 0, exported.stderr
    assert json.loads((out / "trainingrun.json").read_text())["step"] == STEPS

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ids = tokenizer("1 2 =", return_tensors="pt")["input_ids"]
    generated = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=hfmodels.PAD)
    assert tokenizer.decode(generated[0, ids.shape[1] :], skip_special_tokens=True).split()[0] == "answer"


def test_a_reward_function_that_raises_fails_the_run_as_a_bad_spec_naming_the_function_and_the_sample(
    tmp_path: pathlib.Path,
) -> None:
    yaml_file = user_directory(tmp_path / "mine", function="rewards_of_mine:broken")
    root = tmp_path / "runs"
    result = trainingrun("run", str(yaml_file), "--root", str(root), cwd=tmp_path, timeout=600)
    assert result.returncode == 1
    status = json.loads((root / "local" / "mine" / "status.json").read_text())
    assert status["phase"] == "Failed" and len(status["attempts"]) == 1, status
    log = (root / "local" / "mine" / "attempts" / "1" / "driver.log").read_text()
    assert "BadConfig: reward function rewards_of_mine:broken raised KeyError" in log, log[-3000:]
    assert "prompt '" in log and "completion '" in log
