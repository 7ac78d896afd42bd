"""The trainers as the controller sees them: the trainer worker(s), plus, on the driver, the bootstrap data-plane
client.

    driver setup                                   controller actor, every step
    ─────────────                                  ─────────────────────────────
    Trainers(cfg) ─► BootstrapDataPlane.start()    train(sample_ids) ─► TrainerWorker reads rows from TQ
                 └─► TrainerWorker (Ray actor)                          (tokens, logprobs, advantages) ─► GRPO step
    load_data_plane_checkpoint(dir) ─► token       weights_ref() ─► ObjectRef of the new weights (weight sync)
    (or start_fresh() ─► token)                    begin_save(dir) ─► each rank's state copied, written behind
    load(policy dir) ─► weights_sha256             finish_save() ─► weights_sha256 once every shard is written

`Trainers` is what NeMo RL calls `TQPolicy`. It owns the bootstrap client: the only object that can restore
TransferQueue or decide to start fresh, and it does so on the driver before any connect-only client exists
(`restore`). The resulting `DataPlaneToken` is what the trainer worker and the controller actor attach with. The
bootstrap client stays in the driver process (it is dropped when `Trainers` is pickled into the controller's
arguments); the driver closes it at the end.

`TrainerWorker` is a thin Ray wrapper over `grpo.trainer.Trainer`: `spec.trainer.trainerWorkers` of them, the
data-parallel ranks of one torch.distributed group (`grpo.sharding`; rank 0 is the named `<prefix>-trainer`, rank r
`<prefix>-trainer-r`). Every call goes to all ranks in the same order (each actor runs its calls in the order they
were sent, and every collective inside them needs all ranks): `train` gives each rank its contiguous part of the
step's rows; `begin_save` has every rank copy its state into host memory and write its shard in the background,
and `finish_save` (in a thread of its own, beside training) answers only when all have written: a rank that dies
mid-save fails the save, so no step. What only one answer is wanted from (the weights, their checksum) comes from
rank 0. A lost rank ends the attempt: the ranks' state is one, and it is in the checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainingrun_runtime import config
from trainingrun_runtime.dataplane import lifecycle
from trainingrun_runtime.driver import crashpoints, placement
from trainingrun_runtime.errors import TrainerLost
from trainingrun_runtime.grpo import sharding, trainer, workload
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = ["PARTITION", "STORAGE_UNITS", "TRAIN_FIELDS", "TrainerWorker", "Trainers", "rank_rows"]

log = logging.getLogger(__name__)

LOST_WITHIN_S = 90.0
"""How long `Trainers.raise_if_lost` waits for Ray to tell a lost rank from a live one (a node's death is known once
its heartbeats have been missed for a while)."""
CHECKPOINT_THREAD = "checkpoint"
"""The trainer worker's concurrency group for `finish_save`."""
PARTITION = "rollouts"
"""The TransferQueue partition the rollouts live in."""
TRAIN_FIELDS = ("tokens", "logprobs", "advantages")
STORAGE_UNITS = 2
"""TransferQueue storage units; a snapshot restores only onto the same count."""


