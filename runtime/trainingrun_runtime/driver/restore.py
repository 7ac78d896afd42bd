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
actor, from `Restored.replay_state` (`TQReplayBuffer.restore`), because the buffer is bound to that process.

A failure is raised as one of three errors, by whose fault it is (`refusal`; the entrypoint maps each to its exit
code, and the operator acts on it):
- the step failed verification (a checksum, a missing file of the run, a manifest that does not parse, an index or
  a state that does not fit or hold together) -> `RestoreFailed` with its cause: the operator marks the step bad;
- the checkpoint was trained under other math than this config (`check_config`; also when that is why its index
  does not fit this buffer) -> `ConfigMismatch`, naming each changed field as the TrainingRun spells it: the run
  fails as InvalidSpec, no step is marked bad;
- anything else (an OSError that is not a missing file of the run, a Ray error, a timeout, a bug) ->
  `RestoreInterrupted` with its cause: the operator retries the attempt from the same step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic.alias_generators import to_camel

from trainingrun_runtime import config, contract
from trainingrun_runtime.dataplane import checkpointer, lifecycle
from trainingrun_runtime.dataplane.replay_index import ReplayConfig
from trainingrun_runtime.driver import events, trainers
from trainingrun_runtime.errors import (
    CheckpointCorrupt,
    ConfigMismatch,
    DigestError,
    LedgerError,
    PreflightError,
    RestoreFailed,
    RestoreInterrupted,
    TrainingRunError,
)
from trainingrun_runtime.grpo import trainer
from trainingrun_runtime.rollout import ledger, prompt_loader, samplers
from trainingrun_runtime.sdk import attached, record
from trainingrun_runtime.storage import layout, manifest

__all__ = [
    "VERIFICATION_ERRORS",
    "NoRecordedCheckpointVerifies",
    "Refusal",
    "Restored",
    "Rollout",
    "check_config",
    "check_data",
    "choose",
    "refusal",
    "rejected_steps",
    "restore",
    "root_cause",
    "spec_field",
]

log = logging.getLogger(__name__)

PROBLEM_CHARS = attached.PROBLEM_CHARS
rejected_steps = attached.rejected_steps
"""The step_N checkpoints among skipped ones, as a report lists them: the SDK's, one implementation for both."""

VERIFICATION_ERRORS: tuple[type[Exception], ...] = (CheckpointCorrupt, DigestError, PreflightError, LedgerError)
"""What a step that fails verification raises: damaged or incomplete files (`CheckpointCorrupt`, of which
`NoRecordedCheckpointVerifies` is one), a digest that does not match, an index or a ledger that does not hold
together. With the config hash equal, none of them can come from the config."""

