"""The controller's checkpoint pipeline: the cut inline in the train pump, then commit, report and retention behind it.

    save(step N)                                                       (called by the train pump every save_period)
      wait for the previous commit; begin(): fence, clean tmp_step_*   one save at a time (never a newer attempt's)
      at the same time, the pump waiting (`blocked_s`) only for both:
      │ every trainer rank copies its weights + optimizer into host memory
      │   and starts writing its shard of tmp_step_N.attempt_A/policy/
      │ ┌ barrier.checkpoint(): replay index + capture() + inventory check + TransferQueue snapshot ┐ (checkpointer)
      │ └ the lanes queue at reserve/commit only for this window ──────────────────────────────────┘
      (neither trains, so the copy and the cut describe the same moment in either order)
      ── the pump goes on training from here; the rest runs as task checkpoint-commit-N ──
      wait until every rank's shard is written (weights_sha256 read back from the files)
      train_dataloader.pt ← the loader place and sampler cursor read in the cut
      commit: fsync, manifest (weights_sha256, replay digest, config hash) last, fence, rename → step_N
      report status.runtime.lastCheckpoint (only now); retention that keeps the step the operator would resume
      from (read from the status); an attempt the operator has already ended stops here (AttemptEnded, a
      Superseded: the checkpoint is complete and reported, and still answers the head's notice)

An `InventoryMismatch` in the cut abandons that save (logged) and training goes on; any other failure discards
the pending save and is raised, by `save` or, for the background part, by the next `save`, `raise_if_failed` or
`settle`. The fence (`storage.fence`): before a save's begin cleans anything, right before its rename (after the
minutes that fsyncs and hashing can take), and before retention deletes, owner.json must still name this attempt,
else Superseded: a zombie of an ended attempt stops writing. Retention counts only this attempt's lineage (the
restored step and older ones, and the steps it wrote: `retention.Lineage`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainingrun_runtime import config, contract
from trainingrun_runtime.dataplane import checkpointer
from trainingrun_runtime.dataplane.barrier import DataPlaneCheckpointBarrier
from trainingrun_runtime.dataplane.replay_buffer import TQReplayBuffer
from trainingrun_runtime.dataplane.row_client import DataPlaneClient
from trainingrun_runtime.driver.telemetry import DriverMetrics
from trainingrun_runtime.errors import AttemptEnded, InventoryMismatch
from trainingrun_runtime.grpo import trainer
from trainingrun_runtime.sdk import attached, record, reporting
from trainingrun_runtime.storage import fence, layout

if TYPE_CHECKING:
    from trainingrun_runtime.driver.controller import SingleControllerActorArgs

__all__ = ["Checkpoints"]

log = logging.getLogger(__name__)


class Checkpoints:
    """Writes this attempt's checkpoints (see the module docstring); one instance per controller run."""

    def __init__(
        self,
        args: SingleControllerActorArgs,
        *,
        record: record.AttemptRecord,
        client: DataPlaneClient,
        buffer: TQReplayBuffer,
        barrier: DataPlaneCheckpointBarrier,
        reports: reporting.ProgressReports,
        telemetry: DriverMetrics | None = None,
    ) -> None:
        self._args = args
        self.record = record
        """The attempt's reports (`sdk.record`): lastCheckpoint, the steps written, the latest save's time."""
        self._reports = reports
        self._telemetry = telemetry
        self._saver = checkpointer.DataPlaneCheckpointer(
            args.root, args.run, dataplane=client, buffer=buffer, barrier=barrier, on_stage=self._stage,
            attempt=args.attempt, run_uid=args.run_uid, guard=self._fence,
        )  # fmt: skip
        self._commit: asyncio.Task[None] | None = None
        self._saving_step = -1
        self.exclusive_s: list[float] = []
        """The barrier's exclusive window of each checkpoint this attempt committed (seconds)."""
        self.blocked_s: list[float] = []
        """How long each save this attempt began kept the train pump waiting: the policy's copy into host memory
        and the barrier cut, from the save's begin (seconds)."""

    @property
    def last(self) -> contract.CheckpointReport | None:
        """The newest checkpoint this attempt can resume from: committed by it, or the one it restored."""
        return self.record.last

    @property
    def committing(self) -> int | None:
        """The step whose background commit is under way (None: none is)."""
        return self._saving_step if self._commit is not None and not self._commit.done() else None

    async def save(
        self,
        step: int,
        reward: float | None,
        capture: Callable[[], Mapping[str, Any]],
        reason: contract.CheckpointReason = contract.CheckpointReason.PERIODIC,
    ) -> None:
        """Write step N: the policy and the barrier cut now, the commit in the background (see the module)."""
        await self.settle()  # one save at a time: begin() fences, then cleans this attempt's and older tmp_step_*
        self._saving_step = step
        started = time.monotonic()
        pending = await asyncio.to_thread(self._saver.begin, step)
        copy = asyncio.ensure_future(self._copy_policy(pending, step))  # copied; written behind
        try:
            snap = await pending.snapshot(capture=capture)  # the one exclusive barrier cut, meanwhile
            await copy
        except InventoryMismatch as e:
            await self._discard(pending, copy)
            log.warning("checkpoint at step %d abandoned, training goes on: %s", step, e)
            return
        except BaseException:
            await self._discard(pending, copy)
            raise
        blocked_s = time.monotonic() - started
        self.blocked_s.append(blocked_s)
        self.record.waited_for_save(blocked_s)
        self._commit = asyncio.create_task(
            self._finish(pending, snap, step, reward, reason, started, blocked_s), name=f"checkpoint-commit-{step}"
        )

    async def _copy_policy(self, pending: checkpointer.PendingCheckpoint, step: int) -> None:
        await self._args.trainers.begin_save(pending.path / layout.POLICY)
        self._args.crash.reach("policy_saved", step)

    async def _discard(self, pending: checkpointer.PendingCheckpoint, copy: asyncio.Future[None]) -> None:
        """Abort a save after its policy copy began: wait for the copy and the write first (they write into the
        directory the abort removes), whatever came of them."""
        try:
            await asyncio.gather(copy, return_exceptions=True)  # its failure, if any, is the write's below too
            await self._args.trainers.finish_save()
        except Exception as e:  # the save is discarded either way; the failure that discards it is raised
            log.warning("the policy's background write of a discarded save failed too: %s", e)
        finally:
            pending.abort()

    async def settle(self) -> None:
        """Wait for the background commit of the previous checkpoint; re-raise its failure as it was."""
        task, self._commit = self._commit, None
        if task is not None:
            await task

    async def settle_for_the_notice(self) -> None:
        """`settle()`, before the answer to the head's notice: a commit whose retention found the attempt ended
        (`AttemptEnded`: the operator saw the head's DisruptionTarget before its deletion, or the save outlasted a
        pass) was committed and reported, so it is still this attempt's newest checkpoint and answers the notice. The
        driver stops after the answer either way. Any other failure is raised as it was."""
        try:
            await self.settle()
        except AttemptEnded as e:
            step = None if self.last is None else self.last["step"]
            log.warning("%s; step %s still answers the head's notice", e, step)

    async def answers_notice(self) -> None:
        """This attempt's newest checkpoint answers the head's notice (it was being saved, or was saved, at the step
        the notice found): report it again, with reason PreemptionNotice. The operator may have ended the attempt as
        the head's deletion began, before the checkpoint's first report came; it then records only the notice's
        checkpoint (`decision._late_notice_checkpoint`), and this one is it: the driver trains no more after it. A
        checkpoint the operator has recorded already (same step, attempt and path) takes the notice's reason."""
        if self.record.answers_notice():
            await self._reports.checkpoint()

    def raise_if_failed(self) -> None:
        """Re-raise the background commit's failure, if it has failed (without waiting for it)."""
        if self._commit is not None and self._commit.done() and not self._commit.cancelled():
            error = self._commit.exception()
            if error is not None:
                self._commit = None
                raise error

    async def _finish(
        self,
        pending: checkpointer.PendingCheckpoint,
        snap: checkpointer.Snapshot,
        step: int,
        reward: float | None,
        reason: contract.CheckpointReason,
        started: float,
        blocked_s: float,
    ) -> None:
        """The policy's write, train_dataloader.pt, fsync + manifest + rename, then report and retention (overlaps
        training)."""
        try:
            sha = await self._args.trainers.finish_save()  # every rank's shard written (or the save fails here)
            self._args.crash.reach("policy_written", step)
            loader_state = {"loader": snap.restart["loader"], "sampler": snap.restart["sampler"]}
            await asyncio.to_thread(torch.save, loader_state, pending.path / layout.TRAIN_DATALOADER)
            extra = {
                "config_math": config.math_fields(self._args.config),
                "policy_format": trainer.POLICY_FORMAT,
                "reward": reward,
                "exclusive_s": snap.exclusive_s,
                "reason": reason,
            }
            if self._args.data_fingerprint is not None:
                extra["data_fingerprint"] = self._args.data_fingerprint
            path = await asyncio.to_thread(  # fenced inside, right before the rename
                lambda: pending.commit(
                    attempt=self._args.attempt, config_hash=self._args.config_hash, weights_sha256=sha, extra=extra
                )
            )
        except BaseException:
            pending.abort()
            raise
        assert pending.manifest_blake3 is not None  # set by a commit that returned
        self.record.committed(
            step, path, manifest_blake3=pending.manifest_blake3, reason=reason, replay_digest=snap.replay_digest,
            weights_sha256=sha,
        )  # fmt: skip
        self.exclusive_s.append(snap.exclusive_s)
        self._args.event_log.emit("checkpoint_committed", step=step, weights_sha256=sha, path=str(path),
                         exclusive_s=snap.exclusive_s, blocked_s=blocked_s, committed_s=time.monotonic() - started,
                         reason=reason)  # fmt: skip
        await self._reports.checkpoint()  # step = the newest finished step (training went on meanwhile)
        self.record.save_s = save_s = time.monotonic() - started
        if self._telemetry is not None:
            self._telemetry.checkpoint(save_s, snap.exclusive_s)
        self._args.crash.reach("reported", step)
        await self._retain(path)

    async def _retain(self, path: Path) -> None:
        """The SDK's retention (`sdk.attached.retain`): never the step the operator would resume from; AttemptEnded
        if the operator ended this attempt."""
        cp = self._args.config.checkpoint
        lineage = self.record.lineage
        await asyncio.to_thread(
            lambda: attached.retain(
                self._args.status_reporter, self._args.root, self._args.run, self._args.attempt, cp.keep_last,
                cp.keep_every, committed=path, lineage=lineage, fence=self._fence,
            )
        )  # fmt: skip

    def _fence(self, doing: str) -> None:
        """Superseded if a newer attempt (or a new run of the same name) owns the run directory now."""
        fence.check(layout.run_dir(self._args.root, self._args.run), self._args.run_uid, self._args.attempt, doing)

    def _stage(self, name: str) -> None:
        self._args.crash.reach(name, self._saving_step)