class TrainerWorker:
    """One trainer process (rank `rank` of `world`): a `Trainer` and a connect-only client to read its part of each
    batch from TransferQueue."""

    def __init__(
        self,
        cfg: config.TrainerConfig,
        rank: int = 0,
        world: int = 1,
        crash: crashpoints.CrashPoints | None = None,
    ) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world
        self.crash = crash or crashpoints.CrashPoints(None, ".")
        trainer.deterministic()
        self.trainer: trainer.Trainer | None = None
        self.client: lifecycle.ConnectOnlyDataPlane | None = None
        self.pending: trainer.PendingSave | None = None

    def address(self) -> str:
        """A free `tcp://ip:port` on this rank's node, for every rank to `join` at (asked of rank 0)."""
        import ray

        return sharding.rendezvous(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    def join(self, address: str | None) -> None:
        """Join the ranks' process group at `address` (rank 0's; None with one rank), then build the trainer: the
        first weights, sharded over the ranks."""
        if self.world > 1:
            if address is None:
                raise ValueError("several trainer ranks need the address of rank 0's rendezvous")
            sharding.join(address, self.rank, self.world)
        self.trainer = trainer.Trainer(self.cfg, rank=self.rank, world=self.world)

    @property
    def _trainer(self) -> trainer.Trainer:
        if self.trainer is None:
            raise RuntimeError("trainer worker has not joined its ranks")
        return self.trainer

    def attach(self, token: lifecycle.DataPlaneToken) -> None:
        """Connect to TransferQueue with the token of the restore (or fresh start) decision."""
        self.client = lifecycle.ConnectOnlyDataPlane.connect(token)

    def train(self, partition: str, sample_ids: Sequence[str]) -> dict[str, float]:
        """Read the batch's rows (in the given order) and take one training step."""
        if self.client is None:
            raise RuntimeError("trainer worker is not attached to the data plane")
        variable = workload.variable_rows(self._trainer.cfg)
        rows = self.client.read_rows(partition, sample_ids, TRAIN_FIELDS + (workload.ROW_FIELDS if variable else ()))
        tokens, logprobs, advantages = (rows[f] for f in TRAIN_FIELDS)
        assert isinstance(tokens, torch.Tensor) and isinstance(logprobs, torch.Tensor)
        assert isinstance(advantages, torch.Tensor)
        mask, prompt_lens = (rows[f] for f in ("mask", "prompt_len")) if variable else (None, None)
        assert mask is None or isinstance(mask, torch.Tensor)
        assert prompt_lens is None or isinstance(prompt_lens, torch.Tensor)
        trainer.deterministic()  # TransferQueue's reads reset torch's thread count; put it back
        stats = self._trainer.train_step(tokens, logprobs, advantages, mask, prompt_lens)
        stats["version"] = float(self._trainer.version)
        return stats

    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the current weights (returned into the object store for the generators)."""
        return self._trainer.weights()

    def version(self) -> int:
        """Training steps taken."""
        return self._trainer.version

    def weights_sha256(self) -> str:
        """SHA-256 of the current weights in canonical order."""
        return self._trainer.weights_sha256()

    def alive(self) -> bool:
        """True: the rank's process answers (asked in its `checkpoint` thread, which a hung collective leaves
        free)."""
        return True

    def begin_save(self, directory: str) -> None:
        """Copy this rank's state into host memory and start writing its shard (and, on rank 0, the index) into
        `directory` in the background; training may go on as soon as this returns."""
        if self.pending is not None:
            raise RuntimeError("a save began while the previous one was still being written")
        self.pending = self._trainer.begin_save(directory)

    def finish_save(self) -> str:
        """Wait for the background write; weights_sha256 read back from the files (rank 0; "" on the others).
        Runs in the actor's `checkpoint` thread, beside the training calls."""
        pending = self.pending
        if pending is None:
            raise RuntimeError("no save is being written")
        try:
            sha = pending.finish()
        finally:
            self.pending = None
        self.crash.reach(f"rank{self.rank}_saved", pending.version)  # written, not yet acknowledged
        return sha

    def load(self, directory: str, expected: Mapping[str, FileEntry] | None = None) -> str:
        """Load policy files, each checked against `expected` as it is read; returns weights_sha256 of what was
        loaded (`trainer.Trainer.load`)."""
        return self._trainer.load(directory, expected)


