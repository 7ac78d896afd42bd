"""`attach()` and the `Run` it returns: one attempt of a TrainingRun, seen from the program that runs it.

    attach()            ATTACH_ENV ─► Attachment; claim <root>/<run> for (run uid, attempt) (`storage.fence`); with a
                        pinned step, set aside the unrecorded steps above it; listen for the head's notice
    resume_dir()        the pinned step, else the newest fallback, that verifies (manifest BLAKE3 as recorded, every
                        checksum); with none pinned the newest step that verifies; None: a fresh start. None verifies:
                        report restoreError, say `RestoreFailed: ...`, exit RESTORE_FAILED (the steps are marked bad)
    checkpoint(step)    begin tmp_step_N.attempt_A/ (fenced) ─► the program writes ─► commit: fsync and hash every
                        file, manifest last, fence, rename to step_N ─► report lastCheckpoint ─► retention (never
                        the step the operator would resume from). An exception inside discards the directory.
    report(step, ...)   a progress report: now if none went out within the period, else at its end (the built-in
                        driver's `reporting.ProgressReports`, on an event loop in a thread of its own)
    notice, should_save the head's preStop request (`sdk.notice`), read at most every POLL_S; should_save is the
                        save rule of `sdk.record` (a notice's save while it fits before the deadline, else every
                        savePeriod steps)
    stop()              answer the notice with the newest checkpoint, report, say `Preempted: ...`, exit PREEMPTED
    finish(step)        the final report (finished: true)

What the reports say is `sdk.record.AttemptRecord`'s, and the files are the built-in driver's: the same bundle rules
(`storage.commit`), the same fence, the same resume rule (`pinned_or_older`), the same retention (`retain`), the same
reporters (`sdk.reporting`: a merge patch of status.runtime on a cluster, runtime.json locally), the same notice
files. A program's bundle holds what it wrote, and a manifest (replay_mode `none`, no replay digest).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar

from trainingrun_runtime import contract
from trainingrun_runtime.digest import sha256_hex
from trainingrun_runtime.errors import AttemptEnded, CheckpointCorrupt, Superseded
from trainingrun_runtime.sdk import notice as notices
from trainingrun_runtime.sdk import record, reporting
from trainingrun_runtime.storage import commit, fence, layout, retention, verification

__all__ = [
    "PROBLEM_CHARS",
    "REPLAY_MODE",
    "NoRecordedCheckpointVerifies",
    "NotAttached",
    "Run",
    "attach",
    "parse_attachment",
    "pinned_or_older",
    "rejected_steps",
    "retain",
    "set_aside_orphans",
]

log = logging.getLogger(__name__)

REPLAY_MODE: Final = "none"
"""The manifest's replay_mode of a program's checkpoint: no rollout data plane in it."""
PROBLEM_CHARS: Final = 500
"""A rejected checkpoint's problem, as reported, is cut to this (the CRD bounds the field)."""
_METRIC_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class NotAttached(RuntimeError):
    """The program runs outside a TrainingRun: nothing handed it an attempt."""


def parse_attachment(raw: str | None) -> contract.Attachment:
    """ATTACH_ENV's value as an Attachment; NotAttached naming what is wrong and what to do."""
    if not raw:
        raise NotAttached(
            f"{contract.ATTACH_ENV} is not set: this program is not running as a TrainingRun's driver. Run it through "
            "one: spec.driver.entrypoint, then `trainingrun run FILE` locally or `kubectl apply -f FILE` on a cluster "
            "(docs/sdk.md)"
        )
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise NotAttached(
            f"{contract.ATTACH_ENV} is not JSON ({e}); the operator writes it, do not set it by hand"
        ) from None
    required = set(contract.Attachment.__annotations__)
    if not isinstance(value, dict) or not required <= set(value):
        missing = sorted(required - set(value)) if isinstance(value, dict) else sorted(required)
        raise NotAttached(
            f"{contract.ATTACH_ENV} lacks {missing}: an operator of another version started this program? "
            "Use the runtime image of the operator's version"
        )
    if type(value["attempt"]) is not int or type(value["savePeriod"]) is not int or value["savePeriod"] < 1:
        raise NotAttached(f"{contract.ATTACH_ENV}: attempt and savePeriod must be integers (savePeriod >= 1)")
    layout.run_dir(value["root"], value["run"])  # a single path component, or ValueError naming it
    return value  # type: ignore[return-value]


