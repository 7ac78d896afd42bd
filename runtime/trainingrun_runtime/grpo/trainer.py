"""The trainer's state and one GRPO update, in plain torch (the trainer Ray actors wrap this).

    batch {tokens [B,T], logprobs [B,L] (behaviour policy), advantages [B]}
        ─► policy.completion_logprobs(π_θ) ─► objective.policy_loss (+ β·KL to π_ref) ─► backward ─► clip ─► AdamW

`version` counts optimizer steps taken on whole batches (updates_per_batch inner
steps count once), so version t is the policy after t training steps. `weights_sha256`
is the SHA-256 over the weights in canonical order (see `weights_sha256`), identical
for bit-identical weights.

Data parallel (`spec.trainer.trainerWorkers` = N > 1): N processes, each a `Trainer` of rank r in one
`torch.distributed` group, with the policy (and the reference) sharded by FSDP2 (`sharding`). Each takes its part of
the step's batch; every masked mean divides by the whole batch's token count over N and FSDP averages the N
gradients, so the update is that of the whole batch. The same N resumes bit-exactly; another N resumes the same
state, with other rounding.

State on disk, under the bundle's `policy/` (`POLICY_FORMAT`): the weights and AdamW state in DCP form (`.metadata`
and one `__<rank>_0.distcp` per rank that wrote it, loadable by any number of ranks) and `trainer.json` (version,
ranks). Checkpoints of earlier versions (`LEGACY_FORMAT`: `model.pt`, `optimizer.pt`) still load on one rank.

Determinism: callers set `deterministic()` once per process (one thread,
deterministic algorithms); batches arrive ordered by (uid, row).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, BinaryIO

import torch

from trainingrun_runtime import config
from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.grpo import objective, policy, sharding, workload
from trainingrun_runtime.storage import files
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = [
    "FORMATS",
    "LEGACY_FORMAT",
    "POLICY_FORMAT",
    "PendingSave",
    "Trainer",
    "deterministic",
    "weights_sha256",
]

POLICY_FORMAT = "hf-dcp/1"
"""What `policy/` holds, in each manifest's `extra.policy_format`: the state dicts of the Hugging Face model the
config builds (`grpo.builtin`'s GPT-2, or the model from `model.path`) and of its AdamW, keyed by parameter name, in
DCP form (`sharding.save`), with `trainer.json`."""
LEGACY_FORMAT = "hf-gpt2/1"
"""The same state as one `model.pt` and one `optimizer.pt` (written by one trainer process, before trainerWorkers):
still loaded, on one rank. A manifest without a format was written by a version whose built-in model was a
hand-written transformer, which this version cannot load (`driver.restore.check_config` refuses it)."""
FORMATS = (POLICY_FORMAT, LEGACY_FORMAT)
"""The policy formats this version loads."""
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


class PendingSave:
    """A `Trainer.begin_save` whose write may still be going on."""

    def __init__(self, path: Path, future: Future[None], rank: int, version: int) -> None:
        self.path, self._future, self._rank = path, future, rank
        self.version = version
        """The trainer's version when the save began: the state being written."""

    def finish(self) -> str:
        """Wait for the write (re-raising its failure); weights_sha256 of the weights the files hold, read back
        from them (rank 0; `""` on the others)."""
        self._future.result()
        return weights_sha256(sharding.read_weights(self.path)) if self._rank == 0 else ""


class Trainer:
    """The policy being trained, its optimizer, an optional frozen reference, and the version counter.

    With `world` > 1 this is rank `rank` of the data-parallel ranks, in a process group already joined
    (`sharding.join`); every method but `train_step`'s arguments is then called on all ranks together."""

    def __init__(self, cfg: config.TrainerConfig, *, rank: int = 0, world: int = 1) -> None:
        self.cfg = cfg
        self.rank, self.world = rank, world
        self.work = workload.Workload(cfg, with_prompts=False)
        self.model = self.work.new_model()  # the same first weights on every rank; sharded below
        if world > 1:
            sharding.shard(self.model)
        g = cfg.grpo
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=g.lr, betas=g.adam_betas, weight_decay=g.weight_decay, foreach=False
        )
        self.reference: Any = None
        if g.kl_coef is not None:
            self.reference = self.work.new_model().eval()
            self.reference.requires_grad_(False)
            if world > 1:
                sharding.shard(self.reference)
        self.version = 0

    def weights(self) -> dict[str, torch.Tensor]:
        """A detached copy of the whole weights in host memory (what generators load, wherever their device is);
        `{}` on every rank but 0."""
        if self.world > 1:
            return sharding.full_weights(self.model)
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def weights_sha256(self) -> str:
        """`weights_sha256` of the whole current weights (`""` on every rank but 0)."""
        if self.world > 1:
            whole = sharding.full_weights(self.model)
            return weights_sha256(whole) if self.rank == 0 else ""
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
        task's length. With several ranks, the batch is this rank's part of the step's, and the stats returned
        are the whole step's."""
        g = self.cfg.grpo
        mask = torch.ones_like(old_logp) if mask is None else mask.float()
        share = None
        if self.world > 1:  # each mean divides by the whole batch's tokens over N: FSDP averages the N gradients
            share = mask.sum()
            torch.distributed.all_reduce(share)
            share = share / self.world
        if prompt_lens is None:
            prompt_lens = torch.full((tokens.shape[0],), self.work.prompt_width)
        ref_logp = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logp = self._logprobs(self.reference, tokens, prompt_lens)
        stats: dict[str, float] = {}
        for _ in range(g.updates_per_batch):
            logp = self._logprobs(self.model, tokens, prompt_lens)
            loss, loss_stats = objective.policy_loss(
                logp, old_logp, advantages, mask, g.clip_eps, g.kl_coef, ref_logp, tokens=share
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), g.max_grad_norm)
            self.optimizer.step()
            parts = [float(loss.detach()), loss_stats.pg_loss, loss_stats.kl, loss_stats.clip_frac]
            if self.world > 1:  # N × each rank's share of the whole batch's means: their mean is the step's
                summed = torch.tensor(parts, dtype=torch.float64)
                torch.distributed.all_reduce(summed)
                parts = (summed / self.world).tolist()
                grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            stats = dict(zip(("loss", "pg_loss", "kl", "clip_frac"), parts, strict=True))
            stats["grad_norm"] = float(grad_norm)
        self.version += 1
        return stats

    def _logprobs(self, model: Any, tokens: torch.Tensor, prompt_lens: torch.Tensor) -> torch.Tensor:
        s = self.work.sampling
        return policy.completion_logprobs(model, tokens, prompt_lens, s.max_new_tokens, s.temperature)

    def save(self, directory: str | os.PathLike[str]) -> str:
        """Write this rank's shard of the weights and optimizer state into `directory` (created), and on rank 0
        trainer.json; return weights_sha256 (`""` on every rank but 0). All ranks call it together."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        sharding.save(path, self.model, self.optimizer)
        self._write_state(path)
        return self.weights_sha256()

    def begin_save(self, directory: str | os.PathLike[str]) -> PendingSave:
        """`save`, but returning once this rank's state is copied into host memory: the write goes on in the
        background while the caller trains (`PendingSave.finish` waits for it). All ranks call it together."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        future = sharding.save_async(path, self.model, self.optimizer)
        self._write_state(path)
        return PendingSave(path, future, self.rank, self.version)

    def load(self, directory: str | os.PathLike[str], expected: Mapping[str, FileEntry] | None = None) -> str:
        """Read what `save` wrote, by any number of ranks (or one `LEGACY_FORMAT` bundle, on one rank); return
        weights_sha256 of the loaded weights (`""` on every rank but 0). All ranks call it together.

        With `expected` (the bundle manifest's entries of `policy/`, by file name), each file is read from the
        descriptor its size and checksum were checked through (`files.open_checked`; CheckpointCorrupt naming
        the file), so what is loaded is what was verified, in this process."""
        path = Path(directory)
        names = set(expected) if expected is not None else {p.name for p in path.iterdir()}
        if sharding.is_checkpoint(names):
            sharding.load(path, self.model, self.optimizer, expected)
        elif self.world > 1:  # driver.restore.check_config refuses this before any trainer reads
            raise RuntimeError(f"{path}: a {LEGACY_FORMAT} checkpoint loads on one trainer worker only")
        else:
            with self._open(path, MODEL_FILE, expected) as f:
                self.model.load_state_dict(torch.load(f, weights_only=True, map_location="cpu"))
            with self._open(path, OPTIMIZER_FILE, expected) as f:  # AdamW moves its state onto the parameters' device
                self.optimizer.load_state_dict(torch.load(f, weights_only=True, map_location="cpu"))
        with self._open(path, STATE_FILE, expected) as f:
            self.version = int(json.loads(f.read())["version"])
        return self.weights_sha256()

    def _write_state(self, path: Path) -> None:
        """trainer.json (the version, the ranks that wrote the shards), on rank 0 only."""
        if self.rank == 0:
            (path / STATE_FILE).write_text(json.dumps({"version": self.version, "trainer_workers": self.world}))

    @staticmethod
    def _open(path: Path, name: str, expected: Mapping[str, FileEntry] | None) -> BinaryIO:
        if expected is None:
            return open(path / name, "rb")
        if name not in expected:
            raise CheckpointCorrupt(f"{path / name}: not in the manifest of this checkpoint")
        return files.open_checked(path / name, expected[name])
