"""setup_single_controller(): the driver builds every object, restores, then creates the controller actor.

    0  (`adopt_legacy_run_dir`, by the entrypoint before its event log opens)     run_dir_moved
       the run directory of the layout before the namespace level, if this run
       owns it, moves to ROOT/RUN (`fence.adopt`)
    1  claim the run directory for this attempt (`storage.fence`)                 run_dir_claimed
       set aside the steps above a pinned resume point that the status does not   checkpoints_set_aside
       record (`orphan_step_N`: never counted, loaded or deleted)
    2  choose the checkpoint: every checksum verified, the config hash checked;   checkpoint_rejected,  no Ray yet
       a pinned step that fails is passed over for an older recorded one         checkpoint_selected
    3  ray.init (or attach via RAY_ADDRESS)                                       ray_started (its metrics port)
    4  the generation workers' and the trainer worker's processes start (neither  tq_started
       touches TransferQueue) while the BOOTSTRAP data-plane client starts it
    5  restore (`restore.restore`): TransferQueue through the bootstrap client    tq_restored | tq_fresh
       ─► DataPlaneToken, BEFORE any other client, the buffer or the actor exist;
       policy/ into the trainer; the loader place, sampler cursor and ledger      policy_loaded
    6  the generation workers get the trainer's weights (version = restored step) generators_ready
    7  SingleControllerActorArgs(everything above) ─► the controller actor         actor_created

The token from step 5 is the structural proof of ordering: a connect-only client
(`ConnectOnlyDataPlane.connect(token)`) cannot be built without it, and the replay
buffer needs that client. Both are process-bound, so the controller builds them at
the start of `run()` from the token, after this function returned. Every step
emits an event (`events.EventLog`) so tests can check the order and the benchmark
can split the start-up time. Any failure while restoring (steps 2 and 5) is raised
as `RestoreFailed`, which the entrypoint maps by whose fault it is (`restore.refusal`: `contract.Exit`
RESTORE_FAILED for a step that failed verification, CONFIG_MISMATCH for a config mismatch, RESTORE_INTERRUPTED for
anything else). How long steps 2 and 5 took together is the restore's duration, which the controller exports
(`telemetry`). A failure after step 3 (the controller actor not created included) takes down, newest first, what was
started: the trainer worker, TransferQueue and the generation workers; once the actor exists, the entrypoint does
(`entrypoint._close`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainingrun_runtime import config
from trainingrun_runtime.dataplane import checkpointer
from trainingrun_runtime.driver import (
    controller,
    crashpoints,
    events,
    generation_workers,
    logformat,
    placement,
    restore,
    trainers,
)
from trainingrun_runtime.errors import GenerationLost
from trainingrun_runtime.grpo import workload
from trainingrun_runtime.sdk import attached, reporting
from trainingrun_runtime.storage import fence, layout

__all__ = ["DriverOptions", "Setup", "adopt_legacy_run_dir", "setup_single_controller"]

log = logging.getLogger(__name__)


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
    """`kubernetes` or `file` (`reporting.build`)."""
    event_log: str | None = None
    fallback: tuple[int, ...] = ()
    """Older recorded steps to resume from if the pinned one fails verification (`restore.choose`)."""
    manifest_blake3: Mapping[int, str] = dataclasses.field(default_factory=dict)
    """The BLAKE3 of the pinned and fallback steps' manifests, as the status recorded them (`restore.choose`)."""
    num_cpus: int = 8
    progress_period_s: float = reporting.PROGRESS_PERIOD_S
    run_uid: str | None = None
    """The TrainingRun's uid; with the attempt it claims the run directory (`fence`)."""
    legacy_root: str | None = None
    """The root of the layout before the namespace level: LEGACY_ROOT/RUN is adopted if this run owns it."""


@dataclasses.dataclass
class Setup:
    """What the driver holds after setup: the actor, the trainers (for closing TransferQueue) and its arguments."""

    actor: Any
    trainers: trainers.Trainers
    args: controller.SingleControllerActorArgs


