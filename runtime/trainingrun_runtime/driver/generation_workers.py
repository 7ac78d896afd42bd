"""Generation workers: Ray actors that sample GRPO groups with versioned policy weights.

    trainer ──weights(version v)──► Generator.load_weights(v, ·)      (weight sync, after each train step)
    controller ──generate(uid, index, version)──► Generator ──► rows {tokens, logprobs, rewards} of version v

A `Generator` is a plain class (tested without Ray); `spawn` wraps it as Ray actors.
Each actor holds exactly one policy version. `generate` with an explicit version
(the in_order sampler) refuses to run on other weights — a scheduling bug, not a
retry; with `version=None` (the async sampler) it uses whatever it holds and says
which. The sample itself is a function of (weights, seed, uid, row, version) only
(`group_sampling.sample_group`), so which actor runs it does not matter.
"""

from __future__ import annotations

import logging
from typing import Any, TypedDict

import torch

from trainingrun_runtime import config
from trainingrun_runtime.grpo import group_sampling, task, trainer, transformer

__all__ = ["GeneratedGroup", "Generator", "spawn"]

log = logging.getLogger(__name__)


class GeneratedGroup(TypedDict):
    """What `generate` returns: one group's rows and the version that produced them."""

    uid: int
    version: int
    tokens: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor


class Generator:
    """One copy of the policy at one version, and the sampler that uses it."""

    def __init__(self, cfg: config.TrainerConfig) -> None:
        trainer.deterministic()
        self.cfg = cfg
        self.task = task.Task(cfg.task, cfg.seed)
        self.model = transformer.build(cfg.model, self.task.vocab_size, self.task.seq_len, cfg.seed)
        self.model.eval()
        self.version = 0

    def load_weights(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        """Replace the weights with those of `version`; returns the version now held."""
        self.model.load_state_dict(weights)
        self.version = version
        return version

    def current_version(self) -> int:
        """The version of the weights held now."""
        return self.version

    def generate(self, uid: int, index: int, version: int | None) -> GeneratedGroup:
        """Sample the group of prompt `uid` (dataset `index`) with the held weights."""
        if version is not None and version != self.version:
            raise RuntimeError(
                f"asked to generate uid {uid} with version {version}, but this worker holds {self.version}"
            )
        g = self.cfg.grpo
        group = group_sampling.sample_group(
            self.model, self.task, self.task.digits_of(index), uid, self.version, g.group_size, g.temperature
        )
        return GeneratedGroup(
            uid=uid, version=self.version, tokens=group.tokens, logprobs=group.logprobs, rewards=group.rewards
        )


def spawn(cfg: config.TrainerConfig, name_prefix: str) -> list[Any]:
    """`cfg.generation_workers` Generator actors (one CPU thread each; `num_cpus=0`: tiny and CPU-only)."""
    import ray

    actor_cls = ray.remote(num_cpus=0, max_restarts=0)(Generator)
    return [actor_cls.options(name=f"{name_prefix}-gen-{i}").remote(cfg) for i in range(cfg.generation_workers)]
