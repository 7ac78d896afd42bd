"""The restore step of the driver's setup: choose the checkpoint, then bring back everything it holds, in order.

    choose(root, run, resume, config, replay, fallback)   no Ray yet: every checksum verified, the config hash checked
        ─► checkpointer.Selection | None    (None: nothing to resume, a fresh start); a pinned step that fails
           verification is passed over for the newest `fallback` step (older recorded ones) that verifies, and
           named in `Selection.skipped`; only when none verifies does the restore fail
    restore(chosen, trainers, rollout, events) ─► Restored
        1  TransferQueue through the trainers' bootstrap client ─► DataPlaneToken      tq_restored | tq_fresh
           (BEFORE any other client, the replay buffer or the controller exist)
        2  policy/ into the trainer; its weights_sha256 against the manifest            policy_loaded
        3  train_dataloader.pt into the loader and the sampler; the ledger from the index file; the loader
           place and the sampler step against what the barrier cut captured; every served uid in the ledger

This is the one restore path: the driver runs it, and the data-plane tests run its first half (`select`, then
`BootstrapDataPlane.load_checkpoint`) as it is. The replay index itself is rebuilt later, inside the controller
actor, from `Restored.replay_state` (`TQReplayBuffer.restore`), because the buffer is bound to that process. Any
failure is raised as `RestoreFailed` (exit code 3) with its cause.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trainingrun_runtime import config
from trainingrun_runtime.dataplane import checkpointer, lifecycle
from trainingrun_runtime.dataplane.replay_index import ReplayConfig
from trainingrun_runtime.driver import events, reporting, trainers
from trainingrun_runtime.errors import CheckpointCorrupt, ConfigMismatch, DigestError, RestoreFailed, TrainingRunError
from trainingrun_runtime.grpo import trainer
from trainingrun_runtime.rollout import ledger, prompt_loader, samplers
from trainingrun_runtime.storage import layout, manifest

__all__ = ["NoRecordedCheckpointVerifies", "Restored", "Rollout", "check_config", "choose", "rejected_steps", "restore"]

log = logging.getLogger(__name__)

PROBLEM_CHARS = 500
"""A rejected checkpoint's problem, as reported, is cut to this (the CRD bounds the field)."""


@dataclasses.dataclass(frozen=True)
class Rollout:
    """The rollout state a checkpoint carries besides the data plane: loader place, sampler cursor, ledger."""

    loader: prompt_loader.PromptLoader
    sampler: samplers.Sampler
    ledger: ledger.Ledger

    @classmethod
    def fresh(cls, cfg: config.TrainerConfig) -> Rollout:
        """Loader at uid 0, sampler at step 0, an empty ledger."""
        return cls(prompt_loader.PromptLoader(cfg.task.dataset_size, cfg.seed), samplers.build(cfg), ledger.Ledger())


@dataclasses.dataclass(frozen=True)
class Restored:
    """What the restore brought back (or that it decided on a fresh start), for the controller's arguments."""

    token: lifecycle.DataPlaneToken
    """Proof that the bootstrap client restored TransferQueue (or started it fresh): connect-only clients need it."""
    step: int | None
    """The restored step (None: a fresh start)."""
    replay_state: Mapping[str, Any] | None
    """The replay index from the index file, rebuilt in the controller (None on a fresh start)."""
    replay_digest: str | None
    """The manifest's replay digest, which the rebuilt index must match (None on a fresh start)."""
    last_checkpoint: reporting.CheckpointReport | None
    """The restored step as `status.runtime.lastCheckpoint` reports it (None on a fresh start)."""
    rejected: tuple[reporting.BadCheckpointReport, ...] = ()
    """The checkpoints passed over because they failed verification (`status.runtime.badCheckpoints`)."""


class NoRecordedCheckpointVerifies(CheckpointCorrupt):
    """The pinned step and every fallback step failed verification; `rejected` says why each one did."""

    def __init__(self, message: str, rejected: list[tuple[Path, str]]) -> None:
        super().__init__(message)
        self.rejected = rejected


def choose(
    root: str,
    run: str,
    resume: str,
    cfg: config.RuntimeConfig,
    replay: ReplayConfig,
    fallback: Sequence[int] = (),
) -> checkpointer.Selection | None:
    """The checkpoint to resume from, every check passed, nothing loaded: newest valid, pinned, or None (fresh).

    `replay` is the replay buffer's shape under `cfg`, which the checkpoint's index must fit. With a pinned step,
    `fallback` lists older steps the operator recorded: when the pinned one fails verification (a checksum, a
    missing file, the replay digest), the newest of them that verifies is chosen instead, and the ones passed over
    are in `Selection.skipped`. A step newer than the pinned one is never used. A config mismatch is not passed
    over (older steps would share it).
    """
    try:
        step = None if resume == "latest" else int(resume)
    except ValueError:
        raise RestoreFailed(ValueError(f"--resume must be 'latest' or a step number, got {resume!r}")) from None
    try:
        if step is None:
            chosen = checkpointer.select(root, run, config=replay, storage_units=trainers.STORAGE_UNITS)
        else:
            chosen = _pinned_or_older(
                root, run, replay, [step, *sorted({f for f in fallback if f < step}, reverse=True)]
            )
        if chosen is not None:
            check_config(chosen.manifest, cfg)
    except (TrainingRunError, ValueError, OSError) as e:
        raise RestoreFailed(e) from e
    if chosen is not None:
        for path, reason in chosen.skipped:
            log.warning("not resuming from %s: %s", path, reason)
    return chosen