def _init_ray(opts: DriverOptions) -> None:
    import ray

    # TransferQueue sizes its torch thread pools from this; more than the machine's cores only warns.
    os.environ.setdefault("TQ_NUM_THREADS", str(min(8, os.cpu_count() or 1)))
    address = os.environ.get("RAY_ADDRESS")
    logformat.plain_worker_prefix()
    if address:
        ray.init(address=address, runtime_env=logformat.RUNTIME_ENV)
    else:
        # Every process of a run is an actor, started when it is created: the worker processes Ray would start ahead
        # for the first driver would only idle (about 0.5 s of CPU and 100 MB each).
        ray.init(
            address="local",
            num_cpus=opts.num_cpus,
            include_dashboard=False,
            runtime_env=logformat.RUNTIME_ENV,
            _system_config={"prestart_worker_first_driver": False},
        )


def _metrics_port() -> int | None:
    """The port this node's Ray serves its metrics (and the driver's, `telemetry`) on for Prometheus."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    return next((int(n["MetricsExportPort"]) for n in nodes if n.get("NodeID") == here), None)


def adopt_legacy_run_dir(opts: DriverOptions) -> Path | None:
    """With a legacy root: move LEGACY_ROOT/RUN to ROOT/RUN if this run owns it (`fence.adopt`); where it was, or
    None if nothing moved. Before anything creates ROOT/RUN (the default event log lives in it)."""
    if opts.legacy_root is None:
        return None
    legacy = layout.run_dir(opts.legacy_root, opts.run)
    new = layout.run_dir(opts.root, opts.run)
    if legacy.resolve() == new.resolve():
        return None
    moved = fence.adopt(legacy, new, opts.run_uid)
    return legacy if moved is fence.Adoption.MOVED else None


def setup_single_controller(opts: DriverOptions, ev: events.EventLog) -> Setup:
    """Build and restore everything on the driver, then create the controller actor (see module docstring).

    If any step after Ray started fails, what was started is taken down before the error is raised: the controller
    actor was never created, so nothing else would stop the trainer worker, TransferQueue or the generation workers.
    """
    tcfg = opts.config.trainer
    # Before anything reads or writes checkpoints: this attempt owns the run directory from now on; a driver of
    # an older attempt that lives on (a partitioned node) stops at its next write (Superseded).
    fence.claim(layout.run_dir(opts.root, opts.run), opts.run_uid, opts.attempt)
    ev.emit("run_dir_claimed", attempt=opts.attempt)
    reporter = reporting.build(
        opts.reporter, root=opts.root, run=opts.run, namespace=opts.namespace, attempt=opts.attempt
    )
    orphaned = _set_aside_orphans(opts, reporter)
    if orphaned:
        ev.emit("checkpoints_set_aside", steps=orphaned)
    chosen, restore_s = _choose(opts, ev)
    data = workload.check(tcfg)  # a wrong model, data or reward field fails here (InvalidSpec), before Ray starts
    if data is not None:
        ev.emit("data_read", rows=len(data), fingerprint=data.fingerprint)
        if chosen is not None:
            restore.check_data(chosen.manifest, data.fingerprint)

    _init_ray(opts)
    ev.emit("ray_started", metrics_port=_metrics_port())
    prefix = f"{opts.run}-a{opts.attempt}"
    head = placement.head_node()  # run state lives here: TransferQueue, the trainer, the controller
    with contextlib.ExitStack() as undo:  # a failure from here on takes down what was started, newest first
        # Generation workers first: their processes start while TransferQueue does (they never touch it).
        import ray

        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        devices = placement.gpus(
            nodes, head, opts.config.generation, tcfg.generation_workers, tcfg.trainer_workers, opts.config.trainers
        )
        generation_options = placement.generation(opts.config.generation, devices.generator)
        generators: list[Any] = []
        _on_failure(undo, "the generation workers", lambda: _kill(generators))
        for i in range(tcfg.generation_workers):
            generators.append(generation_workers.spawn(tcfg, f"{prefix}-gen-{i}", generation_options))
        crash = crashpoints.CrashPoints.from_env(Path(opts.root) / opts.run / "crash-markers")
        the_trainers = trainers.Trainers(
            tcfg, prefix, head, num_gpus=devices.trainer, trainers=opts.config.trainers, crash=crash
        )
        _on_failure(undo, "the trainer worker and TransferQueue", the_trainers.close)
        ev.emit("tq_started")
        rollout = restore.Rollout.fresh(tcfg, workload.dataset_size(tcfg, data))
        began = time.monotonic()
        restored = restore.restore(chosen, the_trainers, rollout, ev)
        restore_s += time.monotonic() - began
        _load_generators(
            generators, the_trainers, version=rollout.sampler.step, within_s=opts.config.generation.replacement_seconds
        )
        ev.emit("generators_ready", version=rollout.sampler.step)
        args = controller.SingleControllerActorArgs(
            config=opts.config,
            run=opts.run,
            attempt=opts.attempt,
            root=opts.root,
            config_hash=config.config_hash(opts.config),
            trainers=the_trainers,
            generators=generators,
            generation_options=generation_options,
            name_prefix=prefix,
            loader=rollout.loader,
            sampler=rollout.sampler,
            ledger=rollout.ledger,
            restored=restored,
            status_reporter=reporter,
            event_log=ev,
            crash=crash,
            progress_period_s=opts.progress_period_s,
            run_uid=opts.run_uid,
            namespace=opts.namespace,
            restore_s=restore_s if chosen is not None else None,
            orphaned=tuple(orphaned[-reporting.ORPHANS_LISTED :]),
            data_fingerprint=None if data is None else data.fingerprint,
        )
        the_actor = controller.actor(f"{prefix}-controller", head).remote(args)
        undo.pop_all()  # created: the entrypoint takes them down from here on (`entrypoint._close`)
    ev.emit("actor_created")
    return Setup(actor=the_actor, trainers=the_trainers, args=args)


def _choose(opts: DriverOptions, ev: events.EventLog) -> tuple[checkpointer.Selection | None, float]:
    """Step 2: the checkpoint to resume from (None: a fresh start), and how long choosing it took."""
    began = time.monotonic()
    chosen = restore.choose(
        opts.root,
        opts.run,
        opts.resume,
        opts.config,
        controller.replay_config(opts.config.trainer),
        fallback=opts.fallback,
        manifest_blake3=opts.manifest_blake3,
    )
    for bad in restore.rejected_steps(chosen.skipped if chosen is not None else []):
        ev.emit("checkpoint_rejected", step=bad["step"], problem=bad["problem"])
    ev.emit("checkpoint_selected", step=None if chosen is None else chosen.manifest.step)
    return chosen, time.monotonic() - began


def _on_failure(undo: contextlib.ExitStack, what: str, take_down: Callable[[], None]) -> None:
    """Run `take_down` if the setup fails; its own failure is logged, so that the setup's error is what is raised
    (the entrypoint maps that one to an exit code)."""

    def quietly() -> None:
        try:
            take_down()
        except Exception:
            log.exception("taking down %s after a failed setup failed too", what)

    undo.callback(quietly)


def _kill(actors: list[Any]) -> None:
    import ray

    for actor in actors:
        ray.kill(actor, no_restart=True)


def _set_aside_orphans(opts: DriverOptions, reporter: reporting.Reporter) -> list[int]:
    """With a pinned resume step: set aside the steps above it that the status records nowhere (the SDK's rule)."""
    pinned = int(opts.resume) if opts.resume.isdigit() else None
    return attached.set_aside_orphans(opts.root, opts.run, pinned, opts.fallback, reporter)


def _load_generators(generators: list[Any], the_trainers: trainers.Trainers, *, version: int, within_s: float) -> None:
    """Give every generation worker the trainer's current weights as policy `version`.

    GenerationLost if they are not all up within `within_s` seconds (a worker group whose pods never come: the
    same bound as for a lost worker's replacement).
    """
    import ray
    from ray.exceptions import GetTimeoutError

    weights = the_trainers.weights_ref()
    try:
        ray.get([g.load_weights.remote(version, weights) for g in generators], timeout=within_s)
    except GetTimeoutError:
        raise GenerationLost(
            f"{len(generators)} generation workers were not all up within {within_s:g} s "
            "(spec.restartPolicy.workerReplacementSeconds): no room for them on the worker groups?"
        ) from None