def attach(environ: Mapping[str, str] | None = None) -> Run:
    """The attempt this program runs as: claims the run directory for it and listens for the head's notice.

    NotAttached outside a TrainingRun (`ATTACH_ENV` unset). A newer attempt that owns the directory already makes
    this one exit at once (`Superseded: ...`, code FAILED): it lives on only because its node lost contact.
    """
    env = os.environ if environ is None else environ
    attachment = parse_attachment(env.get(contract.ATTACH_ENV))
    package = logging.getLogger("trainingrun_runtime")
    if not logging.getLogger().handlers and not package.handlers:  # the program set up no logging: ours to stderr
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        package.addHandler(handler)
        package.setLevel(logging.INFO)
    return Run(attachment)


class Run:
    """One attempt of a TrainingRun (see the module docstring). Not thread-safe: call it from the training loop."""

    def __init__(
        self,
        attachment: contract.Attachment,
        *,
        reporter: reporting.Reporter | None = None,
        progress_period_s: float = reporting.PROGRESS_PERIOD_S,
    ) -> None:
        a = attachment
        self.name: str = a["run"]
        self.namespace: str = a["namespace"]
        self.attempt: int = a["attempt"]
        self.root = Path(a["root"])
        self.run_dir = layout.run_dir(self.root, self.name)
        self.save_period: int = a["savePeriod"]
        self.trainer: dict[str, Any] = dict(a["trainer"])
        """spec.trainer as the user wrote it: the program's own settings."""
        self._a = a
        self._uid = a["runUid"]
        self._config_hash = sha256_hex(self.trainer)
        self._reporter = reporter or reporting.build(
            a["reporter"], root=str(self.root), run=self.name, namespace=self.namespace, attempt=self.attempt
        )
        try:
            fence.claim(self.run_dir, self._uid, self.attempt)
        except Superseded as e:
            _say_and_exit(contract.Prefix.SUPERSEDED, e)
        orphaned = set_aside_orphans(self.root, self.name, a["resume"], a["fallback"], self._reporter)
        self.record = record.AttemptRecord(self.attempt, orphaned=orphaned)
        """What this attempt did, as its reports say it (`sdk.record`: the built-in driver's too)."""
        self._chosen: verification.VerifiedBundle | None = None
        self._chose = False
        self._log_period_s = progress_period_s
        self._logged = -math.inf
        self._notice: notices.Notice | None = None
        self._notice_checked = -math.inf
        self._answered = False
        self._reports = _Reports(self._reporter, self.record.status, progress_period_s)
        notices.listen(self.root, self.name, self.attempt)

    # ------------------------------------------------------------------------------------------- resume

    @property
    def resumed_step(self) -> int | None:
        """The step `resume_dir()` returned (None: a fresh start, or not asked yet)."""
        return self.record.resumed_step

    def resume_dir(self) -> Path | None:
        """The checkpoint to resume from, every checksum verified (read only from it); None for a fresh start.

        When no recorded checkpoint verifies, this reports it and exits RESTORE_FAILED: the operator marks the
        steps bad and the next attempt resumes from an older one.
        """
        if not self._chose:
            self._chosen, skipped = self._choose()
            chosen = None if self._chosen is None else record.resumed_report(self._chosen)
            self.record.resumed(chosen, rejected_steps(skipped))
            self._chose = True
        return None if self._chosen is None else self._chosen.path

    def _choose(self) -> tuple[verification.VerifiedBundle | None, list[tuple[Path, str]]]:
        pinned = self._a["resume"]
        try:
            if pinned is None:
                found = verification.discover(self.root, self.name)
                if found.chosen is None and found.candidates:
                    why = "; ".join(f"{p.name}: {problem}" for p, problem in found.skipped)
                    self._restore_failed(f"{self.run_dir}: no checkpoint verifies ({why})", found.skipped)
                return found.chosen, found.skipped
            hashes = self._a["manifestBlake3"]

            def load(step: int, path: Path) -> verification.VerifiedBundle:
                if not path.is_dir():
                    raise CheckpointCorrupt(f"{path}: the recorded checkpoint does not exist")
                return verification.open_verified(path, run=self.name, manifest_blake3=hashes.get(str(step)))

            try:
                return pinned_or_older(self.run_dir, pinned, self._a["fallback"], load)
            except NoRecordedCheckpointVerifies as e:
                self._restore_failed(str(e), e.rejected)
        except OSError as e:  # the volume, not the step: the next attempt may read it
            self._report_restore_error(f"{contract.Prefix.RESTORE_INTERRUPTED} {e}", [])
            _say_and_exit(contract.Prefix.RESTORE_INTERRUPTED, f"{e} (not the checkpoint's fault: a new attempt may "
                          "succeed)")  # fmt: skip

    def _restore_failed(self, message: str, rejected: Sequence[tuple[Path, str]]) -> NoReturn:
        self._report_restore_error(message, rejected)
        _say_and_exit(contract.Prefix.RESTORE_FAILED, message)

    def _report_restore_error(self, message: str, rejected: Sequence[tuple[Path, str]]) -> None:
        self._reporter.report(record.restore_error(self.attempt, message, rejected_steps(rejected)))

    # ----------------------------------------------------------------------------------------- progress

    def report(self, step: int, **metrics: float) -> None:
        """Step `step` is done, with these figures (`reward` is the REWARD column; the others, at most
        `contract.METRICS_MAX`, go to status.runtime.metrics). Never blocks on the API server."""
        if type(step) is not int or step < 0:
            raise ValueError(f"report(step): a step is an int >= 0, got {step!r}")
        figures: dict[str, float] = {}
        for name, value in metrics.items():
            if not _METRIC_NAME.match(name):
                raise ValueError(f"report(): metric name {name!r} must match {_METRIC_NAME.pattern}")
            number = float(value)
            if math.isfinite(number):  # JSON has no NaN: a diverged loss is left out, not sent broken
                figures[name] = number
        reward = figures.pop("reward", None)
        if len(figures) > contract.METRICS_MAX:
            raise ValueError(f"report(): at most {contract.METRICS_MAX} metrics besides reward, got {len(figures)}")
        self.record.progress(step, reward, figures)
        now = time.monotonic()
        if now - self._logged >= self._log_period_s:  # the log's line of the step (`step N: reward R ...`), as the
            self._logged = now  # built-in driver's, at most one a period
            shown = " ".join(f"{k} {v:.4g}" for k, v in figures.items())
            log.info("step %d:%s %s", step, f" reward {reward:.3f}" if reward is not None else "", shown)
        self._reports.progress()

    # --------------------------------------------------------------------------------------- checkpoint

    @contextlib.contextmanager
    def checkpoint(self, step: int, *, final: bool = False) -> Iterator[Path]:
        """A directory to write step `step` into; on a clean exit it becomes `step_N`, recorded in the status.

        Write anything but `manifest.json` (the commit writes it last) and links. An exception inside discards
        the directory and propagates: nothing half-written is ever recorded. `final`: the run's last step.
        """
        if not self._chose:
            self.resume_dir()  # which steps are this attempt's lineage (retention) depends on it
        started = time.monotonic()
        writer = commit.BundleWriter(self.root, self.name, attempt=self.attempt, run_uid=self._uid, guard=self._fence)
        try:
            pending = writer.begin(step)
        except Superseded as e:
            _say_and_exit(contract.Prefix.SUPERSEDED, e)
        with pending:  # an exception inside, or in the commit, removes the directory
            yield pending.path
            noticed = self.notice is not None
            reason = (
                contract.CheckpointReason.PREEMPTION_NOTICE
                if noticed
                else contract.CheckpointReason.FINAL
                if final
                else contract.CheckpointReason.PERIODIC
            )
            extra: dict[str, Any] = {"reason": reason, "writer": "sdk"}
            if self.record.reward is not None:
                extra["reward"] = self.record.reward
            try:
                path = pending.commit(
                    attempt=self.attempt, config_hash=self._config_hash, replay_digest="", replay_mode=REPLAY_MODE,
                    extra=extra,
                )  # fmt: skip
            except Superseded as e:
                _say_and_exit(contract.Prefix.SUPERSEDED, e)
        assert pending.manifest_blake3 is not None  # set by a commit that returned
        self.record.committed(step, path, manifest_blake3=pending.manifest_blake3, reason=reason)
        self.record.waited_for_save(time.monotonic() - started)  # the program waits for all of it
        self._reports.checkpoint()
        self.record.save_s = time.monotonic() - started
        self._retain(path, noticed)

    def _retain(self, path: Path, noticed: bool) -> None:
        try:
            retain(
                self._reporter, self.root, self.name, self.attempt, self._a["keepLast"], self._a["keepEvery"],
                committed=path, lineage=self.record.lineage,
                fence=self._fence,
            )  # fmt: skip
        except AttemptEnded as e:
            if not noticed:  # else the operator ended it on the head's deletion: this checkpoint answers the notice
                _say_and_exit(contract.Prefix.SUPERSEDED, e)
        except Superseded as e:
            _say_and_exit(contract.Prefix.SUPERSEDED, e)

    def _fence(self, doing: str) -> None:
        fence.check(self.run_dir, self._uid, self.attempt, doing)

    # ------------------------------------------------------------------------------------ notice and end

    @property
    def notice(self) -> notices.Notice | None:
        """The head pod's request to save and stop (its deadline, wall-clock seconds), or None."""
        now = time.monotonic()
        if self._notice is None and now - self._notice_checked >= notices.POLL_S:
            self._notice_checked = now
            found = notices.pending(self.root, self.name, self.attempt)
            if found is not None:
                self._notice = found
                log.warning("the head pod is going (%s): save by %.1f s from now", found.reason,
                            found.deadline - time.time())  # fmt: skip
        return self._notice

    def should_save(self, step: int) -> bool:
        """Whether to checkpoint after step `step`: every savePeriod steps; on a notice, once, if a save (as long
        as this attempt's last one) still ends before its deadline."""
        found = self.notice
        return self.record.save_reason(step, save_period=self.save_period, now=time.time(), notice=found) is not None

    def stop(self) -> NoReturn:
        """After a notice: answer it with this attempt's newest checkpoint, report, exit PREEMPTED (no failure)."""
        self.record.answers_notice()
        mine = (
            self.record.last if self.record.last is not None and self.record.last["attempt"] == self.attempt else None
        )
        self._reports.checkpoint()
        step = None if mine is None else mine["step"]
        why = "no checkpoint of this attempt" if mine is None else f"step {step} is this attempt's newest checkpoint"
        notices.answer(self.root, self.name, self.attempt, notices.Answer(step, why))
        notices.stop_listening(self.root, self.name, self.attempt)
        saved = "nothing" if step is None else f"step {step}"
        _say_and_exit(
            contract.Prefix.PREEMPTED, f"stopped at step {self.record.step} on the head pod's notice; saved {saved}"
        )

    def finish(self, step: int | None = None) -> None:
        """The run is done (at `step`, default the last reported): the final report. Exit 0 after it."""
        if step is not None:
            self.record.step = step
        self._reports.drain()
        try:
            self._reporter.report(self.record.status(finished=True))
        except Exception:
            log.exception("the final status report failed")
        notices.stop_listening(self.root, self.name, self.attempt)
        log.info("run %s finished at step %d", self.name, self.record.step)


