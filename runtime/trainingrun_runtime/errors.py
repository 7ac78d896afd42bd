"""The runtime's error vocabulary: every failure the driver side can name, each with what to do about it.

Raised by the storage, data-plane, rollout and driver code; the entrypoint maps them to exit codes
(`contract.Exit`: a restore that failed verification, and the index rebuild's `PreflightError` / `DigestError`,
are RESTORE_FAILED, a `ConfigMismatch` CONFIG_MISMATCH, a `RestoreInterrupted` RESTORE_INTERRUPTED,
`GenerationLost` GENERATION_LOST, `TrainerLost` TRAINER_LOST, `Superseded` FAILED naming the owner, anything else
FAILED; see `driver.entrypoint`), which the operator classifies. Imports nothing outside the standard library.
"""

from __future__ import annotations

__all__ = [
    "AttemptEnded",
    "CheckpointCorrupt",
    "ConfigMismatch",
    "DataPlaneError",
    "DigestError",
    "GenerationLost",
    "InvalidSpec",
    "InventoryMismatch",
    "LedgerError",
    "PreflightError",
    "RestoreFailed",
    "RestoreInterrupted",
    "RestoreRefused",
    "RewardFailed",
    "Superseded",
    "TrainerLost",
    "TrainingRunError",
    "UnstorableValue",
]


class TrainingRunError(Exception):
    """Base of every domain error the driver side raises."""


class InvalidSpec(TrainingRunError):
    """The spec names a model, data file, field or reward this run cannot use: fix the field the message names."""


class RewardFailed(TrainingRunError):
    """The user's reward function raised or returned a non-finite number: fix it (the message names the sample)."""


class CheckpointCorrupt(TrainingRunError):
    """A checkpoint on disk is damaged or incomplete (manifest, missing file, checksum): restore an older one."""


class RestoreRefused(TrainingRunError):
    """A restore onto a TransferQueue that was already read or written: restore only onto a fresh one."""


class InventoryMismatch(TrainingRunError):
    """TransferQueue's rows differ from the replay index: this save is abandoned; the next one may succeed."""


class PreflightError(TrainingRunError):
    """A saved replay index does not fit this buffer (partition, group size, duplicates, capacity): restore another."""


class DigestError(TrainingRunError):
    """A value has no canonical JSON form (NaN, a non-JSON type), or a digest does not match: fix the value or data."""


class DataPlaneError(TrainingRunError):
    """TransferQueue failed or was misused at run time: a new attempt with a fresh data plane may succeed."""


class ConfigMismatch(TrainingRunError):
    """The checkpoint was written under other math than the config resuming it: resume with that config or anew."""


class GenerationLost(TrainingRunError):
    """No generation worker came back within the bound: the attempt ends (`Exit.GENERATION_LOST`); the next resumes."""


class TrainerLost(TrainingRunError):
    """A trainer rank's node left the cluster: the attempt ends (`Exit.TRAINER_LOST`); the next resumes."""


class LedgerError(TrainingRunError):
    """A prompt moved in a way the ledger forbids (trained twice, skipped): a bug, or a ledger that does not fit."""


class Superseded(TrainingRunError):
    """A newer attempt owns the run directory: this attempt must stop writing to it (retrying cannot help)."""


class AttemptEnded(Superseded):
    """The operator ended this attempt before the newest checkpoint's retention: write no more (it answers a notice)."""


class RestoreFailed(TrainingRunError):
    """Restoring the chosen checkpoint failed (`Exit.RESTORE_FAILED`); `cause` is the original error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class RestoreInterrupted(TrainingRunError):
    """Restoring failed through no fault of the checkpoint (I/O, Ray, a timeout): retry; the step is not bad."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class UnstorableValue(TrainingRunError):
    """A row holds a value the data-plane checkpoint cannot store exactly: put tensors or plain JSON-like values."""
