"""Seeds derived from names, never from running RNG state.

Every random draw in a run — the policy's initial weights, each prompt, each epoch's
shuffle, each sampled completion — takes its seed from `derive_seed(seed, *parts)`,
e.g. `derive_seed(seed, "sample", uid, row, version)`. The value depends only on the
parts, so the order in which workers run, how many there are, and whether the run
was restarted in between cannot change a draw. That is what makes exact resume
possible. Pure standard library; `group_sampling` and `builtin` turn a seed into a
`torch.Generator`.
"""

from __future__ import annotations

import hashlib

__all__ = ["derive_seed"]


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from the SHA-256 of the parts' reprs (type-tagged, so 1 and "1" differ)."""
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1
