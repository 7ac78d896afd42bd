"""The trainers as the controller sees them: the trainer worker(s), plus, on the driver, the bootstrap data-plane
client.

    driver setup                                   controller actor, every step
    ─────────────                                  ─────────────────────────────
    Trainers(cfg) ─► BootstrapDataPlane.start()    train(sample_ids) ─► TrainerWorker reads rows from TQ
                 └─► TrainerWorker (Ray actor)                          (tokens, logprobs, advantages) ─► GRPO step
    load_data_plane_checkpoint(dir) ─► token       weights_ref() ─► ObjectRef of the new weights (weight sync)
    (or start_fresh() ─► token)                    save(dir) ─► policy/ files + weights_sha256
    load(policy dir) ─► weights_sha256

`Trainers` is what NeMo RL calls `TQPolicy`. It owns the bootstrap client: the only object that can restore
TransferQueue or decide to start fresh, and it does so on the driver before any connect-only client exists
(`restore`). The resulting `DataPlaneToken` is what the trainer worker and the controller actor attach with. The
bootstrap client stays in the driver process (it is dropped when `Trainers` is pickled into the controller's
arguments); the driver closes it at the end.

`TrainerWorker` is a thin Ray wrapper over `grpo.trainer.Trainer`; one worker here, the place where data-parallel
workers would go at scale.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainingrun_runtime import config
from trainingrun_runtime.dataplane import lifecycle
from trainingrun_runtime.driver import placement
from trainingrun_runtime.grpo import trainer, workload
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = ["PARTITION", "STORAGE_UNITS", "TRAIN_FIELDS", "TrainerWorker", "Trainers"]

log = logging.getLogger(__name__)

PARTITION = "rollouts"
"""The TransferQueue partition the rollouts live in."""
TRAIN_FIELDS = ("tokens", "logprobs", "advantages")
STORAGE_UNITS = 2
"""TransferQueue storage units; a snapshot restores only onto the same count."""


class TrainerWorker:
    """One trainer process: a `Trainer` and a connect-only client to read its batches from TransferQueue."""

    def __init__(self, cfg: config.TrainerConfig) -> None:
        trainer.deterministic()
        self.trainer = trainer.Trainer(cfg)
        self.client: lifecycle.ConnectOnlyDataPlane | None = None

    def attach(self, token: lifecycle.DataPlaneToken) -> None:
        """Connect to TransferQueue with the token of the restore (or fresh start) decision."""
        self.client = lifecycle.ConnectOnlyDataPlane.connect(token)

    def train(self, partition: str, sample_ids: Sequence[str]) -> dict[str, float]:
        """Read the batch's rows (in the given order) and take one training step."""
        if self.client is None:
            raise RuntimeError("trainer worker is not attached to the data plane")
        variable = workload.variable_rows(self.trainer.cfg)
        rows = self.client.read_rows(partition, sample_ids, TRAIN_FIELDS + (workload.ROW_FIELDS if variable else ()))
        tokens, logprobs, advantages = (rows[f] for f in TRAIN_FIELDS)
        assert isinstance(tokens, torch.Tensor) and isinstance(logprobs, torch.Tensor)
        assert isinstance(advantages, torch.Tensor)
        mask, prompt_lens = (rows[f] for f in ("mask", "prompt_len")) if variable else (None, None)
        assert mask is None or isinstance(mask, torch.Tensor)
        assert prompt_lens is None or isinstance(prompt_lens, torch.Tensor)
        trainer.deterministic()  # TransferQueue's reads reset torch's thread count; put it back
        stats = self.trainer.train_step(tokens, logprobs, advantages, mask, prompt_lens)
        stats["version"] = float(self.trainer.version)
        return stats

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the current weights (returned into the object store for the generators)."""
        return self.trainer.weights()

    def version(self) -> int:
        """Training steps taken."""
        return self.trainer.version

    def weights_sha256(self) -> str:
        """SHA-256 of the current weights in canonical order."""
        return self.trainer.weights_sha256()

    def save(self, directory: str) -> str:
        """Write policy files into `directory`; returns weights_sha256."""
        return self.trainer.save(directory)

    def load(self, directory: str, expected: Mapping[str, FileEntry] | None = None) -> str:
        """Load policy files, each checked against `expected` as it is read; returns weights_sha256 of what was
        loaded (`trainer.Trainer.load`)."""
        return self.trainer.load(directory, expected)


class Trainers:
    """The trainer worker handle(s) and, on the driver only, the bootstrap data-plane client."""

    def __init__(
        self,
        cfg: config.TrainerConfig,
        name_prefix: str,
        head: str,
        *,
        storage_units: int = STORAGE_UNITS,
        num_gpus: int = 0,
    ) -> None:
        """Start the trainer worker and TransferQueue on the Ray node `head` (`placement`: run state lives there).

        The worker's process starts while TransferQueue does (creating an actor does not wait for it); it touches
        TransferQueue only when `attach`ed with the token of the restore decision.
        """
        import ray

        self.cfg = cfg
        worker_cls = ray.remote(num_cpus=0, max_restarts=0)(TrainerWorker)
        options = {"name": f"{name_prefix}-trainer", "num_gpus": num_gpus, **placement.on_head(head)}
        self.worker: Any = worker_cls.options(**options).remote(cfg)
        try:
            self.data_plane: lifecycle.BootstrapDataPlane | None = lifecycle.BootstrapDataPlane.start(
                storage_units=storage_units, node_id=head
            )
        except BaseException:
            self._stop_worker()
            raise

    def __getstate__(self) -> dict[str, Any]:
        # The bootstrap client is bound to the driver process; the controller never restores or closes TQ.
        return {**self.__dict__, "data_plane": None}

    def _bootstrap(self) -> lifecycle.BootstrapDataPlane:
        if self.data_plane is None:
            raise RuntimeError("the bootstrap data-plane client lives only in the driver's Trainers")
        return self.data_plane

    def load_data_plane_checkpoint(
        self, directory: Path, expected: Mapping[str, FileEntry] | None = None
    ) -> lifecycle.Restored:
        """Restore TransferQueue from `directory` through the bootstrap client, each file checked against
        `expected` by the process that reads it (`lifecycle.BootstrapDataPlane.load_checkpoint`); attach the
        worker after."""
        import ray

        restored = self._bootstrap().load_checkpoint(directory, expected)
        ray.get(self.worker.attach.remote(restored.token))
        return restored

    def start_fresh(self) -> lifecycle.DataPlaneToken:
        """Decide there is nothing to restore; attach the worker."""
        import ray

        token = self._bootstrap().start_fresh()
        ray.get(self.worker.attach.remote(token))
        return token

    def load(self, directory: Path, expected: Mapping[str, FileEntry] | None = None) -> str:
        """Load weights and optimizer state from a bundle's `policy/`, each file checked against `expected` (the
        manifest's entries) in the worker's process as it reads it; returns weights_sha256."""
        import ray

        sha: str = ray.get(self.worker.load.remote(str(directory), None if expected is None else dict(expected)))
        return sha

    def close(self) -> None:
        """Shut TransferQueue down and stop the trainer worker (driver only: the run is over, or its setup failed)."""
        try:
            if self.data_plane is not None:
                self.data_plane.close()
                self.data_plane = None
        finally:
            self._stop_worker()

    def _stop_worker(self) -> None:
        import ray

        ray.kill(self.worker, no_restart=True)

    # -- used by the controller actor (async) ------------------------------------------------------

    async def train(self, partition: str, sample_ids: Sequence[str]) -> dict[str, float]:
        """One training step on the rows `sample_ids`."""
        stats: dict[str, float] = await self.worker.train.remote(partition, list(sample_ids))
        return stats

    def weights_ref(self) -> Any:
        """An ObjectRef to the current weights (fetched by the generators, not by the caller)."""
        return self.worker.weights.remote()

    async def save(self, directory: Path) -> str:
        """Write `policy/` files; returns weights_sha256."""
        sha: str = await self.worker.save.remote(str(directory))
        return sha

    async def weights_sha256(self) -> str:
        """weights_sha256 of the trainer's current weights."""
        sha: str = await self.worker.weights_sha256.remote()
        return sha