def _pinned_or_older(root: str, run: str, replay: ReplayConfig, steps: list[int]) -> checkpointer.Selection | None:
    """The first of `steps` (the pinned one, then older recorded ones) that passes every check."""
    rejected: list[tuple[Path, str]] = []
    for step in steps:
        try:
            chosen = checkpointer.select(root, run, config=replay, storage_units=trainers.STORAGE_UNITS, step=step)
        except (CheckpointCorrupt, DigestError) as e:
            rejected.append((layout.run_dir(root, run) / layout.step_dirname(step), str(e)))
            continue
        return None if chosen is None else dataclasses.replace(chosen, skipped=rejected)
    tried = "; ".join(f"{path.name}: {why}" for path, why in rejected)
    raise NoRecordedCheckpointVerifies(f"no recorded checkpoint verifies ({tried})", rejected)


def rejected_steps(skipped: Sequence[tuple[Path, str]]) -> list[reporting.BadCheckpointReport]:
    """The step_N checkpoints among `skipped` (not leftovers such as tmp_step_N), as the driver reports them."""
    found = []
    for path, problem in skipped:
        step = layout.step_of(path.name)
        if step is not None:
            found.append(reporting.BadCheckpointReport(step=step, problem=problem[:PROBLEM_CHARS]))
    return found


def check_config(saved: manifest.Manifest, cfg: config.RuntimeConfig) -> None:
    """Refuse (ConfigMismatch) a checkpoint written under different math; harmless fields never refuse."""
    current = config.config_hash(cfg)
    if saved.config_hash == current:
        return
    math = saved.extra.get("config_math", {})
    diff = config.math_diff(dict(math), config.math_fields(cfg)) if math else ["(the manifest lists no fields)"]
    raise ConfigMismatch(
        f"step_{saved.step} was written with config hash {saved.config_hash[:12]}, the current config has "
        f"{current[:12]}; fields that change the math differ: " + "; ".join(diff)
    )


def restore(
    chosen: checkpointer.Selection | None, the_trainers: trainers.Trainers, rollout: Rollout, ev: events.EventLog
) -> Restored:
    """Restore TransferQueue, the policy and the rollout state from `chosen` (or start fresh); see the module."""
    if chosen is None:
        token = the_trainers.start_fresh()
        ev.emit("tq_fresh")
        return Restored(token=token, step=None, replay_state=None, replay_digest=None, last_checkpoint=None)
    try:
        token = the_trainers.load_data_plane_checkpoint(chosen.verified.data_plane).token
        ev.emit("tq_restored", step=chosen.manifest.step)
        _load_policy(chosen, the_trainers)
        ev.emit("policy_loaded", step=chosen.manifest.step)
        _load_rollout(chosen, rollout)
    except Exception as e:
        raise RestoreFailed(getattr(e, "cause", None) or e) from e
    m = chosen.manifest
    last = reporting.CheckpointReport(
        step=m.step,
        path=str(chosen.verified.path),
        attempt=m.attempt,
        replayDigest=m.replay_digest,
        weightsSha256=m.weights_sha256,
        time=m.created,
    )
    if "reason" in m.extra:  # bundles from before reasons were recorded have none
        last["reason"] = str(m.extra["reason"])
    return Restored(
        token=token,
        step=m.step,
        replay_state=dict(chosen.replay_state),
        replay_digest=m.replay_digest,
        last_checkpoint=last,
        rejected=tuple(rejected_steps(chosen.skipped)),
    )


def _load_policy(chosen: checkpointer.Selection, the_trainers: trainers.Trainers) -> None:
    verified, m = chosen.verified, chosen.manifest
    sha = the_trainers.load(verified.file(f"{layout.POLICY}/{trainer.MODEL_FILE}").parent)
    if sha != m.weights_sha256:
        raise CheckpointCorrupt(f"{verified.path}: loaded weights hash {sha}, the manifest says {m.weights_sha256}")


def _load_rollout(chosen: checkpointer.Selection, rollout: Rollout) -> None:
    verified, m = chosen.verified, chosen.manifest
    state = torch.load(verified.file(layout.TRAIN_DATALOADER), weights_only=True)
    rollout.loader.load_state_dict(state["loader"])
    rollout.sampler.load_state_dict(state["sampler"])
    rollout.ledger.load_state_dict(dict(chosen.restart["ledger"]))
    if (rollout.sampler.step, rollout.loader.state_dict()) != (m.step, chosen.restart["loader"]):
        raise CheckpointCorrupt(
            f"{verified.path}: train_dataloader.pt (step {rollout.sampler.step}) disagrees with the state "
            f"captured with the replay index (step {m.step})"
        )
    rollout.ledger.check_served(rollout.loader.next_uid)
