"""The policy network: a tiny decoder-only (causal) transformer in plain torch.

    tokens [B, T] ─ embed + position ─► n_layers × (x + Attn(LN x); x + MLP(LN x)) ─► LN ─► logits [B, T, V]

Used by the trainer (`grpo.trainer`, full-sequence log-probs) and by the generators
(`driver.generation_workers`, token-by-token sampling). Initial weights come from
`derive_seed(seed, "init")`, so every process builds the same version-0 policy.
The attention is written out (no fused kernel) so the same shapes give the same
bits on every CPU run.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from trainingrun_runtime import config
from trainingrun_runtime.grpo import seeding

__all__ = ["CausalTransformer", "build", "token_logprobs"]


class _Block(nn.Module):
    def __init__(self, cfg: config.ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        attn = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class CausalTransformer(nn.Module):
    """Token and position embeddings, pre-LN blocks, a final LayerNorm and an untied output head."""

    def __init__(self, cfg: config.ModelConfig, vocab_size: int, max_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = nn.Embedding(max_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] for next-token prediction at every position."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


def build(cfg: config.ModelConfig, vocab_size: int, max_len: int, seed: int) -> CausalTransformer:
    """The version-0 policy: same `seed` ⇒ same weights, whatever the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeding.derive_seed(seed, "init"))
        return CausalTransformer(cfg, vocab_size, max_len)


def token_logprobs(model: nn.Module, tokens: torch.Tensor, prompt_len: int, temperature: float) -> torch.Tensor:
    """log π(c_i | prefix) at `temperature` for every completion token: tokens [B, T] -> [B, T - prompt_len]."""
    logits = model(tokens[:, :-1])[:, prompt_len - 1 :] / temperature
    return torch.gather(F.log_softmax(logits, dim=-1), 2, tokens[:, prompt_len:, None]).squeeze(2)
