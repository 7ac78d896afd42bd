"""Benchmark: a ~100M-parameter policy on two data-parallel trainer ranks, and what a checkpoint blocks.

    two ranks (real processes, one gloo group, FSDP2; the Llama-shaped model of bench_checkpoint_100m), one trained
    step so that AdamW has its state, then in the same run:
        ckpt_sync_s_100m    = a save of weights + AdamW by both ranks done before training goes on: written
                              (`Trainer.save`), fsynced and hashed (`storage.commit.sync_and_hash`, the commit's part)
        ckpt_blocked_s_100m = the same save begun in the background (`Trainer.begin_save`): until training may go on;
                              the second such save (the first allocates the host copy: ckpt_first_blocked_s_100m)
        ckpt_blocked_vs_sync_100m = the two                                       goal <= 0.1, and blocked < 1 s
        ckpt_background_s_100m = its begin to every shard written, its checksum read back, fsynced and hashed
        step_s_during_background_save_vs_plain = a step trained while that write runs / a step with none
    the same steps on one rank:
        dp2_vs_dp1_tokens_per_s = tokens per second of a step on 2 ranks / on 1 (2 cores: this shows what the
            collectives cost here, not a speed-up)

Every figure is the slowest rank's. One run on this shared 2-core machine, no GPU: figures of this machine on this
day (docs/measurements.md). Writes them under "trainer_ranks" in bench-results.json.

    .venv/bin/python bench/bench_trainer_ranks.py
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tiny model directories of the test tooling

import results  # noqa: E402  (bench/results.py: bench-results.json)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from bench_checkpoint_100m import HIDDEN, LAYERS  # noqa: E402

from support import hfmodels  # noqa: E402
from trainingrun_runtime import config  # noqa: E402
from trainingrun_runtime.grpo import sharding, trainer  # noqa: E402
from trainingrun_runtime.storage import commit  # noqa: E402

ROWS, PROMPT, NEW = 8, 12, 8
"""A step's rows (split over the ranks), prompt tokens and completion tokens per row."""
STEPS = 3


def trainer_config(root: Path) -> config.TrainerConfig:
    return config.TrainerConfig.model_validate(
        {
            "model": {"path": str(root / "model")},
            "data": {"path": str(root / "problems.jsonl")},
            "reward": {"kind": "exact"},
            "generation": {"maxNewTokens": NEW},
            "grpo": {"groupSize": 2, "lr": 1e-5},
            "promptsPerStep": ROWS // 2,
        }
    )


def batch(rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """This rank's part of one fixed step: random tokens, behaviour log-probs near the policy's, ±1 advantages."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, len(hfmodels.vocab()), (ROWS, PROMPT + NEW), generator=g)
    logprobs = torch.full((ROWS, NEW), -3.0)
    advantages = torch.tensor([1.0, -1.0] * (ROWS // 2))
    mask = torch.ones(ROWS, NEW)
    lens = torch.full((ROWS,), PROMPT)
    part = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    return tokens[part], logprobs[part], advantages[part], mask[part], lens[part]


def slowest(seconds: float, world: int) -> float:
    if world == 1:
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def rank_main(rank: int, world: int, address: str, root: str) -> None:
    trainer.deterministic()
    if world > 1:
        sharding.join(address, rank, world)
    tr = trainer.Trainer(trainer_config(Path(root)), rank=rank, world=world)
    step = batch(rank, world)

    def timed_step() -> float:
        started = time.perf_counter()
        tr.train_step(*step)
        return slowest(time.perf_counter() - started, world)

    timed_step()  # AdamW's state exists from here
    plain = statistics.median(timed_step() for _ in range(STEPS))
    out: dict[str, Any] = {"step_s": plain, "tokens_per_s": ROWS * (PROMPT + NEW) / plain}
    if world > 1:
        started = time.perf_counter()
        tr.save(Path(root) / f"sync-{world}")
        if rank == 0:  # what the controller's commit does, once, before a step counts
            commit.sync_and_hash(Path(root) / f"sync-{world}")
        out["sync_s"] = slowest(time.perf_counter() - started, world)
        for name in ("first", "async"):  # the first background save allocates the host copy; later ones reuse it
            started = time.perf_counter()
            pending = tr.begin_save(Path(root) / f"{name}-{world}")
            out[f"{name}_blocked_s"] = slowest(time.perf_counter() - started, world)
            out[f"{name}_step_during_write_s"] = timed_step()
            pending.finish()
            if rank == 0:
                commit.sync_and_hash(Path(root) / f"{name}-{world}")
            out[f"{name}_background_s"] = slowest(time.perf_counter() - started, world)
    if rank == 0:
        (Path(root) / f"out-{world}.json").write_text(json.dumps(out))
    if world > 1:
        dist.destroy_process_group()


def ranks(world: int, root: Path) -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    mp.spawn(rank_main, args=(world, address, str(root)), nprocs=world, join=True)
    out: dict[str, Any] = json.loads((root / f"out-{world}.json").read_text())
    return out


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="bench-trainer-ranks-"))
    try:
        from safetensors.torch import load_file

        hfmodels.llama_dir(root / "model", hidden=HIDDEN, layers=LAYERS, heads=12)
        params = sum(t.numel() for t in load_file(root / "model" / "model.safetensors").values())
        with open(root / "problems.jsonl", "w") as f:
            f.writelines(json.dumps({"prompt": f"{i} + 1 =", "answer": "answer"}) + "\n" for i in range(8))
        two, one = ranks(2, root), ranks(1, root)
        size = sum(p.stat().st_size for p in (root / "async-2").iterdir())
        figures = {
            "trainer_ranks_model_parameters_100m": params,
            "ckpt_bytes_2_ranks_100m": size,
            "ckpt_sync_s_100m": two["sync_s"],
            "ckpt_blocked_s_100m": two["async_blocked_s"],
            "ckpt_blocked_vs_sync_100m": two["async_blocked_s"] / two["sync_s"],
            "ckpt_first_blocked_s_100m": two["first_blocked_s"],
            "ckpt_background_s_100m": two["async_background_s"],
            "step_s_2_ranks_100m": two["step_s"],
            "step_s_during_background_save_vs_plain": two["async_step_during_write_s"] / two["step_s"],
            "step_s_1_rank_100m": one["step_s"],
            "dp2_vs_dp1_tokens_per_s": two["tokens_per_s"] / one["tokens_per_s"],
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
        results.merge("trainer_ranks", figures)
        for key, value in figures.items():
            print(f"{key:<42} {value:.3f}" if isinstance(value, float) else f"{key:<42} {value}")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"bench_trainer_ranks: {time.monotonic() - started:.0f} s", file=sys.stderr)
    sys.exit(code)
