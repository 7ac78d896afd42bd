"""setup_single_controller(): the driver builds every object, restores, then creates the controller actor.

    1  pick the checkpoint (verify every checksum) and check its config hash      no Ray yet: fail fast
    2  ray.init                                                                    (or attach via RAY_ADDRESS)
    3  TQPolicy: trainer worker + BOOTSTRAP data-plane client (starts TransferQueue)
    4  restore TransferQueue through the bootstrap client ─► DataPlaneToken       BEFORE any other client,
       (or start_fresh ─► token)                                                   the buffer or the actor exist
    5  load policy/ into the trainer; check weights_sha256 against the manifest
    6  generation workers, given the trainer's weights (version = restored step)
    7  loader, sampler, ledger: built, then loaded from train_dataloader.pt / ledger.json
    8  SingleControllerActorArgs(everything above + restore metadata + replay index) ─► actor

The token from step 4 is the structural proof of ordering: a connect-only client
(`ConnectOnlyDataPlane.connect(token)`) cannot be built without it, and the replay
buffer needs that client. Both are process-bound, so the controller builds them at
the start of `run()` from the token, after this function returned. Every step
emits an event (`events.EventLog`) so tests can check the order and the benchmark
can split the start-up time.

Any failure while restoring (steps 1, 4, 5, 7) is raised as `RestoreFailed`, which
the entrypoint maps to exit code 3.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import torch

from trainingrun_runtime import config
from trainingrun_runtime.dataplane import checkpointer
from trainingrun_runtime.driver import controller, crashpoints, events, generation_workers, reporting, trainers
from trainingrun_runtime.grpo import task, trainer
from trainingrun_runtime.rollout import ledger, prompt_loader, samplers
from trainingrun_runtime.storage import fence, layout, manifest
from trainingrun_runtime.errors import CheckpointCorrupt, ConfigMismatch, TrainingRunError

__all__ = ["DriverOptions", "RestoreFailed", "Setup", "check_config", "select_checkpoint", "setup_single_controller"]

log = logging.getLogger(__name__)


class RestoreFailed(Exception):
    """Restoring the chosen checkpoint failed; `cause` is the original error (exit code 3)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


_PROGRESS_PERIOD_S = reporting.PROGRESS_PERIOD_S  # (a field below is named `reporter`)


@dataclasses.dataclass(frozen=True)
class DriverOptions:
    """The entrypoint's arguments."""

    run: str
    namespace: str
    attempt: int
    resume: str
    """`latest` or a step number."""
    root: str
    config: config.RuntimeConfig
    reporter: str
    event_log: str | None = None
    num_cpus: int = 8
    progress_period_s: float = _PROGRESS_PERIOD_S
    run_uid: str | None = None
    """The TrainingRun's uid; with the attempt it claims the run directory (`fence`)."""


@dataclasses.dataclass
class Setup:
    """What the driver holds after setup: the actor, the policy (for closing TQ) and its arguments."""

    actor: Any
    policy: trainers.TQPolicy
    args: controller.SingleControllerActorArgs


def select_checkpoint(root: str, run: str, resume: str, cfg: config.TrainerConfig) -> checkpointer.Selection | None:
    """The checkpoint to resume from, every check passed, nothing loaded: newest valid, pinned, or None (fresh)."""
    if resume == "latest":
        step = None
    else:
        try:
            step = int(resume)
        except ValueError:
            raise ValueError(f"--resume must be 'latest' or a step number, got {resume!r}") from None
    chosen = checkpointer.select(
        root, run, config=controller.replay_config(cfg), storage_units=trainers.STORAGE_UNITS, step=step
    )
    if chosen is not None:
        for path, reason in chosen.skipped:
            log.warning("not resuming from %s: %s", path, reason)
    return chosen


def check_config(manifest: manifest.Manifest, cfg: config.RuntimeConfig) -> None:
    """Refuse (ConfigMismatch) a checkpoint written under different math; harmless fields never refuse."""
    current = config.config_hash(cfg)
    if manifest.config_hash == current:
        return
    saved = manifest.extra.get("config_math", {})
    diff = config.math_diff(dict(saved), config.math_fields(cfg)) if saved else ["(the manifest lists no fields)"]
    raise ConfigMismatch(
        f"step_{manifest.step} was written with config hash {manifest.config_hash[:12]}, the current config has "
        f"{current[:12]}; fields that change the math differ: " + "; ".join(diff)
    )


def _init_ray(opts: DriverOptions) -> None:
    import ray

    # TransferQueue sizes its torch thread pools from this; more than the machine's cores only warns.
    os.environ.setdefault("TQ_NUM_THREADS", str(min(8, os.cpu_count() or 1)))
    address = os.environ.get("RAY_ADDRESS")
    logging_config = ray.LoggingConfig(log_level="INFO")
    if address:
        ray.init(address=address, logging_config=logging_config)
    else:
        ray.init(
            address="local", num_cpus=opts.num_cpus, include_dashboard=False, logging_config=logging_config
        )