def _say_and_exit(prefix: contract.Prefix, detail: object) -> NoReturn:
    """The driver's way to end on a known cause: the last stderr line, then its exit code."""
    print(contract.line(prefix, detail), file=sys.stderr, flush=True)
    raise SystemExit(int(prefix.code))


class NoRecordedCheckpointVerifies(CheckpointCorrupt):
    """The pinned step and every fallback step failed verification; `rejected` says why each one did."""

    def __init__(self, message: str, rejected: list[tuple[Path, str]]) -> None:
        super().__init__(message)
        self.rejected = rejected


T = TypeVar("T")


def pinned_or_older(
    run_dir: Path,
    pinned: int,
    fallback: Sequence[int],
    load: Callable[[int, Path], T],
    refusals: tuple[type[Exception], ...] = (CheckpointCorrupt,),
) -> tuple[T, list[tuple[Path, str]]]:
    """The first of the pinned step and the older `fallback` steps (newest first) that `load` takes, and why each one
    before it was passed over: the one resume rule of the built-in driver and of a program. `load(step, step_dir)`
    verifies the step (and, for the built-in driver, its data plane) and raises one of `refusals` when it fails:
    a refusal passes the step over, any other error propagates. NoRecordedCheckpointVerifies when none passes."""
    rejected: list[tuple[Path, str]] = []
    for step in [pinned, *sorted({s for s in fallback if s < pinned}, reverse=True)]:
        path = run_dir / layout.step_dirname(step)
        try:
            return load(step, path), rejected
        except refusals as e:
            rejected.append((path, str(e)))
    tried = "; ".join(f"{p.name}: {problem}" for p, problem in rejected)
    raise NoRecordedCheckpointVerifies(f"no recorded checkpoint verifies ({tried})", rejected)


