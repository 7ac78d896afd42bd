"""The task, the model and group sampling: deterministic from names, independent of batching and history."""

from __future__ import annotations

from typing import Any

import torch

from trainingrun_runtime import config
from trainingrun_runtime.grpo import builtin, group_sampling, policy, seeding, task, workload


def _setup(seed: int = 0) -> tuple[task.Task, Any]:
    cfg = config.TrainerConfig(seed=seed)
    the_task = task.Task(cfg.task, cfg.seed)
    return the_task, builtin.model(cfg.model, the_task, cfg.seed)


def _group(the_task: task.Task, m: Any, index: int, uid: int, version: int, temperature: float = 1.0) -> Any:
    cfg = config.TrainerConfig.model_validate(
        {"seed": the_task.seed, "grpo": {"groupSize": 8}, "generation": {"temperature": temperature}}
    )
    return group_sampling.sample_group(m, workload.Workload(cfg), index, uid=uid, version=version)


def test_derived_seeds_depend_only_on_their_parts() -> None:
    assert seeding.derive_seed(0, "sample", 3, 1, 7) == seeding.derive_seed(0, "sample", 3, 1, 7)
    assert seeding.derive_seed(0, "sample", 3, 1, 7) != seeding.derive_seed(0, "sample", 3, 1, 8)
    assert seeding.derive_seed(1) != seeding.derive_seed("1")
    assert 0 <= seeding.derive_seed(5) < 2**63


def test_reward_gives_partial_credit_per_position() -> None:
    the_task = task.Task(config.TaskConfig(kind="reverse", digits=6, length=4), seed=0)
    digits = [1, 2, 3, 4]
    right = [t + 2 for t in [4, 3, 2, 1]]
    assert the_task.reward(digits, right) == 1.0
    assert the_task.reward(digits, [6, 5, 0, 0]) == 0.5  # two digits right, BOS counts as wrong
    assert task.Task(config.TaskConfig(kind="increment", digits=6), 0).answer([5, 0]) == [0, 1]
    assert builtin.partial_credit("1 2 3 4", "4 3 <s> <s>", "4 3 2 1") == 0.5


def test_prompts_are_derived_from_the_seed() -> None:
    a = task.Task(config.TaskConfig(), seed=0)
    assert a.digits_of(7) == task.Task(a.cfg, 0).digits_of(7)
    assert [a.digits_of(i) for i in range(20)] != [task.Task(a.cfg, 1).digits_of(i) for i in range(20)]


def test_the_initial_policy_ignores_the_global_rng() -> None:
    torch.manual_seed(123)
    _, m1 = _setup()
    torch.manual_seed(456)
    _, m2 = _setup()
    for p1, p2 in zip(m1.parameters(), m2.parameters(), strict=True):
        assert torch.equal(p1, p2)


def test_a_group_is_the_same_whatever_ran_before_it() -> None:
    the_task, m = _setup()
    first = _group(the_task, m, index=3, uid=3, version=0)
    torch.rand(1000)
    _group(the_task, m, index=4, uid=4, version=0)
    again = _group(the_task, m, index=3, uid=3, version=0)
    assert torch.equal(first.tokens, again.tokens)
    assert torch.equal(first.logprobs, again.logprobs)
    assert torch.equal(first.rewards, again.rewards)
    other_version = _group(the_task, m, index=3, uid=3, version=1)
    assert not torch.equal(first.tokens, other_version.tokens)


def test_recorded_log_probs_match_the_trainers_full_forward() -> None:
    the_task, m = _setup()
    group = _group(the_task, m, index=0, uid=0, version=0, temperature=0.7)
    with torch.no_grad():
        full = policy.completion_logprobs(
            m, group.tokens, torch.full((8,), the_task.prompt_len), the_task.completion_len, temperature=0.7
        )
    assert group.tokens.shape == (8, the_task.seq_len)
    assert torch.allclose(full, group.logprobs, atol=1e-5)
    assert group.rewards.shape == (8,) and group.prompt_len == the_task.prompt_len
    assert set(group.fields(variable=False)) == {"tokens", "logprobs", "rewards"}
    assert set(group.fields(variable=True)) == {"tokens", "logprobs", "rewards", "prompt_len", "mask"}


def test_the_rewards_are_the_tasks_partial_credit_of_the_sampled_tokens() -> None:
    the_task, m = _setup()
    group = _group(the_task, m, index=5, uid=5, version=0)
    completions = group.tokens[:, the_task.prompt_len :].tolist()
    assert group.rewards.tolist() == [the_task.reward(the_task.digits_of(5), c) for c in completions]
