"""GRPO math against hand-computed values: group advantages, the clipped loss, the k3 KL term."""

from __future__ import annotations

import math

import pytest
import torch

from trainingrun_runtime.grpo import objective


def test_advantages_are_normalised_within_each_group_with_the_sample_std() -> None:
    rewards = torch.tensor([[0.0, 0.25, 0.5, 1.0]])
    # mean 0.4375; squared deviations sum to 0.546875; unbiased var 0.182291667; std 0.426956...
    expected = torch.tensor([[-1.024695, -0.439155, 0.146385, 1.317465]])
    assert torch.allclose(objective.group_advantages(rewards, eps=0.0), expected, atol=1e-5)


def test_a_group_with_equal_rewards_gets_zero_advantage_not_nan() -> None:
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    adv = objective.group_advantages(rewards, eps=1e-4)
    assert torch.allclose(
        adv[0], torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)]) / (1 + 1e-4 * math.sqrt(2)), atol=1e-6
    )
    assert adv[1].tolist() == [0.0, 0.0]


def _loss(ratio: list[float], adv: list[float], **kw: object) -> tuple[torch.Tensor, objective.LossStats]:
    logp = torch.log(torch.tensor([ratio]).T)  # [B, 1] with old_logp = 0
    return objective.policy_loss(logp, torch.zeros_like(logp), torch.tensor(adv), torch.ones_like(logp), **kw)  # type: ignore[arg-type]


def test_the_clipped_loss_takes_the_pessimistic_side_in_all_four_cases() -> None:
    # ratio 1.5, A=+1: max(-1.5, -1.2) = -1.2   (gain capped)
    # ratio 1.5, A=-1: max( 1.5,  1.2) =  1.5   (loss not capped)
    # ratio 0.5, A=+1: max(-0.5, -0.8) = -0.5
    # ratio 0.5, A=-1: max( 0.5,  0.8) =  0.8
    loss, stats = _loss([1.5, 1.5, 0.5, 0.5], [1.0, -1.0, 1.0, -1.0], clip_eps=0.2)
    assert loss.item() == pytest.approx((-1.2 + 1.5 - 0.5 + 0.8) / 4)
    assert stats.clip_frac == pytest.approx(1.0)
    assert stats.kl == 0.0


def test_on_policy_the_gradient_is_minus_advantage_over_token_count() -> None:
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    loss, stats = objective.policy_loss(logp, torch.zeros(2, 3), adv, torch.ones(2, 3), clip_eps=0.2)
    loss.backward()  # type: ignore[no-untyped-call]
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([[-2.0] * 3, [1.0] * 3]) / 6)
    assert stats.clip_frac == 0.0


def test_masked_tokens_do_not_count() -> None:
    logp = torch.log(torch.tensor([[1.5, 9.0]]))
    mask = torch.tensor([[1.0, 0.0]])
    loss, _ = objective.policy_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]), mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(-1.2)


def test_the_kl_term_is_the_k3_estimator_weighted_by_beta() -> None:
    logp = torch.zeros(1, 1)
    ref = torch.log(torch.tensor([[2.0]]))
    loss, stats = objective.policy_loss(
        logp, torch.zeros(1, 1), torch.tensor([0.0]), torch.ones(1, 1), clip_eps=0.2, kl_coef=0.5, ref_logp=ref
    )
    k3 = 2.0 - math.log(2.0) - 1.0
    assert stats.kl == pytest.approx(k3)
    assert loss.item() == pytest.approx(0.5 * k3)


def test_kl_without_reference_log_probs_is_an_error() -> None:
    with pytest.raises(ValueError, match="reference"):
        objective.policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), 0.2, kl_coef=0.1)