def rank_rows(rows: Sequence[str], rank: int, world: int) -> list[str]:
    """Rank `rank`'s part of a step's rows: the `rank`-th of `world` contiguous parts as equal as they can be."""
    n = len(rows)
    return list(rows[rank * n // world : (rank + 1) * n // world])


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
        trainers: config.TrainersConfig | None = None,
        crash: crashpoints.CrashPoints | None = None,
    ) -> None:
        """Start the trainer worker and TransferQueue on the Ray node `head` (`placement`: run state lives there).

        The worker's process starts while TransferQueue does (creating an actor does not wait for it); it touches
        TransferQueue only when `attach`ed with the token of the restore decision.
        """
        import ray

        self.cfg = cfg
        # One thread runs the training calls in order (every collective needs all ranks in the same order); the
        # `checkpoint` group's thread waits for a background write while training goes on.
        worker_cls = ray.remote(num_cpus=0, max_restarts=0, concurrency_groups={CHECKPOINT_THREAD: 1})(  # type: ignore[call-overload]
            TrainerWorker
        )
        world = cfg.trainer_workers
        trainers = trainers or config.TrainersConfig()
        self.on_worker_groups = trainers.on_worker_groups
        where = placement.trainer(trainers, head, num_gpus)

        def rank(r: int) -> Any:
            name = f"{name_prefix}-trainer" if r == 0 else f"{name_prefix}-trainer-{r}"
            return worker_cls.options(name=name, **where).remote(cfg, r, world, crash)

        self.workers: list[Any] = []
        try:
            self.workers.extend(rank(r) for r in range(world))  # their processes start while TransferQueue does
            self.data_plane: lifecycle.BootstrapDataPlane | None = lifecycle.BootstrapDataPlane.start(
                storage_units=storage_units, node_id=head
            )
            address = ray.get(self.workers[0].address.remote()) if world > 1 else None
            self._joined = [w.join.remote(address) for w in self.workers]  # awaited before the ranks attach
        except BaseException:
            self._stop_workers()
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
        restored = self._bootstrap().load_checkpoint(directory, expected)
        self._attach(restored.token)
        return restored

    def start_fresh(self) -> lifecycle.DataPlaneToken:
        """Decide there is nothing to restore; attach the worker."""
        token = self._bootstrap().start_fresh()
        self._attach(token)
        return token

    def _attach(self, token: lifecycle.DataPlaneToken) -> None:
        """Every rank has joined (or its failure is raised here), then attaches with the token."""
        self._get_all(self._joined)
        self._get_all([w.attach.remote(token) for w in self.workers])

    def _get_all(self, refs: list[Any]) -> list[Any]:
        """Every rank's answer to one call, each awaited even when another failed (`_raise_first`)."""
        import ray

        answers: list[Any] = []
        errors: list[BaseException] = []
        for ref in refs:
            try:
                answers.append(ray.get(ref))
            except Exception as e:
                errors.append(e)
        self._raise_first(errors)
        return answers

    def _raise_first(self, errors: list[BaseException]) -> None:
        """Raise the ranks' failure, if any. When the ranks run on worker groups, a rank whose actor died (its node
        left the cluster) is TrainerLost, whatever the other ranks said first: the survivors' collectives fail too
        (a peer closed the connection), and only the dead rank says why."""
        if not errors:
            return
        lost = self._lost_rank(errors)
        if lost is not None:
            raise lost from lost.__cause__
        raise errors[0]

    def _lost_rank(self, answers: Sequence[object]) -> TrainerLost | None:
        """TrainerLost naming the first rank's actor among `answers` that died, when the ranks run on worker groups
        (on the head, a rank lost is the head's own failure); None otherwise."""
        import ray

        dead = next((a for a in answers if isinstance(a, ray.exceptions.RayActorError)), None)
        if dead is None or not self.on_worker_groups:
            return None
        lost = TrainerLost(f"a trainer rank was lost with its node: {dead}")
        lost.__cause__ = dead
        return lost

    def load(self, directory: Path, expected: Mapping[str, FileEntry] | None = None) -> str:
        """Load weights and optimizer state from a bundle's `policy/` onto every rank (written by any number of
        ranks: DCP reshards), each file checked against `expected` (the manifest's entries) in the process that
        reads it; returns weights_sha256 (rank 0's answer)."""
        entries = None if expected is None else dict(expected)
        shas: list[str] = self._get_all([w.load.remote(str(directory), entries) for w in self.workers])
        return shas[0]

    def close(self) -> None:
        """Shut TransferQueue down and stop the trainer worker (driver only: the run is over, or its setup failed)."""
        try:
            if self.data_plane is not None:
                self.data_plane.close()
                self.data_plane = None
        finally:
            self._stop_workers()

    def _stop_workers(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w, no_restart=True)

    # -- used by the controller actor (async) ------------------------------------------------------

    async def train(self, partition: str, sample_ids: Sequence[str]) -> dict[str, float]:
        """One training step on the rows `sample_ids`, each rank on its part (`rank_rows`); the step's stats."""
        world = len(self.workers)
        calls = [w.train.remote(partition, rank_rows(sample_ids, r, world)) for r, w in enumerate(self.workers)]
        stats: list[dict[str, float]] = await self._all(calls)
        return stats[0]

    def weights_ref(self) -> Any:
        """An ObjectRef to the current weights (fetched by the generators, not by the caller): rank 0's, which the
        other ranks' calls help gather."""
        refs = [w.weights.remote() for w in self.workers]
        return refs[0]

    async def begin_save(self, directory: Path) -> None:
        """Every rank copies its state into host memory and starts writing its shard into `policy/`; returns once
        all have copied (the time training is blocked by the policy's part of a save)."""
        await self._all([w.begin_save.remote(str(directory)) for w in self.workers])

    async def finish_save(self) -> str:
        """weights_sha256 of what was written, once every rank's write is done (a rank that fails or dies fails the
        save: it is never committed)."""
        calls = [w.finish_save.options(concurrency_group=CHECKPOINT_THREAD).remote() for w in self.workers]
        shas: list[str] = await self._all(calls)
        return shas[0]

    async def weights_sha256(self) -> str:
        """weights_sha256 of the trainer's current weights."""
        shas: list[str] = await self._all([w.weights_sha256.remote() for w in self.workers])
        return shas[0]

    async def raise_if_lost(self, error: BaseException) -> None:
        """TrainerLost (from `error`) if a rank's actor is gone, when the ranks run on worker groups: a rank lost
        with its node shows first as the survivors' failed collectives (a peer closed the connection), in whatever
        call the controller was making, while Ray takes a few seconds more to mark the node dead. Asks every rank,
        for at most `LOST_WITHIN_S`; returns if all answer (the failure was something else)."""
        if not self.on_worker_groups:
            return
        calls = [w.alive.options(concurrency_group=CHECKPOINT_THREAD).remote() for w in self.workers]
        try:
            answers = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), LOST_WITHIN_S)
        except TimeoutError:
            return
        lost = self._lost_rank(answers)
        if lost is not None:
            raise lost from error

    async def _all(self, calls: list[Any]) -> list[Any]:
        """Every rank's answer to one call, each awaited even when another failed (`_raise_first`)."""
        answers = await asyncio.gather(*calls, return_exceptions=True)
        self._raise_first([a for a in answers if isinstance(a, BaseException)])
        return list(answers)
