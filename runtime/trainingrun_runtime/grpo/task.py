"""The synthetic task: a digit string in, a transformed digit string out, partial credit.

    prompt  = d_1 … d_L                       (digits in [0, digits))
    answer  = reverse | copy | increment(prompt)
    reward  = (1/L) · Σ_i [completion_i == answer_i]     ∈ {0, 1/L, …, 1}

Partial credit gives a dense signal, so a random policy (expected reward 1/digits)
improves visibly within a few hundred GRPO updates on a CPU. Token layout of one
sequence, shared by the model, the generators and the trainer:

    [BOS] d_1 … d_L [SEP] c_1 … c_L       token(d) = d + 2,  BOS = 0, SEP = 1

Pure standard library: prompts are derived from (seed, prompt index) by `seeding`.
"""

from __future__ import annotations

import dataclasses
import random

from trainingrun_runtime import config
from trainingrun_runtime.grpo import seeding

__all__ = ["BOS", "SEP", "Task"]

BOS = 0
SEP = 1
_OFFSET = 2


@dataclasses.dataclass(frozen=True)
class Task:
    """The task's vocabulary, prompts and verifier for one `TaskConfig` and run seed."""

    cfg: config.TaskConfig
    seed: int

    @property
    def vocab_size(self) -> int:
        """BOS, SEP and one token per digit."""
        return self.cfg.digits + _OFFSET

    @property
    def prompt_len(self) -> int:
        """Tokens before the completion: BOS, L digits, SEP."""
        return self.cfg.length + 2

    @property
    def completion_len(self) -> int:
        """Tokens the policy generates: exactly L digits."""
        return self.cfg.length

    @property
    def seq_len(self) -> int:
        """Prompt plus completion."""
        return self.prompt_len + self.completion_len

    def digits_of(self, index: int) -> list[int]:
        """The digits of dataset prompt `index` (0 <= index < dataset_size), derived from (seed, index)."""
        rng = random.Random(seeding.derive_seed(self.seed, "prompt", index))
        return [rng.randrange(self.cfg.digits) for _ in range(self.cfg.length)]

    def prompt_tokens(self, digits: list[int]) -> list[int]:
        """`[BOS] d_1 … d_L [SEP]` as token ids."""
        return [BOS, *(d + _OFFSET for d in digits), SEP]

    def answer(self, digits: list[int]) -> list[int]:
        """The correct completion digits for a prompt."""
        if self.cfg.kind == "reverse":
            return list(reversed(digits))
        if self.cfg.kind == "copy":
            return list(digits)
        return [(d + 1) % self.cfg.digits for d in digits]

    def reward(self, digits: list[int], completion_tokens: list[int]) -> float:
        """Fraction of completion positions equal to the answer (a non-digit token is simply wrong)."""
        answer = self.answer(digits)
        hits = sum(int(t - _OFFSET == a) for t, a in zip(completion_tokens, answer, strict=True))
        return hits / len(answer)
