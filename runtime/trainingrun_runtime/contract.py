"""The driver–operator contract: the one home of what the driver says about an attempt and the operator reads.

The driver (`python -m trainingrun_runtime`) and the operator run in different processes, often in different images
and versions; both import this module for what one says and the other reads. Standard library only, so the operator
imports it without torch or Ray (pyproject.toml's import-linter contracts allow it beside `config` and
`timestamps`). A value here is on the wire: changing one is a protocol change (tests/unit/runtime/test_contract.py
pins them all).

    piece                 written by                                  read by (trainingrun_operator.)
    Exit                  driver.entrypoint: the process's exit code  core.classification: a local driver's code,
                                                                      or "exit code N" in KubeRay's RayJob message
    Prefix, line          driver.entrypoint: the last stderr line     core.classification (`said_after`): a local
                                                                      driver's log tail, or the logs in KubeRay's
                                                                      message
    restoreError          driver.entrypoint: a failed restore's line  core.classification, first rule
    CheckpointReason      driver.controller, driver.checkpoints       core.decision (a PreemptionNotice checkpoint)
    RuntimeStatus         sdk.reporting: status.runtime (a merge   core.model.RuntimeReport (the operator's parsed
      (the report)        patch, REPORT_FIELD), or in local mode the  view; the CRD declares the same fields:
                          file `report_file`                          test_crd), localmode.local, kube.wakeups
    Attachment            the operator: the ATTACH_ENV variable of a  trainingrun_runtime.sdk.attach (a program of
      (ATTACH_ENV)        spec.driver program (core.rayjob, local)    the user's, or the built-in driver)

A failed restore's `status.runtime.restoreError` is its stderr line, but a `RestoreFailed: ` line is reported
without that prefix: a report that starts with no other prefix is a step that failed verification.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final, NotRequired, TypedDict

__all__ = [
    "ATTACH_ENV",
    "METRICS_MAX",
    "PROGRESS_FIELDS",
    "REPORT_FIELD",
    "Attachment",
    "BadCheckpointReport",
    "CheckpointReason",
    "CheckpointReport",
    "Exit",
    "Prefix",
    "Progress",
    "RuntimeStatus",
    "line",
    "report_file",
    "said_after",
]


class Exit(enum.IntEnum):
    """The driver's exit codes, by why the attempt ended (the operator's failure class for each: `classification`)."""

    OK = 0
    """The run finished; its last report says `finished: true`."""
    FAILED = 1
    """Anything else: the error is logged (a traceback), or the line is `Superseded:`."""
    BAD_CONFIG = 2
    """The arguments or --config-json do not parse (`BadConfig:`): retrying cannot help."""
    RESTORE_FAILED = 3
    """The step it resumed from failed verification, or its replay index does not hold together (`RestoreFailed:`)."""
    GENERATION_LOST = 4
    """No generation worker came back within the bound (`GenerationLost:`)."""
    PREEMPTED = 5
    """It saved on the head pod's preemption notice and stopped (`Preempted:`)."""
    CONFIG_MISMATCH = 6
    """The checkpoint's math differs from the config (`ConfigMismatch:`, naming the fields old -> new)."""
    RESTORE_INTERRUPTED = 7
    """The restore failed through no fault of the step: I/O, Ray, a timeout (`RestoreInterrupted:`)."""
    TRAINER_LOST = 8
    """A trainer rank's node left the Ray cluster (a trainer worker group's pod lost): the ranks' state is one, so
    the attempt ends, and the next resumes from the newest checkpoint (`TrainerLost:`)."""


class Prefix(enum.StrEnum):
    """How the driver's last stderr line starts when it ends on a known cause; a space and the detail follow."""

    BAD_CONFIG = "BadConfig:"
    SUPERSEDED = "Superseded:"
    RESTORE_FAILED = "RestoreFailed:"
    GENERATION_LOST = "GenerationLost:"
    PREEMPTED = "Preempted:"
    CONFIG_MISMATCH = "ConfigMismatch:"
    RESTORE_INTERRUPTED = "RestoreInterrupted:"
    TRAINER_LOST = "TrainerLost:"

    @property
    def code(self) -> Exit:
        """The exit code that goes with a line of this prefix."""
        return _CODE_OF[self]


_CODE_OF: Final[Mapping[Prefix, Exit]] = MappingProxyType(
    {
        Prefix.BAD_CONFIG: Exit.BAD_CONFIG,
        Prefix.SUPERSEDED: Exit.FAILED,
        Prefix.RESTORE_FAILED: Exit.RESTORE_FAILED,
        Prefix.GENERATION_LOST: Exit.GENERATION_LOST,
        Prefix.PREEMPTED: Exit.PREEMPTED,
        Prefix.CONFIG_MISMATCH: Exit.CONFIG_MISMATCH,
        Prefix.RESTORE_INTERRUPTED: Exit.RESTORE_INTERRUPTED,
        Prefix.TRAINER_LOST: Exit.TRAINER_LOST,
    }
)


def line(prefix: Prefix, detail: object) -> str:
    """The driver's stderr line: `prefix`, a space, `detail` (on one line, for `said_after` to read whole)."""
    return f"{prefix} {detail}"