def setup_single_controller(opts: DriverOptions, ev: events.EventLog) -> Setup:
    """Build and restore everything on the driver, then create the controller actor (see module docstring)."""
    tcfg = opts.config.trainer
    # Before anything reads or writes checkpoints: this attempt owns the run directory from now on; a driver of
    # an older attempt that lives on (a partitioned node) stops at its next write (Superseded).
    fence.claim(layout.run_dir(opts.root, opts.run), opts.run_uid, opts.attempt)
    ev.emit("run_dir_claimed", attempt=opts.attempt)
    try:
        chosen = select_checkpoint(opts.root, opts.run, opts.resume, tcfg)
        if chosen is not None:
            check_config(chosen.manifest, opts.config)
    except (TrainingRunError, ValueError, OSError) as e:
        raise RestoreFailed(e) from e
    ev.emit("checkpoint_selected", step=None if chosen is None else chosen.manifest.step)

    _init_ray(opts)
    ev.emit("ray_started")
    prefix = f"{opts.run}-a{opts.attempt}"
    the_policy = trainers.TQPolicy(tcfg, prefix)
    ev.emit("tq_started")

    restored_metadata: dict[str, Any] | None = None
    replay_state: dict[str, Any] | None = None
    replay_digest: str | None = None
    the_loader = prompt_loader.PromptLoader(tcfg.task.dataset_size, tcfg.seed)
    the_sampler = samplers.build(tcfg)
    the_ledger = ledger.Ledger()
    last: reporting.CheckpointReport | None = None
    try:
        if chosen is None:
            token = the_policy.start_fresh()
            ev.emit("tq_fresh")
        else:
            m, verified = chosen.manifest, chosen.verified
            restored = the_policy.load_data_plane_checkpoint(verified.data_plane)
            token, restored_metadata = restored.token, restored.metadata
            ev.emit("tq_restored", step=m.step)
            sha = the_policy.load(verified.file(f"{layout.POLICY}/{trainer.MODEL_FILE}").parent)
            if sha != m.weights_sha256:
                raise CheckpointCorrupt(f"{verified.path}: loaded weights hash {sha}, the manifest says {m.weights_sha256}")
            ev.emit("policy_loaded", step=m.step)
            state = torch.load(verified.file(layout.TRAIN_DATALOADER), weights_only=True)
            the_loader.load_state_dict(state["loader"])
            the_sampler.load_state_dict(state["sampler"])
            the_ledger.load_state_dict(dict(chosen.restart["ledger"]))
            replay_state = dict(chosen.replay_state)
            replay_digest = m.replay_digest
            if (the_sampler.step, the_loader.state_dict()) != (m.step, chosen.restart["loader"]):
                raise CheckpointCorrupt(
                    f"{verified.path}: train_dataloader.pt (step {the_sampler.step}) disagrees with the state "
                    f"captured with the replay index (step {m.step})"
                )
            last = reporting.CheckpointReport(
                step=m.step, path=str(verified.path), attempt=m.attempt, replayDigest=m.replay_digest,
                weightsSha256=m.weights_sha256, time=m.created,
            )
    except Exception as e:  # noqa: BLE001 - every restore failure is exit code 3, with its cause
        the_policy.close()
        raise RestoreFailed(getattr(e, "cause", None) or e) from e

    import ray

    generators = generation_workers.spawn(tcfg, prefix)
    version = the_sampler.step
    weights = the_policy.weights_ref()
    ray.get([g.load_weights.remote(version, weights) for g in generators])
    ev.emit("generators_ready", version=version)

    args = controller.SingleControllerActorArgs(
        config=opts.config,
        run=opts.run,
        attempt=opts.attempt,
        root=opts.root,
        config_hash=config.config_hash(opts.config),
        policy=the_policy,
        generators=generators,
        task=task.Task(tcfg.task, tcfg.seed),
        loader=the_loader,
        sampler=the_sampler,
        ledger=the_ledger,
        token=token,
        data_plane_checkpoint_metadata=restored_metadata,
        replay_state=replay_state,
        replay_digest=replay_digest,
        restored_step=None if chosen is None else chosen.manifest.step,
        status_reporter=reporting.build(
            opts.reporter, root=opts.root, run=opts.run, namespace=opts.namespace, attempt=opts.attempt
        ),
        event_log=ev,
        crash=crashpoints.CrashPoints.from_env(Path(opts.root) / opts.run / "crash-markers"),
        last_checkpoint=last,
        progress_period_s=opts.progress_period_s,
        run_uid=opts.run_uid,
    )
    the_actor = controller.actor(f"{prefix}-controller").remote(args)
    ev.emit("actor_created")
    return Setup(actor=the_actor, policy=the_policy, args=args)
