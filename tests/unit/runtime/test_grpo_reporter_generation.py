"""The file reporter writes runtime.json atomically; generators are interchangeable and version-checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainingrun_runtime import config, timestamps
from trainingrun_runtime.driver import generation_workers, reporting
from trainingrun_runtime.grpo import trainer


def _status(step: int) -> reporting.RuntimeStatus:
    return reporting.RuntimeStatus(
        attempt=2, step=step, reward=0.5, updated=timestamps.now(),
        lastCheckpoint=reporting.CheckpointReport(
            step=step, path=f"/r/run/step_{step}", attempt=2, replayDigest="d", weightsSha256="w", time="t"
        ),
        restoreError=None, finished=False,
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


def test_two_generators_at_the_same_version_produce_the_same_group() -> None:
    cfg = config.TrainerConfig(grpo=config.GRPOConfig(group_size=4))
    a, b = generation_workers.Generator(cfg), generation_workers.Generator(cfg)
    b.generate(5, 6, version=0)  # b has history; it must not matter
    ga, gb = a.generate(7, 3, version=0), b.generate(7, 3, version=0)
    assert torch.equal(ga["tokens"], gb["tokens"]) and torch.equal(ga["logprobs"], gb["logprobs"])


def test_a_generator_refuses_a_version_it_does_not_hold_and_reports_the_one_it_used() -> None:
    cfg = config.TrainerConfig()
    gen = generation_workers.Generator(cfg)
    with pytest.raises(RuntimeError, match="holds 0"):
        gen.generate(0, 0, version=1)
    tr = trainer.Trainer(cfg)
    assert gen.load_weights(1, tr.weights()) == 1
    assert gen.generate(0, 0, version=None)["version"] == 1
