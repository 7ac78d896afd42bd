"""The runtime's error vocabulary: every failure the driver side can name.

Raised by the pure modules (barrier, digest, bundle) and the data-plane, replay
and checkpoint code built on them; the driver entrypoint maps them to exit codes
(a restore failure is exit code 3) and the operator reads `retryable` to decide
whether another attempt can help. Imports nothing outside the standard library.

Each class carries a class attribute `retryable`: True when running the same
operation again (or another attempt) may succeed without a human changing
anything; False when the same inputs will fail the same way.
"""

from __future__ import annotations

__all__ = [
    "TrainingRunError",
    "CheckpointCorrupt",
    "RestoreRefused",
    "InventoryMismatch",
    "PreflightError",
    "DigestError",
    "DataPlaneError",
    "ConfigMismatch",
]


class TrainingRunError(Exception):
    """Base of every domain error in trainingrun; `retryable` says whether trying again can help."""

    retryable: bool = False


class CheckpointCorrupt(TrainingRunError):
    """A checkpoint on disk is damaged or incomplete (bad manifest, missing file, checksum); retrying the same one is useless."""

    retryable = False


class RestoreRefused(TrainingRunError):
    """A restore was refused because the target is not pristine (already read or written); retrying on the same client is useless."""

    retryable = False


class InventoryMismatch(TrainingRunError):
    """The rows stored in the data plane differ from the replay index; the checkpoint is abandoned, a later save may succeed."""

    retryable = True


class PreflightError(TrainingRunError):
    """A saved index fails a preflight check (partition, group size, duplicates, capacity); retrying with it is useless."""

    retryable = False


class DigestError(TrainingRunError):
    """A value cannot be canonically digested (NaN/Inf or a non-JSON type) or a digest does not match; retrying is useless."""

    retryable = False


class DataPlaneError(TrainingRunError):
    """The data plane (TransferQueue) failed or was misused at run time; a new attempt with a fresh data plane may succeed."""

    retryable = True


class ConfigMismatch(TrainingRunError):
    """A checkpoint was written under a different configuration than the one resuming it; retrying is useless."""

    retryable = False
