"""The driver entrypoint: arguments in, exit code out (`python -m trainingrun_runtime`).

    parse args + config ──bad──► stderr "BadConfig: …", Exit.BAD_CONFIG
    setup_single_controller() ──a restore failed──► report restoreError, then by whose fault (`restore.refusal`):
        the step failed verification (RestoreFailed) ──► stderr "RestoreFailed: …", Exit.RESTORE_FAILED
        its math differs from the config (ConfigMismatch) ──► stderr "ConfigMismatch: <field: old -> new> … <fix>",
                                                              Exit.CONFIG_MISMATCH
        neither: I/O, Ray, a timeout (RestoreInterrupted) ──► the cause's traceback, "RestoreInterrupted: …",
                                                              Exit.RESTORE_INTERRUPTED
    actor.run() ──GenerationLost──► stderr "GenerationLost: …", Exit.GENERATION_LOST (no generation worker came back)
    actor.run() ──TrainerLost─────► stderr "TrainerLost: …", Exit.TRAINER_LOST (a trainer rank's node left the cluster)
               ──the index rebuild failed (PreflightError, DigestError)──► as a failed verification: RESTORE_FAILED
               ──stopped on the head's preemption notice──► report, stderr "Preempted: …", Exit.PREEMPTED
               ──error──► Exit.FAILED (its original error is logged)
    final report (finished: true), close TransferQueue, ray.shutdown ──► Exit.OK

    python -m trainingrun_runtime --run NAME --namespace NS --attempt N --resume latest|<step> [--fallback S,S]
        [--manifest-blake3 S=HEX,S=HEX] --root DIR --config-json '<RuntimeConfig JSON>' --reporter kubernetes|file
        [--event-log FILE]
        [--run-uid UID] [--legacy-root DIR] [--progress-period SECONDS]

Checkpoints live in DIR/<run>/step_N/ (the operator's DIR ends in the run's namespace; --legacy-root names the root
before that level, whose <run> directory is moved into DIR if this run owns it: `setup.adopt_legacy_run_dir`).
Ray: `RAY_ADDRESS` attaches to a cluster (the RayJob case); otherwise a local Ray with `--num-cpus` logical CPUs
starts.
This is the only module that prints (the final `RestoreFailed:`, `GenerationLost:`, … line); the log's format is
`logformat`'s.

The operator classifies an attempt by these exit codes and the prefix of the last stderr line, or of
`status.runtime.restoreError`: the exit codes, the prefixes and the report are `trainingrun_runtime.contract`, which
both sides import. BAD_CONFIG stays a config that does not parse, which the operator's own validation of
spec.trainer rules out; a valid config that does not fit the checkpoint (a user's edit of spec.trainer) is
CONFIG_MISMATCH, so that the operator can name the fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import traceback
from pathlib import Path

import pydantic

from trainingrun_runtime import config, contract
from trainingrun_runtime.contract import Exit, Prefix
from trainingrun_runtime.driver import events, logformat, restore, setup
from trainingrun_runtime.errors import (
    ConfigMismatch,
    DigestError,
    GenerationLost,
    InvalidSpec,
    PreflightError,
    RestoreFailed,
    RestoreInterrupted,
    RewardFailed,
    Superseded,
    TrainerLost,
)
from trainingrun_runtime.sdk import record, reporting
from trainingrun_runtime.storage import checksum

__all__ = [
    "RestoreExit",
    "main",
    "parse",
    "restore_exit",
]


log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainingrun_runtime", description="Run or resume one GRPO attempt.")
    p.add_argument("--run", required=True, help="TrainingRun name; checkpoints go to ROOT/RUN/step_N")
    p.add_argument("--namespace", default="default", help="Kubernetes namespace of the TrainingRun")
    p.add_argument("--attempt", type=int, required=True, help="attempt number (fencing for reports)")
    p.add_argument("--resume", default="latest", help="'latest' (newest valid checkpoint, else fresh) or a step")
    p.add_argument(
        "--fallback",
        default="",
        help="older recorded steps, comma-separated: resumed from (newest first) if the pinned one fails verification",
    )
    p.add_argument(
        "--manifest-blake3",
        default="",
        metavar="STEP=HEX,...",
        help="the BLAKE3 of the pinned and fallback steps' manifest.json as the run's status recorded them: a step "
        "whose manifest hashes otherwise fails verification",
    )
    p.add_argument("--root", required=True, help="checkpoint root directory")
    p.add_argument("--config-json", required=True, help="RuntimeConfig as JSON ({trainer, checkpoint})")
    p.add_argument("--reporter", choices=["kubernetes", "file"], default="file")
    p.add_argument("--event-log", default=None,
                   help="append start-up/controller events as JSON lines here "
                        "(default: ROOT/RUN/attempts/ATTEMPT/events.jsonl, beside the checkpoints)")  # fmt: skip
    p.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of a local Ray (ignored with RAY_ADDRESS)")
    p.add_argument(
        "--run-uid",
        default=None,
        help="the TrainingRun's uid: with --attempt, claims the run directory (owner.json) against zombies",
    )
    p.add_argument(
        "--legacy-root",
        default=None,
        metavar="DIR",
        help="the checkpoint root of the layout before the namespace level: DIR/RUN moves to ROOT/RUN if this run "
        "owns it (its owner.json names --run-uid)",
    )
    p.add_argument(
        "--progress-period",
        type=float,
        default=reporting.PROGRESS_PERIOD_S,
        metavar="SECONDS",
        help="at most one progress report (status.runtime.step) per this many seconds",
    )
    return p


def _manifest_hashes(given: str, resume: str, fallback: tuple[int, ...]) -> dict[int, str]:
    """`--manifest-blake3` as {step: hex}: only for the pinned step and the fallback ones, each once."""
    if not given:
        return {}
    steps = set(fallback) | ({int(resume)} if resume.isdigit() else set())
    found: dict[int, str] = {}
    for item in given.split(","):
        step, sep, digest = item.partition("=")
        if not sep or not step.isdigit() or not checksum.is_hex_digest(digest):
            raise ValueError(
                f"--manifest-blake3 must be STEP=HEX pairs (HEX: 64 lowercase hex digits) separated by commas; "
                f"got {item!r}"
            )
        if int(step) not in steps or int(step) in found:
            raise ValueError(
                f"--manifest-blake3 names step {step}, which is not the --resume step or a --fallback one, or names "
                "it twice"
            )
        found[int(step)] = digest
    return found


def parse(argv: list[str]) -> setup.DriverOptions:
    """Arguments to options; argparse exits 2 on usage errors, a bad config raises ValueError."""
    ns = _parser().parse_args(argv)
    try:
        cfg = config.RuntimeConfig.model_validate_json(ns.config_json)
    except pydantic.ValidationError as e:
        raise ValueError(f"--config-json is not a valid RuntimeConfig:\n{e}") from None
    if ns.resume != "latest" and not ns.resume.isdigit():
        raise ValueError(f"--resume must be 'latest' or a step number, got {ns.resume!r}")
    if ns.fallback and (not all(s.isdigit() for s in ns.fallback.split(",")) or ns.resume == "latest"):
        raise ValueError(
            f"--fallback must be step numbers separated by commas, with --resume <step>; got {ns.fallback!r}"
        )
    fallback = tuple(int(s) for s in ns.fallback.split(",")) if ns.fallback else ()
    manifest_blake3 = _manifest_hashes(ns.manifest_blake3, ns.resume, fallback)
    if ns.attempt < 0:
        raise ValueError("--attempt must be >= 0")
    if ns.progress_period < 0:
        raise ValueError(f"--progress-period must be >= 0 seconds, got {ns.progress_period}")
    return setup.DriverOptions(
        run=ns.run,
        namespace=ns.namespace,
        attempt=ns.attempt,
        resume=ns.resume,
        fallback=fallback,
        manifest_blake3=manifest_blake3,
        root=ns.root,
        config=cfg,
        reporter=ns.reporter,
        event_log=ns.event_log,
        num_cpus=ns.num_cpus,
        progress_period_s=ns.progress_period,
        run_uid=ns.run_uid,
        legacy_root=ns.legacy_root,
    )


def main(argv: list[str] | None = None) -> Exit:
    """Run one attempt; returns the exit code."""
    logformat.configure()
    try:
        opts = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(contract.line(Prefix.BAD_CONFIG, e), file=sys.stderr)
        return Exit.BAD_CONFIG
    moved_from = setup.adopt_legacy_run_dir(opts)  # before the default event log creates ROOT/RUN
    ev = events.EventLog(opts.event_log or events.default_path(opts.root, opts.run, opts.attempt))
    ev.emit("driver_started", attempt=opts.attempt)
    if moved_from is not None:
        ev.emit("run_dir_moved", source=str(moved_from), to=str(Path(opts.root) / opts.run))
    rep = reporting.build(opts.reporter, root=opts.root, run=opts.run, namespace=opts.namespace, attempt=opts.attempt)
    try:
        built = setup.setup_single_controller(opts, ev)
    except Superseded as e:
        print(contract.line(Prefix.SUPERSEDED, e), file=sys.stderr)
        return Exit.FAILED
    except (InvalidSpec, RewardFailed) as e:  # the spec's model, data or reward: retrying cannot help
        _shutdown_ray()
        print(contract.line(Prefix.BAD_CONFIG, e), file=sys.stderr)
        return Exit.BAD_CONFIG
    except (RestoreFailed, ConfigMismatch, RestoreInterrupted) as e:
        ended = restore_exit(e)
        assert ended is not None, "each of the three is a restore failure"
        cause = e.cause if isinstance(e, RestoreFailed) else None
        rejected = cause.rejected if isinstance(cause, restore.NoRecordedCheckpointVerifies) else []
        _report_restore_error(rep, opts, ended.report, rejected)
        _shutdown_ray()
        _print_restore_exit(e, ended)
        return ended.code
    except GenerationLost as e:
        _shutdown_ray()
        print(contract.line(Prefix.GENERATION_LOST, e), file=sys.stderr)
        return Exit.GENERATION_LOST
    except TrainerLost as e:  # a rank's node gone during the restore
        _shutdown_ray()
        print(contract.line(Prefix.TRAINER_LOST, e), file=sys.stderr)
        return Exit.TRAINER_LOST
    import ray

    try:
        result = ray.get(built.actor.run.remote())
    except Exception as e:
        cause = getattr(e, "cause", None) or e
        log.error("run failed: %s: %s", type(cause).__name__, cause)
        if isinstance(cause, GenerationLost):
            _close(built)
            print(contract.line(Prefix.GENERATION_LOST, cause), file=sys.stderr)
            return Exit.GENERATION_LOST
        lost = restore.root_cause(cause)  # Ray wraps it once per actor it passed: the controller
        if isinstance(lost, TrainerLost):
            _close(built)
            print(contract.line(Prefix.TRAINER_LOST, lost), file=sys.stderr)
            return Exit.TRAINER_LOST
        spec_error = restore.root_cause(cause)  # Ray wraps it once per actor it passed: generator, controller
        if isinstance(spec_error, InvalidSpec | RewardFailed):  # a reward function that raised on a sample, say
            _close(built)
            print(contract.line(Prefix.BAD_CONFIG, spec_error), file=sys.stderr)
            return Exit.BAD_CONFIG
        ended = restore_exit(cause)
        if ended is not None:
            _report_restore_error(rep, opts, ended.report)
            _close(built)
            _print_restore_exit(cause, ended)
            return ended.code
        traceback.print_exception(cause)
        _close(built)
        return Exit.FAILED
    rep.report(result.record.status(finished=result.notice is None))
    _close(built)
    if result.notice is not None:
        saved = "nothing" if result.notice.step is None else f"step {result.notice.step}"
        stopped = f"stopped at step {result.step} on the head pod's notice; saved {saved} ({result.notice.why})"
        print(contract.line(Prefix.PREEMPTED, stopped), file=sys.stderr)
        return Exit.PREEMPTED
    log.info("run %s finished at step %d, weights_sha256 %s", opts.run, result.step, result.weights_sha256)
    return Exit.OK


@dataclasses.dataclass(frozen=True)
class RestoreExit:
    """How the driver ends after a failed restore: its exit code and what it says (see the module docstring)."""

    code: Exit
    line: str
    """The last stderr line: a `contract.Prefix`, then what failed."""
    report: str
    """`status.runtime.restoreError`: the line, without a leading `RestoreFailed: `."""


def restore_exit(error: BaseException) -> RestoreExit | None:
    """The exit of a driver whose restore (setup's, or the actor's index rebuild) failed with `error`; None if
    `error` is no restore failure (the actor's other errors are `Exit.FAILED`)."""
    # PreflightError and DigestError are raised in the actor only while it rebuilds the replay index, before the
    # pumps start, from a step that passed verification and the config check: its index does not hold together.
    if isinstance(error, (PreflightError, DigestError)):
        error = RestoreFailed(error)
    if isinstance(error, RestoreFailed):
        return RestoreExit(Exit.RESTORE_FAILED, contract.line(Prefix.RESTORE_FAILED, error), str(error))
    if isinstance(error, ConfigMismatch):
        said = contract.line(Prefix.CONFIG_MISMATCH, error)
        return RestoreExit(Exit.CONFIG_MISMATCH, said, said)
    if isinstance(error, RestoreInterrupted):
        said = contract.line(
            Prefix.RESTORE_INTERRUPTED, f"{error} (not the checkpoint's fault: a new attempt may succeed)"
        )
        return RestoreExit(Exit.RESTORE_INTERRUPTED, said, said)
    return None


def _print_restore_exit(error: BaseException, ended: RestoreExit) -> None:
    if isinstance(error, RestoreInterrupted):  # an error nobody foresaw: its traceback is all there is to go on
        log.error("restore interrupted", exc_info=error.cause)
    print(ended.line, file=sys.stderr)


def _report_restore_error(
    rep: reporting.Reporter, opts: setup.DriverOptions, message: str, rejected: list[tuple[Path, str]] | None = None
) -> None:
    rep.report(record.restore_error(opts.attempt, message, restore.rejected_steps(rejected or [])))


def _close(built: setup.Setup) -> None:
    try:
        built.trainers.close()
    except Exception:
        log.exception("closing TransferQueue or stopping the trainer worker failed")
    _shutdown_ray()


def _shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
