"""What one attempt has done, as its reports say it: the one place `status.runtime` is built, for the built-in driver
and a program alike (`sdk.Run`, `driver.controller`, `driver.checkpoints`, `driver.entrypoint`).

    resumed(last, rejected)      the verified step it resumes from (`resumed_report`) becomes lastCheckpoint; the
                                 refused ones badCheckpoints (every report carries them)
    progress(step, reward, ...)  the newest finished step, its reward and a program's other metrics
    save_reason(step, ...)       the save rule: a notice first (once, while a save still fits before its deadline), then
                                 the run's last step, then every savePeriod steps; never a step saved already
    committed(step, path, ...)   a renamed step_N: lastCheckpoint, this attempt's lineage (retention) and save time
    waited_for_save(seconds)     training waited for a save: checkpointSeconds, summed (the operator's goodput)
    answers_notice()             the newest checkpoint of this attempt answers the head's notice (reason
                                 PreemptionNotice), when the notice found it saved or being saved
    status(finished=...)         status.runtime as of now

Pure book-keeping (no I/O, no clock but the caller's): how each driver gets there (a data-plane cut in the
background, or a program's directory) is its own business. Not locked: one writer (the training loop), and a status
built from another thread reads a consistent-enough copy (each field is replaced whole).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from trainingrun_runtime import contract, timestamps
from trainingrun_runtime.sdk import notice as notices
from trainingrun_runtime.sdk import reporting
from trainingrun_runtime.storage import retention, verification

__all__ = ["AttemptRecord", "restore_error", "resumed_report"]


class AttemptRecord:
    """One attempt's reports (see the module docstring)."""

    def __init__(self, attempt: int, *, orphaned: Iterable[int] = ()) -> None:
        self.attempt = attempt
        self.step = 0
        """The newest step this attempt finished (or resumed at)."""
        self.reward: float | None = None
        self.metrics: dict[str, float] = {}
        self.last: contract.CheckpointReport | None = None
        """The newest checkpoint this attempt can resume from: committed by it, or the one it resumed from."""
        self.resumed_step: int | None = None
        self.rejected: tuple[contract.BadCheckpointReport, ...] = ()
        self.orphaned: tuple[int, ...] = tuple(orphaned)[-reporting.ORPHANS_LISTED :]
        self.written: set[int] = set()
        """The steps this attempt committed."""
        self.save_s: float | None = None
        """How long this attempt's latest save took, from its begin to its report (None: none yet)."""
        self.checkpoint_s = 0.0
        """How long this attempt's saves kept training waiting, in all (`waited_for_save`)."""

    # -- what the attempt did ------------------------------------------------------------------------

    def resumed(
        self, last: contract.CheckpointReport | None, rejected: Iterable[contract.BadCheckpointReport] = ()
    ) -> None:
        """The restore's outcome: the step resumed from (`resumed_report`; None: a fresh start), and the recorded
        steps refused before it."""
        self.rejected = tuple(rejected)
        if last is not None:
            self.last, self.resumed_step, self.step = last, last["step"], last["step"]

    def progress(self, step: int, reward: float | None, metrics: Mapping[str, float] | None = None) -> None:
        """Step `step` is done, with these figures."""
        self.step, self.reward = step, reward
        if metrics is not None:
            self.metrics = dict(metrics)

    def committed(
        self,
        step: int,
        path: Path,
        *,
        manifest_blake3: str,
        reason: contract.CheckpointReason,
        replay_digest: str = "",
        weights_sha256: str | None = None,
    ) -> contract.CheckpointReport:
        """Step `step` was renamed to `path` (`storage.commit`): it is lastCheckpoint from now on. The caller sets
        `save_s` once it is reported."""
        self.written.add(step)
        self.step = max(self.step, step)
        self.last = contract.CheckpointReport(
            step=step, path=str(path), attempt=self.attempt, replayDigest=replay_digest, weightsSha256=weights_sha256,
            manifestBlake3=manifest_blake3, time=timestamps.now(), reason=reason,
        )  # fmt: skip
        return self.last

    def waited_for_save(self, seconds: float) -> None:
        """Training waited `seconds` for a save (reported as checkpointSeconds, for the operator's goodput)."""
        self.checkpoint_s += max(0.0, seconds)

    def answers_notice(self) -> bool:
        """This attempt's newest checkpoint answers the head's notice: its reason becomes PreemptionNotice. False when
        this attempt saved none (a resumed step is an older attempt's), or it answers already."""
        notice = contract.CheckpointReason.PREEMPTION_NOTICE
        if self.last is None or self.last["attempt"] != self.attempt or self.last.get("reason") == notice:
            return False
        self.last = {**self.last, "reason": notice}
        return True

    @property
    def lineage(self) -> retention.Lineage:
        """The steps this attempt's retention may count: the one it resumed from and older, and the ones it wrote."""
        return retention.Lineage(resumed_from=self.resumed_step, written=frozenset(self.written))

    # -- the save rule -------------------------------------------------------------------------------

    def save_reason(
        self,
        step: int,
        *,
        save_period: int,
        now: float,
        notice: notices.Notice | None = None,
        last_step: int | None = None,
        step_s: float | None = None,
    ) -> contract.CheckpointReason | None:
        """Whether, and why, to checkpoint after step `step` (None: not now).

        Never a step this attempt saved already. After the head's notice only the notice's save: once (none after a
        checkpoint answers it), and only if it (after a step in flight, `step_s`, as long as the last) still ends
        before the deadline with time to spare (`notice.time_for_a_save`). Else the run's `last_step`, then every
        `save_period` steps.
        """
        if step in self.written or (self.last is not None and self.last["step"] == step):
            return None
        if notice is not None:
            answered = self.last is not None and self.last.get("reason") == contract.CheckpointReason.PREEMPTION_NOTICE
            if answered or not notices.time_for_a_save(now, notice.deadline, self.save_s, step_s):
                return None
            return contract.CheckpointReason.PREEMPTION_NOTICE
        if last_step is not None and step == last_step:
            return contract.CheckpointReason.FINAL
        if step % save_period == 0:
            return contract.CheckpointReason.PERIODIC
        return None

    # -- the report ----------------------------------------------------------------------------------

    def status(self, *, finished: bool = False) -> contract.RuntimeStatus:
        """`status.runtime` as of now."""
        status = contract.RuntimeStatus(
            attempt=self.attempt, step=self.step, reward=self.reward, updated=timestamps.now(),
            lastCheckpoint=self.last, restoreError=None, finished=finished, badCheckpoints=list(self.rejected),
            orphanedCheckpoints=list(self.orphaned),
        )  # fmt: skip
        if self.metrics:
            status["metrics"] = dict(self.metrics)
        if self.checkpoint_s:
            status["checkpointSeconds"] = round(self.checkpoint_s, 3)
        return status


def resumed_report(bundle: verification.VerifiedBundle) -> contract.CheckpointReport:
    """lastCheckpoint of an attempt that resumes from `bundle` (verified): as its manifest records it."""
    m = bundle.manifest
    last = contract.CheckpointReport(
        step=m.step, path=str(bundle.path), attempt=m.attempt, replayDigest=m.replay_digest,
        weightsSha256=m.weights_sha256, manifestBlake3=bundle.manifest_blake3, time=m.created,
    )  # fmt: skip
    if "reason" in m.extra:  # bundles from before reasons were recorded have none
        last["reason"] = str(m.extra["reason"])
    return last


def restore_error(
    attempt: int, message: str, rejected: Iterable[contract.BadCheckpointReport] = ()
) -> contract.RuntimeStatus:
    """`status.runtime` of an attempt whose restore failed: `message` (`contract.Prefix` first, unless it is a
    RestoreFailed) and the steps found bad, which the operator marks and then passes over."""
    return contract.RuntimeStatus(
        attempt=attempt, step=0, reward=None, updated=timestamps.now(), lastCheckpoint=None, restoreError=message,
        finished=False, badCheckpoints=list(rejected),
    )  # fmt: skip