def said_after(prefix: Prefix, said: str) -> str:
    """What the last line in `said` that carries `prefix` says after it, stripped ("" if none does). `said` may be
    more than the line: a log's tail, or KubeRay's message, which quotes the logs after words of its own."""
    at = said.rfind(prefix)
    return said[at + len(prefix) :].splitlines()[0].strip() if at >= 0 else ""


class CheckpointReason(enum.StrEnum):
    """Why the driver wrote a checkpoint (`status.runtime.lastCheckpoint.reason`, and the manifest's `reason`)."""

    PERIODIC = "Periodic"
    """Every checkpoint.save_period steps."""
    FINAL = "Final"
    """The run's last step."""
    PREEMPTION_NOTICE = "PreemptionNotice"
    """The head pod was being deleted and its preStop hook asked for it (`sdk.notice`)."""


REPORT_FIELD: Final = "runtime"
"""The field of the TrainingRun's status that the driver writes, whole, and nothing else writes: `status.runtime`."""


def report_file(run_dir: Path, attempt: int) -> Path:
    """Where the file reporter (local mode) writes the attempt's `status.runtime`, for the local supervisor to fold
    into its status: `<run dir>/attempts/<N>/runtime.json`."""
    return run_dir / "attempts" / str(attempt) / "runtime.json"


class CheckpointReport(TypedDict):
    """`status.runtime.lastCheckpoint`: a completed (renamed) checkpoint."""

    step: int
    path: str
    attempt: int
    replayDigest: str
    weightsSha256: str | None
    manifestBlake3: str
    """BLAKE3 of the step's manifest.json: the operator records it and hands it back to the driver that resumes
    from the step, which refuses a manifest that does not hash to it."""
    time: str
    reason: NotRequired[str]
    """A `CheckpointReason` (absent from drivers before reasons were reported)."""


class BadCheckpointReport(TypedDict):
    """A checkpoint this attempt would have resumed from but that failed verification (`status.runtime.badCheckpoints`,
    which the operator adds to `status.checkpoints.bad`)."""

    step: int
    problem: str
    """What failed, naming the file and the mismatch (the CheckpointCorrupt message)."""


class Progress(TypedDict):
    """The fields of `status.runtime` that a progress report moves (about once a second, after each step); the
    others change only with a checkpoint, a restore or the end of the attempt."""

    step: int
    """The newest step the attempt finished."""
    reward: float | None
    updated: str
    """When the report was built, by the driver's clock (`timestamps`)."""
    metrics: NotRequired[dict[str, float]]
    """A program's other figures at that step (`sdk.Run.report(step, loss=...)`): at most METRICS_MAX, each named
    like a Prometheus label value of at most 64 characters; absent from the built-in driver's reports."""


METRICS_MAX: Final = 16
"""The most metrics one report carries (the CRD's maxProperties of status.runtime.metrics)."""


class RuntimeStatus(Progress):
    """`status.runtime`: the driver's view of the attempt, camelCase as in the CRD, sent whole each time."""

    attempt: int
    """The attempt that reports: the operator records nothing from a report of another attempt (fencing)."""
    lastCheckpoint: CheckpointReport | None
    restoreError: str | None
    """Why the restore failed (see the module docstring), else None."""
    finished: bool
    badCheckpoints: list[BadCheckpointReport]
    """Every report carries the list, empty or not: a merge patch then replaces an earlier attempt's."""
    checkpointSeconds: NotRequired[float]
    """Seconds this attempt's saves have kept training waiting so far (the built-in driver: the policy's copy and the
    barrier's cut; a program: its whole checkpoint block); the operator's goodput counts them."""
    orphanedCheckpoints: NotRequired[list[int]]
    """The steps this attempt set aside as `orphan_step_N` when it claimed the run directory (`retention.set_aside`):
    newer than the step it resumed from, recorded nowhere in the status; the newest `reporting.ORPHANS_LISTED`. The
    controller's reports carry it."""


PROGRESS_FIELDS: Final[frozenset[str]] = frozenset(Progress.__annotations__)
"""The names of the `Progress` fields: what a report that only moves the step changes."""


ATTACH_ENV: Final = "TRAININGRUN_ATTACH"
"""The environment variable that hands a `spec.driver` program its attempt: an `Attachment` as JSON."""


class Attachment(TypedDict):
    """What the operator passes a program it runs as an attempt's driver (`spec.driver.entrypoint`), in ATTACH_ENV:
    the same facts the built-in driver gets as arguments (`python -m trainingrun_runtime --help`)."""

    run: str
    namespace: str
    attempt: int
    runUid: str | None
    """The TrainingRun's uid: with the attempt, the claim on the run directory (`storage.fence`)."""
    root: str
    """The checkpoint root: checkpoints go to `<root>/<run>/step_N/`."""
    resume: int | None
    """The recorded step to resume from (None: the newest that verifies, or a fresh start)."""
    fallback: list[int]
    """Older recorded steps, newest first, resumed from if `resume` fails verification."""
    manifestBlake3: dict[str, str]
    """Step (as a string) -> the BLAKE3 its manifest.json must hash to, for `resume` and `fallback`."""
    reporter: str
    """`kubernetes` (a merge patch of status.runtime, as the head's ServiceAccount) or `file` (local mode)."""
    savePeriod: int
    keepLast: int
    keepEvery: int | None
    trainer: dict[str, object]
    """spec.trainer as the user wrote it (`{}` when absent)."""