def retain(
    reporter: reporting.Reporter,
    root: str | os.PathLike[str],
    run: str,
    attempt: int,
    keep_last: int,
    keep_every: int | None,
    *,
    committed: Path,
    lineage: retention.Lineage,
    fence: Callable[[str], None],
) -> None:
    """Retention after `committed` (a step this attempt just committed and reported), for the built-in driver and a
    program alike: never the step the operator would resume from (read from the status), only this attempt's
    `lineage`, fenced right before anything is deleted.

    An attempt the operator has ended can live on for a while (a pod in its termination grace period trains and
    saves on; a partitioned node): its reports are no longer recorded, so the step the next attempt is pinned to
    falls behind, and plain keep-last retention would delete it. Such an attempt deletes nothing and gets
    AttemptEnded: it should write no more. Nothing is deleted either when the status cannot be read.
    """
    view = reporter.operator_view()
    if view is None:
        log.warning("retention skipped after %s: the operator's view of the run could not be read", committed.name)
        return
    if view.ended(attempt):
        raise AttemptEnded(
            f"the operator ended attempt {attempt} (its current attempt: {view.attempt}); this driver lives on after "
            "its attempt (a pod in its grace period, a partitioned node) and stops writing checkpoints"
        )
    protect = () if view.pinned is None else (view.pinned,)
    fence("apply retention")
    retention.apply_retention(
        root, run, keep_last, keep_every, verified=committed, protect=protect, lineage=lineage, guard=fence
    )


