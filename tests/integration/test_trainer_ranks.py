"""Two data-parallel trainer ranks (real processes, a real gloo group, FSDP2, DCP): the update is the whole batch's,
a 2-rank checkpoint resumes bit-exactly on 2 ranks, and resumes on 1 rank with the same weights and optimizer
state. No Ray: the ranks are plain processes (`torch.multiprocessing`), as Ray's actors are in a run."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainingrun_runtime import config, export
from trainingrun_runtime.grpo import group_sampling, objective, sharding, trainer, workload
from trainingrun_runtime.storage import files, layout
from trainingrun_runtime.storage.commit import BundleWriter

pytestmark = pytest.mark.integration

CFG = config.TrainerConfig(prompts_per_step=3, grpo=config.GRPOConfig(group_size=4, kl_coef=0.1, updates_per_batch=2))
ROWS = 3 * 4


def _batches(steps: range) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Fixed batches (sampled from the first weights): every run below trains on the same rows."""
    trainer.deterministic()
    work = workload.Workload(CFG)
    model = work.new_model()
    out = []
    for s in steps:
        groups = [group_sampling.sample_group(model, work, u, uid=u, version=s) for u in range(s * 3, s * 3 + 3)]
        adv = objective.group_advantages(torch.stack([g.rewards for g in groups]), 1e-4).flatten()
        out.append((torch.cat([g.tokens for g in groups]), torch.cat([g.logprobs for g in groups]), adv))
    return out


def _mask(tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that end early, more of them in the first half of the batch: the ranks hold unequal token counts, so a
    rank that divided by its own count instead of the whole batch's would weigh its tokens wrongly."""
    mask = torch.ones_like(logprobs)
    mask[: ROWS // 2 - 1, -2:] = 0
    mask[ROWS - 1, -1:] = 0
    return mask, torch.full((tokens.shape[0],), tokens.shape[1] - logprobs.shape[1])


def _train(tr: trainer.Trainer, batches: list[Any], steps: range) -> list[dict[str, float]]:
    """Each rank takes its contiguous part of every batch, as `driver.trainers.Trainers.train` splits it."""
    part = slice(tr.rank * ROWS // tr.world, (tr.rank + 1) * ROWS // tr.world)
    return [tr.train_step(*(t[part] for t in (*batches[s], *_mask(*batches[s][:2])))) for s in steps]


def _ranks(rank: int, world: int, address: str, root: str, batches: list[Any]) -> None:
    trainer.deterministic()
    sharding.join(address, rank, world)
    out: dict[str, Any] = {}
    straight = trainer.Trainer(CFG, rank=rank, world=world)
    out["stats"] = _train(straight, batches, range(4))
    out["straight"] = straight.weights_sha256()
    whole = straight.weights()  # every rank takes part; rank 0 gets the weights
    first = trainer.Trainer(CFG, rank=rank, world=world)
    _train(first, batches, range(2))
    out["saved"] = first.save(Path(root) / "policy")
    second = trainer.Trainer(CFG, rank=rank, world=world)
    out["loaded"] = second.load(Path(root) / "policy")
    _train(second, batches, range(2, 4))
    out["resumed"] = second.weights_sha256()
    if rank == 0:
        torch.save(whole, Path(root) / "straight.pt")
        (Path(root) / "out.json").write_text(json.dumps(out))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], list[Any]]:
    root = tmp_path_factory.mktemp("ranks")
    batches = _batches(range(4))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    mp.spawn(_ranks, args=(2, address, str(root), batches), nprocs=2, join=True)
    return root, json.loads((root / "out.json").read_text()), batches


def test_two_ranks_resume_bit_exactly_on_two_ranks(two_ranks: tuple[Path, dict[str, Any], list[Any]]) -> None:
    _, out, _ = two_ranks
    assert out["loaded"] == out["saved"]
    assert out["resumed"] == out["straight"]
    assert out["saved"] != out["straight"]  # the two steps after the save moved the weights


def test_each_rank_writes_its_shard_and_a_checkpoint_of_two_ranks_loads_on_one_with_the_same_state(
    two_ranks: tuple[Path, dict[str, Any], list[Any]],
) -> None:
    root, out, batches = two_ranks
    policy = root / "policy"
    assert {p.name for p in policy.iterdir()} == {
        sharding.METADATA_FILE, sharding.shard_file(0), sharding.shard_file(1), trainer.STATE_FILE
    }  # fmt: skip
    expected = {p.name: files.hash_file(p) for p in policy.iterdir()}
    one = trainer.Trainer(CFG)
    assert one.load(policy, expected) == out["saved"]
    assert one.version == 2
    # The optimizer's state came back too: the next two steps on one rank land near the two ranks' (another
    # rounding of the same sums), not where a fresh AdamW would take them.
    fresh = trainer.Trainer(CFG)
    fresh.model.load_state_dict(one.model.state_dict())
    _train(one, batches, range(2, 4))
    _train(fresh, batches, range(2, 4))
    straight_two = torch.load(root / "straight.pt", weights_only=True)
    assert _distance(one, straight_two) < 1e-4 < _distance(fresh, straight_two)


def _distance(tr: trainer.Trainer, weights: dict[str, torch.Tensor]) -> float:
    mine = tr.model.state_dict()
    return max(float((mine[k] - v).abs().max()) for k, v in weights.items())


def test_the_update_of_two_ranks_is_the_whole_batchs(two_ranks: tuple[Path, dict[str, Any], list[Any]]) -> None:
    _, out, batches = two_ranks
    one = trainer.Trainer(CFG)
    stats = _train(one, batches, range(4))
    for mine, theirs in zip(stats, out["stats"], strict=True):
        for key in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key


def test_export_gathers_the_shards_of_both_ranks_into_one_hugging_face_model(
    two_ranks: tuple[Path, dict[str, Any], list[Any]], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    root, out, _ = two_ranks
    runtime = config.RuntimeConfig(trainer=CFG)
    pending = BundleWriter(tmp_path, "ranks").begin(2)
    shutil.copytree(root / "policy", pending.path / layout.POLICY)
    extra = {"config_math": config.math_fields(runtime), "policy_format": trainer.POLICY_FORMAT}
    pending.commit(1, config.config_hash(runtime), "d", "authoritative", weights_sha256=out["saved"], extra=extra)
    assert export.export(tmp_path / "ranks", tmp_path / "hf") == tmp_path / "ranks" / "step_2"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert trainer.weights_sha256(model.state_dict()) == out["saved"]
