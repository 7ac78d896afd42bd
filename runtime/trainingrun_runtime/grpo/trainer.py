"""The trainer's state and one GRPO update, in plain torch (the trainer Ray actor wraps this).

    batch {tokens [B,T], logprobs [B,L] (behaviour policy), advantages [B]}
        ─► policy.completion_logprobs(π_θ) ─► objective.policy_loss (+ β·KL to π_ref) ─► backward ─► clip ─► AdamW

`version` counts optimizer steps taken on whole batches (updates_per_batch inner
steps count once), so version t is the policy after t training steps. State on disk,
under the bundle's `policy/`: `model.pt` (weights), `optimizer.pt` (AdamW state) and
`trainer.json` (version), all plain tensors and numbers: `torch.load(...,
weights_only=True)` reads them. `weights_sha256` is the SHA-256 over the weights in
canonical order (see `weights_sha256`), identical for bit-identical weights.

Determinism: callers set `deterministic()` once per process (one thread,
deterministic algorithms); batches arrive ordered by (uid, row).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from trainingrun_runtime import config
from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.grpo import objective, policy, workload
from trainingrun_runtime.storage import files
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = ["Trainer", "deterministic", "weights_sha256"]

POLICY_FORMAT = "hf-gpt2/1"
"""What `model.pt` and `optimizer.pt` hold, in each manifest's `extra.policy_format`: the state dict of the Hugging
Face model the config builds (`grpo.builtin`'s GPT-2, or the model from `model.path`) and of its AdamW. A manifest
without it was written by a version whose built-in model was a
hand-written transformer, which this version cannot load (`driver.restore.check_config` refuses it)."""
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "trainer.json"


def deterministic() -> None:
    """Make this process's torch bit-reproducible on CPU: one intra-op thread, deterministic kernels."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs, on a GPU
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def weights_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over `name \\x1f dtype \\x1f shape \\x1e raw-bytes` for each tensor, names sorted."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}\x1f{t.dtype}\x1f{tuple(t.shape)}\x1e".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class Trainer:
    """The policy being trained, its optimizer, an optional frozen reference, and the version counter."""

    def __init__(self, cfg: config.TrainerConfig) -> None:
        self.cfg = cfg
        self.work = workload.Workload(cfg, with_prompts=False)
        self.model = self.work.new_model()
        g = cfg.grpo
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=g.lr, betas=g.adam_betas, weight_decay=g.weight_decay, foreach=False
        )
        self.reference: Any = None
        if g.kl_coef is not None:
            self.reference = self.work.new_model().eval()
            self.reference.requires_grad_(False)
        self.version = 0

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy of the weights in host memory (what generators load, wherever their device is)."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def weights_sha256(self) -> str:
        """`weights_sha256` of the current weights."""
        return weights_sha256(self.model.state_dict())

    def train_step(
        self,
        tokens: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor | None = None,
        prompt_lens: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """One training step (updates_per_batch optimizer steps) on one batch; version += 1.

        `mask` [B, L] (1 for each generated token) and `prompt_lens` [B] come with rows of varying length
        (`workload.ROW_FIELDS`); without them every completion fills its L tokens after a prompt of the built-in
        task's length."""
        g = self.cfg.grpo
        mask = torch.ones_like(old_logp) if mask is None else mask.float()
        if prompt_lens is None:
            prompt_lens = torch.full((tokens.shape[0],), self.work.prompt_width)
        ref_logp = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logp = self._logprobs(self.reference, tokens, prompt_lens)
        stats: dict[str, float] = {}
        for _ in range(g.updates_per_batch):
            logp = self._logprobs(self.model, tokens, prompt_lens)
            loss, loss_stats = objective.policy_loss(logp, old_logp, advantages, mask, g.clip_eps, g.kl_coef, ref_logp)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), g.max_grad_norm)
            self.optimizer.step()
            stats = {
                "loss": float(loss.detach()),
                "pg_loss": loss_stats.pg_loss,
                "kl": loss_stats.kl,
                "clip_frac": loss_stats.clip_frac,
                "grad_norm": float(grad_norm),
            }
        self.version += 1
        return stats

    def _logprobs(self, model: Any, tokens: torch.Tensor, prompt_lens: torch.Tensor) -> torch.Tensor:
        s = self.work.sampling
        return policy.completion_logprobs(model, tokens, prompt_lens, s.max_new_tokens, s.temperature)

    def save(self, directory: str | os.PathLike[str]) -> str:
        """Write model.pt, optimizer.pt and trainer.json into `directory` (created); return weights_sha256."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), path / MODEL_FILE)
        torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)
        (path / STATE_FILE).write_text(json.dumps({"version": self.version}))
        return self.weights_sha256()

    def load(self, directory: str | os.PathLike[str], expected: Mapping[str, FileEntry] | None = None) -> str:
        """Read what `save` wrote (weights_only=True); return weights_sha256 of the loaded weights.

        With `expected` (the bundle manifest's entries of `policy/`, by file name), each file is read from the
        descriptor its size and checksum were checked through (`files.open_checked`; CheckpointCorrupt naming
        the file), so what is loaded is what was verified, in this process."""
        path = Path(directory)
        with self._open(path, MODEL_FILE, expected) as f:
            self.model.load_state_dict(torch.load(f, weights_only=True, map_location="cpu"))
        with self._open(path, OPTIMIZER_FILE, expected) as f:  # AdamW moves its state onto the parameters' device
            self.optimizer.load_state_dict(torch.load(f, weights_only=True, map_location="cpu"))
        with self._open(path, STATE_FILE, expected) as f:
            self.version = int(json.loads(f.read())["version"])
        return self.weights_sha256()

    @staticmethod
    def _open(path: Path, name: str, expected: Mapping[str, FileEntry] | None) -> BinaryIO:
        if expected is None:
            return open(path / name, "rb")
        if name not in expected:
            raise CheckpointCorrupt(f"{path / name}: not in the manifest of this checkpoint")
        return files.open_checked(path / name, expected[name])
