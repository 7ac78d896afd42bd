"""GRPO math (Shao et al., 2024, DeepSeekMath §4.1), written to read like the paper.

    rewards r[p, g] for G completions g of each prompt p
    Â[p, g]   = (r[p, g] - mean_g r[p, :]) / (std_g r[p, :] + eps)         group-normalised advantage
    ρ[i, t]   = exp(log π_θ(o_t) - log π_old(o_t))                          importance ratio
    L_clip    = max(-Â·ρ, -Â·clip(ρ, 1-ε, 1+ε))                             per token
    KL        = exp(log π_ref - log π_θ) - (log π_ref - log π_θ) - 1        k3 estimator, ≥ 0
    loss      = masked mean over tokens of (L_clip + β·KL)

`std` is the unbiased sample standard deviation (as in TRL's GRPO). A group whose
rewards are all equal gets advantage 0 everywhere and contributes no gradient. Pure
torch, no Ray; called by the controller's advantage stage (`group_advantages`) and
by the trainer (`policy_loss`).
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["LossStats", "group_advantages", "policy_loss"]


def group_advantages(rewards: torch.Tensor, eps: float) -> torch.Tensor:
    """Â = (r - mean_g r) / (std_g r + eps) for rewards [P, G]; returns [P, G]."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return (rewards - mean) / (std + eps)


@dataclasses.dataclass(frozen=True)
class LossStats:
    """Diagnostics of one loss evaluation (detached floats)."""

    pg_loss: float
    kl: float
    clip_frac: float


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    kl_coef: float | None = None,
    ref_logp: torch.Tensor | None = None,
    tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The clipped GRPO objective (to minimise) for token log-probs [B, T], sequence advantages [B].

    `tokens` is what the masked means divide by, when it is not this batch's `mask.sum()`: a data-parallel rank
    holds part of the step's batch and divides by the whole batch's token count, so that the ranks' losses (and
    gradients) sum to the whole batch's."""
    adv = advantages[:, None]
    ratio = torch.exp(logp - old_logp)
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.max(pg_loss1, pg_loss2)
    n = mask.sum() if tokens is None else tokens
    pg_loss = (per_token * mask).sum() / n
    kl_value = torch.zeros((), dtype=logp.dtype)
    loss = pg_loss
    if kl_coef is not None:
        if ref_logp is None:
            raise ValueError("kl_coef is set but no reference log-probs were given")
        log_ratio_ref = ref_logp - logp
        kl_per_token = torch.exp(log_ratio_ref) - log_ratio_ref - 1.0
        kl_value = (kl_per_token * mask).sum() / n
        loss = pg_loss + kl_coef * kl_value
    clipped = ((ratio - 1.0).abs() > clip_eps).to(logp.dtype)
    stats = LossStats(
        pg_loss=float(pg_loss.detach()),
        kl=float(kl_value.detach()),
        clip_frac=float(((clipped * mask).sum() / n).detach()),
    )
    return loss, stats