Refusal = RestoreFailed | ConfigMismatch | RestoreInterrupted
"""The errors a restore fails with: the step's fault, the config's, or neither (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class Rollout:
    """The rollout state a checkpoint carries besides the data plane: loader place, sampler cursor, ledger."""

    loader: prompt_loader.PromptLoader
    sampler: samplers.Sampler
    ledger: ledger.Ledger

    @classmethod
    def fresh(cls, cfg: config.TrainerConfig, dataset_size: int | None = None) -> Rollout:
        """Loader at uid 0 over `dataset_size` prompts (default: the built-in task's), sampler at step 0, an empty
        ledger."""
        size = cfg.task.dataset_size if dataset_size is None else dataset_size
        return cls(prompt_loader.PromptLoader(size, cfg.seed), samplers.build(cfg), ledger.Ledger())


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
    last_checkpoint: contract.CheckpointReport | None
    """The restored step as `status.runtime.lastCheckpoint` reports it (None on a fresh start)."""
    rejected: tuple[contract.BadCheckpointReport, ...] = ()
    """The checkpoints passed over because they failed verification (`status.runtime.badCheckpoints`)."""


NoRecordedCheckpointVerifies = attached.NoRecordedCheckpointVerifies
"""The pinned step and every fallback step failed verification (the SDK's: one resume rule for both)."""


def choose(
    root: str,
    run: str,
    resume: str,
    cfg: config.RuntimeConfig,
    replay: ReplayConfig,
    fallback: Sequence[int] = (),
    manifest_blake3: Mapping[int, str] | None = None,
) -> checkpointer.Selection | None:
    """The checkpoint to resume from, every check passed, nothing loaded: newest valid, pinned, or None (fresh).

    `replay` is the replay buffer's shape under `cfg`, which the checkpoint's index must fit. With a pinned step,
    `fallback` lists older steps the operator recorded: when the pinned one fails verification (a checksum, a
    missing file, the replay digest), the newest of them that verifies is chosen instead, and the ones passed over
    are in `Selection.skipped`. A step newer than the pinned one is never used. A config mismatch is not passed
    over (older steps would share it). `manifest_blake3` maps the pinned and fallback steps to the BLAKE3 of their
    manifest as the operator recorded it: a step whose manifest.json hashes otherwise fails verification (it was
    rewritten on the volume). Raises a `Refusal` (see the module docstring).
    """
    try:
        step = None if resume == "latest" else int(resume)
    except ValueError:
        raise ValueError(f"--resume must be 'latest' or a step number, got {resume!r}") from None
    try:
        if step is None:
            chosen = _select(root, run, replay, cfg)
        else:
            chosen = _pinned_or_older(root, run, replay, cfg, step, fallback, manifest_blake3 or {})
        if chosen is not None:
            check_config(chosen.manifest, cfg)
    except (TrainingRunError, ValueError, OSError) as e:
        raise refusal(e, layout.run_dir(root, run)) from e
    if chosen is not None:
        for path, reason in chosen.skipped:
            log.warning("not resuming from %s: %s", path, reason)
    return chosen


def _select(
    root: str,
    run: str,
    replay: ReplayConfig,
    cfg: config.RuntimeConfig,
    step: int | None = None,
    manifest_blake3: str | None = None,
) -> checkpointer.Selection | None:
    """`checkpointer.select`, except that an index which does not fit this buffer because the math changed (the
    group size, the prompts per step) is the `ConfigMismatch` that names the change, not the step's fault."""
    try:
        return checkpointer.select(
            root, run, config=replay, storage_units=trainers.STORAGE_UNITS, step=step, manifest_blake3=manifest_blake3
        )
    except PreflightError:
        saved = _unverified_manifest(layout.run_dir(root, run), step)
        if saved is not None:
            check_config(saved, cfg)
        raise


def _unverified_manifest(run_path: Path, step: int | None) -> manifest.Manifest | None:
    """The manifest of step_`step` (None: of the newest step whose manifest parses), its files not verified: only
    to read the config it was written under."""
    if step is not None:
        paths = [run_path / layout.step_dirname(step)]
    else:
        paths = [path for _, path in layout.candidates(run_path)[0]]
    for path in paths:
        where = path / layout.MANIFEST
        try:
            return manifest.Manifest.from_json(where.read_bytes(), where=str(where))
        except (OSError, CheckpointCorrupt):
            continue
    return None


def _pinned_or_older(
    root: str,
    run: str,
    replay: ReplayConfig,
    cfg: config.RuntimeConfig,
    pinned: int,
    fallback: Sequence[int],
    manifest_blake3: Mapping[int, str],
) -> checkpointer.Selection | None:
    """The first of the pinned step and the older recorded ones that passes every check: the SDK's rule
    (`sdk.attached.pinned_or_older`), each step checked as `_select` checks it."""

    def load(step: int, _: Path) -> checkpointer.Selection | None:
        return _select(root, run, replay, cfg, step=step, manifest_blake3=manifest_blake3.get(step))

    chosen, rejected = attached.pinned_or_older(
        layout.run_dir(root, run), pinned, fallback, load, refusals=(CheckpointCorrupt, DigestError)
    )
    return None if chosen is None else dataclasses.replace(chosen, skipped=rejected)


def check_data(saved: manifest.Manifest, fingerprint: str) -> None:
    """Refuse (ConfigMismatch) a checkpoint trained on other rows of spec.trainer.data than the file holds now: the
    loader's place in it would point into other prompts. A manifest without a fingerprint (the built-in task's)
    never refuses."""
    held = saved.extra.get("data_fingerprint")
    if held is None or held == fingerprint:
        return
    raise ConfigMismatch(
        f"spec.trainer.data.path: the file's rows changed since step_{saved.step} was trained (data fingerprint "
        f"{str(held)[:12]}, the file now {fingerprint[:12]}). Put the rows it was trained on back and start the run "
        "again (it resumes), or train on the new rows from scratch under another name"
    )


def check_config(saved: manifest.Manifest, cfg: config.RuntimeConfig) -> None:
    """Refuse (ConfigMismatch) a checkpoint written under other math; harmless fields never refuse.

    The message starts with each changed field as the TrainingRun spells it, old -> new
    (`spec.trainer.grpo.lr: 0.003 -> 0.01`), then says the two ways on: set the fields back and start the run
    again (it resumes), or train the new values from scratch under another name. A manifest that lists no fields
    (or none that differ) names `spec.trainer` as a whole.
    """
    policy_format = saved.extra.get("policy_format")
    if policy_format not in trainer.FORMATS:
        held = f"policy format {policy_format!r}" if policy_format else "the hand-written model of earlier versions"
        raise ConfigMismatch(
            f"step_{saved.step} holds {held}, and this version's built-in model is a Hugging Face GPT-2 "
            f"({trainer.POLICY_FORMAT!r}), which cannot load it. To resume this run, run it with the version that "
            "wrote it; to train with this version, start a TrainingRun of another name from scratch"
        )
    workers = cfg.trainer.trainer_workers
    if policy_format == trainer.LEGACY_FORMAT and workers > 1:
        raise ConfigMismatch(
            f"spec.trainer.trainerWorkers: {workers}, but step_{saved.step} was written by an earlier version as one "
            f"trainer's files ({trainer.LEGACY_FORMAT!r}), which load on one trainer worker only. Resume with "
            "trainerWorkers: 1 until this version has written a checkpoint, then raise it"
        )
    current = config.config_hash(cfg)
    if saved.config_hash == current:
        return
    math = saved.extra.get("config_math")
    changes = [_spec_change(line) for line in config.math_diff(dict(math), config.math_fields(cfg))] if math else []
    hashes = f"config hash {saved.config_hash[:12]}, this config {current[:12]}"
    if changes:
        them, values = ("it", "value") if len(changes) == 1 else ("them", "values")
        what = f"{'; '.join(changes)} (changed since step_{saved.step} was trained; {hashes})"
    else:
        them, values = "it", "config"
        why = "its manifest lists no fields" if not math else "no field its manifest lists differs"
        what = f"spec.trainer: the math differs from step_{saved.step}'s ({hashes}; {why})"
    raise ConfigMismatch(
        f"{what}. A checkpoint resumes only under the math that wrote it: to resume from this run's checkpoints, "
        f"set {them} back and start the run again (re-create the TrainingRun under the same name, or run "
        f"`trainingrun run` again); to train with the new {values}, start a TrainingRun of another name from scratch"
    )


def spec_field(path: str) -> str:
    """A `config.MATH_FIELDS` leaf (`trainer.grpo.group_size`) as the TrainingRun spells it
    (`spec.trainer.grpo.groupSize`)."""
    return ".".join(["spec", *(to_camel(part) for part in path.split("."))])


def _spec_change(line: str) -> str:
    """`config.math_diff`'s `trainer.grpo.group_size: 4 -> 8` as `spec.trainer.grpo.groupSize: 4 -> 8`."""
    path, _, change = line.partition(": ")
    return f"{spec_field(path)}: {change}"


def refusal(error: BaseException, run_path: Path) -> Refusal:
    """What a failed restore raises, by whose fault `error` (or the cause it wraps) is: the step's (it failed
    verification, or a file under `run_path` is missing), the config's, or neither (see the module docstring)."""
    cause = root_cause(error)
    if isinstance(cause, ConfigMismatch):
        return cause
    if isinstance(cause, VERIFICATION_ERRORS) or _missing_under(cause, run_path):
        return RestoreFailed(cause)
    return RestoreInterrupted(cause)


def root_cause(error: BaseException) -> BaseException:
    """The error a wrapper stands for: our `RestoreFailed` / `RestoreInterrupted`, and Ray's task errors, keep it as
    `cause`."""
    for _ in range(8):  # a bound, should a cause ever point back at its wrapper
        cause = getattr(error, "cause", None)
        if not isinstance(cause, BaseException) or cause is error:
            break
        error = cause
    return error


def _missing_under(error: BaseException, run_path: Path) -> bool:
    """Whether `error` says that a file of the run's checkpoints (under `run_path`) is not there."""
    name = getattr(error, "filename", None)
    if not isinstance(error, FileNotFoundError) or not isinstance(name, (str, os.PathLike)):
        return False
    return Path(name).absolute().is_relative_to(run_path.absolute())


def restore(
    chosen: checkpointer.Selection | None, the_trainers: trainers.Trainers, rollout: Rollout, ev: events.EventLog
) -> Restored:
    """Restore TransferQueue, the policy and the rollout state from `chosen` (or start fresh); see the module."""
    if chosen is None:
        token = the_trainers.start_fresh()
        ev.emit("tq_fresh")
        return Restored(token=token, step=None, replay_state=None, replay_digest=None, last_checkpoint=None)
    try:
        verified = chosen.verified
        token = the_trainers.load_data_plane_checkpoint(verified.data_plane, verified.entries(layout.DATA_PLANE)).token
        ev.emit("tq_restored", step=chosen.manifest.step)
        _load_policy(chosen, the_trainers)
        ev.emit("policy_loaded", step=chosen.manifest.step)
        _load_rollout(chosen, rollout)
    except Exception as e:
        raise refusal(e, chosen.verified.path.parent) from e
    m = chosen.manifest
    return Restored(
        token=token,
        step=m.step,
        replay_state=dict(chosen.replay_state),
        replay_digest=m.replay_digest,
        last_checkpoint=record.resumed_report(chosen.verified),
        rejected=tuple(rejected_steps(chosen.skipped)),
    )


def _load_policy(chosen: checkpointer.Selection, the_trainers: trainers.Trainers) -> None:
    verified, m = chosen.verified, chosen.manifest
    sha = the_trainers.load(verified.path / layout.POLICY, verified.entries(layout.POLICY))
    if sha != m.weights_sha256:
        raise CheckpointCorrupt(f"{verified.path}: loaded weights hash {sha}, the manifest says {m.weights_sha256}")


def _load_rollout(chosen: checkpointer.Selection, rollout: Rollout) -> None:
    verified, m = chosen.verified, chosen.manifest
    with verified.open(layout.TRAIN_DATALOADER) as f:
        state = torch.load(f, weights_only=True)
    rollout.loader.load_state_dict(state["loader"])
    rollout.sampler.load_state_dict(state["sampler"])
    rollout.ledger.load_state_dict(dict(chosen.restart["ledger"]))
    if (rollout.sampler.step, rollout.loader.state_dict()) != (m.step, chosen.restart["loader"]):
        raise CheckpointCorrupt(
            f"{verified.path}: train_dataloader.pt (step {rollout.sampler.step}) disagrees with the state "
            f"captured with the replay index (step {m.step})"
        )
    rollout.ledger.check_served(rollout.loader.next_uid)