def rejected_steps(skipped: Sequence[tuple[Path, str]]) -> list[contract.BadCheckpointReport]:
    """The step_N checkpoints among `skipped` (not leftovers such as tmp_step_N), as a report lists them."""
    found = []
    for path, problem in skipped:
        step = layout.step_of(path.name)
        if step is not None:
            found.append(contract.BadCheckpointReport(step=step, problem=problem[:PROBLEM_CHARS]))
    return found


def set_aside_orphans(
    root: str | os.PathLike[str], run: str, resume: int | None, fallback: Sequence[int], reporter: reporting.Reporter
) -> list[int]:
    """With a pinned resume step: set aside the steps above it that the status records nowhere (`retention`).

    Nothing is moved when the operator's view cannot be read, or when there is none (a bare driver, no supervisor's
    status): retention's lineage still protects every step.
    """
    if resume is None:
        return []
    view = reporter.operator_view()
    if view is None:
        log.warning("steps above the resume point were not set aside: the operator's view could not be read")
        return []
    if not view.supervised:  # a bare driver: no status says which steps are recorded
        return []
    return retention.set_aside(root, run, above=resume, recorded=view.recorded | set(fallback))


class _Reports:
    """The built-in driver's sender (`reporting.ProgressReports`: checkpoints at once, progress at most once a period,
    in order, each built when it is sent), on an event loop of its own in a daemon thread, for a program's loop that is
    not asyncio's: `progress()` never waits; `checkpoint()` waits until its report is delivered; `drain()` waits for
    the report in flight and sends nothing after it (before the final report)."""

    def __init__(self, reporter: reporting.Reporter, build: Callable[[], contract.RuntimeStatus], period_s: float):
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="trainingrun-reports", daemon=True).start()
        self._sender = reporting.ProgressReports(reporter, build, period_s)

    def progress(self) -> None:
        self._loop.call_soon_threadsafe(self._sender.step_done)

    def checkpoint(self) -> None:
        asyncio.run_coroutine_threadsafe(self._sender.checkpoint(), self._loop).result()

    def drain(self) -> None:
        asyncio.run_coroutine_threadsafe(self._sender.drain(), self._loop).result()
