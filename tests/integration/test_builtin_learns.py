"""The built-in example learns on the Hugging Face path: tiny.yaml's model, task and GRPO settings, 120 steps in one
process (no Ray): the built-in GPT-2, `policy.sample` with per-sample draws, the partial-credit reward, group
advantages, `policy.completion_logprobs` and the clipped loss."""

from __future__ import annotations

import statistics

import pytest
import torch

from trainingrun_runtime import config
from trainingrun_runtime.grpo import builtin, objective, policy, seeding, task, trainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_tiny_example_learns_from_about_a_quarter_to_most_of_the_reward() -> None:
    trainer.deterministic()
    cfg = config.TrainerConfig(
        prompts_per_step=8,
        model=config.ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64),
        task=config.TaskConfig(kind="reverse", digits=4, length=3, dataset_size=512),
        grpo=config.GRPOConfig(group_size=4, lr=0.01),
    )
    the_task = task.Task(cfg.task, cfg.seed)
    model, tok, prompts = (
        builtin.model(cfg.model, the_task, cfg.seed),
        builtin.tokenizer(cfg.task),
        builtin.Prompts(the_task),
    )
    g = cfg.grpo
    sampling = policy.Sampling(max_new_tokens=the_task.completion_len, temperature=g.temperature)
    optimizer = torch.optim.AdamW(model.parameters(), lr=g.lr, betas=g.adam_betas, foreach=False)
    means = []
    for step in range(120):
        rows, logps, rewards = [], [], []
        for uid in range(step * 8, step * 8 + 8):
            index = uid % len(prompts)
            draws = torch.stack(
                [
                    torch.rand(
                        sampling.max_new_tokens,
                        generator=torch.Generator().manual_seed(seeding.derive_seed(cfg.seed, "sample", uid, r, step)),
                    )
                    for r in range(g.group_size)
                ]
            )
            got = policy.sample(model, tok, tok(prompts.prompt_of(index))["input_ids"], draws, sampling)
            rows.append(got.tokens)
            logps.append(got.logprobs)
            answer = prompts.answer_of(index)
            rewards.append(torch.tensor([builtin.partial_credit("", text, answer) for text in got.texts]))
        r = torch.stack(rewards)
        advantages = objective.group_advantages(r, g.adv_eps).flatten()
        tokens, old = torch.cat(rows), torch.cat(logps)
        logp = policy.completion_logprobs(
            model, tokens, torch.full((len(tokens),), the_task.prompt_len), the_task.completion_len, g.temperature
        )
        loss, _ = objective.policy_loss(logp, old, advantages, torch.ones_like(old), g.clip_eps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), g.max_grad_norm)
        optimizer.step()
        means.append(float(r.mean()))
    first, last = statistics.mean(means[:20]), statistics.mean(means[-20:])
    assert first < 0.45, means[:20]
    assert last > 0.65, f"first 20 steps {first:.2f}, last 20 {last:.2f}"
