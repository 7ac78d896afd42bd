"""The trainer: a saved and reloaded trainer continues bit-identically; the weights checksum is canonical."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trainingrun_runtime import config
from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.grpo import group_sampling, objective, trainer, workload
from trainingrun_runtime.storage import files

CFG = config.TrainerConfig(prompts_per_step=3, grpo=config.GRPOConfig(group_size=4, kl_coef=0.1, updates_per_batch=2))


def _train(tr: trainer.Trainer, steps: range) -> None:
    work = workload.Workload(CFG)
    for s in steps:
        groups = [group_sampling.sample_group(tr.model, work, u, uid=u, version=s) for u in range(s * 3, s * 3 + 3)]
        adv = objective.group_advantages(torch.stack([g.rewards for g in groups]), 1e-4).flatten()
        tr.train_step(torch.cat([g.tokens for g in groups]), torch.cat([g.logprobs for g in groups]), adv)


def test_a_reloaded_trainer_ends_bit_identical_to_an_uninterrupted_one(tmp_path: Path) -> None:
    trainer.deterministic()
    straight = trainer.Trainer(CFG)
    _train(straight, range(4))

    first = trainer.Trainer(CFG)
    _train(first, range(2))
    saved_sha = first.save(tmp_path / "policy")
    second = trainer.Trainer(CFG)
    assert second.load(tmp_path / "policy") == saved_sha
    assert second.version == 2
    _train(second, range(2, 4))

    assert second.weights_sha256() == straight.weights_sha256()
    assert second.version == straight.version == 4


def test_policy_files_load_with_weights_only(tmp_path: Path) -> None:
    tr = trainer.Trainer(CFG)
    _train(tr, range(1))
    tr.save(tmp_path)
    for name in (trainer.MODEL_FILE, trainer.OPTIMIZER_FILE):
        torch.load(tmp_path / name, weights_only=True)


def test_the_weights_checksum_sees_one_flipped_bit_and_ignores_dict_order() -> None:
    state = {"b": torch.zeros(2), "a": torch.ones(3)}
    reordered = {"a": torch.ones(3), "b": torch.zeros(2)}
    assert trainer.weights_sha256(state) == trainer.weights_sha256(reordered)
    flipped = {"a": torch.ones(3), "b": torch.tensor([0.0, -0.0])}
    assert trainer.weights_sha256(state) != trainer.weights_sha256(flipped)


def test_a_policy_file_that_differs_from_the_manifests_entry_is_refused_rather_than_loaded(tmp_path: Path) -> None:
    """With the manifest's entries, the trainer checks each file through the descriptor it loads it from: a
    model.pt replaced after the driver's verification (here: another trainer's) is refused, naming the file."""
    tr = trainer.Trainer(CFG)
    tr.save(tmp_path / "policy")
    expected = {p.name: files.hash_file(p) for p in (tmp_path / "policy").iterdir()}
    _train(tr, range(1))
    tr.save(tmp_path / "other")
    os.replace(tmp_path / "other" / trainer.MODEL_FILE, tmp_path / "policy" / trainer.MODEL_FILE)
    fresh = trainer.Trainer(CFG)
    with pytest.raises(CheckpointCorrupt, match=rf"policy/{trainer.MODEL_FILE}: (checksum mismatch|\d+ bytes)"):
        fresh.load(tmp_path / "policy", expected)
    assert fresh.version == 0


def test_a_policy_loaded_with_the_manifests_entries_is_the_one_saved(tmp_path: Path) -> None:
    tr = trainer.Trainer(CFG)
    _train(tr, range(1))
    sha = tr.save(tmp_path)
    expected = {p.name: files.hash_file(p) for p in tmp_path.iterdir()}
    assert trainer.Trainer(CFG).load(tmp_path, expected) == sha
