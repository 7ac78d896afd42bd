"""Generation workers are interchangeable and version-checked."""

from __future__ import annotations

import pytest
import torch

from trainingrun_runtime import config
from trainingrun_runtime.driver import generation_workers
from trainingrun_runtime.grpo import trainer


def test_two_generators_at_the_same_version_produce_the_same_group() -> None:
    cfg = config.TrainerConfig(grpo=config.GRPOConfig(group_size=4))
    a, b = generation_workers.Generator(cfg), generation_workers.Generator(cfg)
    b.generate(5, 6, version=0)  # b has history; it must not matter
    ga, gb = a.generate(7, 3, version=0), b.generate(7, 3, version=0)
    fa, fb = ga["fields"], gb["fields"]
    assert torch.equal(fa["tokens"], fb["tokens"]) and torch.equal(fa["logprobs"], fb["logprobs"])


def test_a_generator_refuses_a_version_it_does_not_hold_and_reports_the_one_it_used() -> None:
    cfg = config.TrainerConfig()
    gen = generation_workers.Generator(cfg)
    with pytest.raises(RuntimeError, match="holds 0"):
        gen.generate(0, 0, version=1)
    tr = trainer.Trainer(cfg)
    assert gen.load_weights(1, tr.weights()) == 1
    assert gen.generate(0, 0, version=None)["version"] == 1
