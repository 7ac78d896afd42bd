"""The data-plane checkpoint: the barrier cut and the snapshot on save; the full check of a step before restore.

Save (in the controller actor, through its connect-only client), inside a bundle being written::

    saver = DataPlaneCheckpointer(root, run, dataplane=client, buffer=buffer, barrier=barrier)
    pending = saver.begin(step)               # <root>/<run>/tmp_step_N/ (crashed saves cleaned up)
    ...write pending.path / "policy/..."      # outside the window: generation and commits go on
    snap = await pending.snapshot(capture=lambda: {"loader": ..., "sampler": ..., "ledger": ...})
    ...write pending.path / "train_dataloader.pt" from snap.restart
    step_dir = pending.commit(attempt=a, config_hash=h, weights_sha256=w, extra={...})

`snapshot` holds `barrier.checkpoint()` (ONE exclusive window) for exactly: the index
(`buffer.metadata_state_dict()`), `capture()` (the caller's other restart-facing reads; synchronous, JSON
values), the inventory check (the ids TransferQueue stores must equal the index's, else `InventoryMismatch`, the
pending save is discarded and no `step_N` appears), and TransferQueue's own snapshot into
`tmp_step_N/data_plane/` (`snapshot.write`). After the window it writes the replay index file
(`replay_buffer_metadata.pt`, `torch.save` of plain values, read back with `weights_only=True`)::

    {"format": 1, "run": str, "step": int, "replay": <the index's state dict>, "restart": <capture()>}

`commit` waits for the storage units' checksums of their files (`snapshot.PendingSnapshot.digests`), hands them
to the bundle (`add_hashed`), then `storage.commit.PendingBundle.commit` writes the manifest (`replay_digest` =
the index digest, `replay_mode` = "authoritative") last and renames. `on_stage(name)` is called after "begun",
"data_plane_saved", "index_file_written" and then after each of `storage.commit.COMMIT_STAGES` (crash tests kill
the writer there).

Restore (on the driver, before any connect-only client exists; `driver.restore` is the one caller)::

    chosen = select(root, run, config=replay_config, storage_units=n)   # verified, nothing loaded; None: fresh
    token, _ = bootstrap.load_checkpoint(chosen.verified.data_plane,   # TransferQueue, onto a pristine TQ, each
                                         chosen.verified.entries("data_plane"))  # file checked as it is read
    # in the actor, later: buffer.restore(chosen.replay_state, expected_digest=chosen.manifest.replay_digest)

`select` (through `storage.verification.discover` and its `check` hook, so both share one listing of candidates)
picks the newest step whose every check passes *before* anything reaches TransferQueue's loader: manifest and
checksums, the index file (safe load, preflight against the buffer config, digest equal to the manifest's), and
`data_plane/` (its listing, TQ version, unit count, and the digest TQ saved with it). A corrupt step is skipped
with the reason and the previous one is tried; a config mismatch (partition, group size, capacity) is raised
instead, since older steps would not fit either. With `step=` pinned there is no fallback.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import torch

from trainingrun_runtime import digest
from trainingrun_runtime.dataplane import snapshot as data_plane_snapshot
from trainingrun_runtime.dataplane.barrier import DataPlaneCheckpointBarrier
from trainingrun_runtime.dataplane.replay_buffer import TQReplayBuffer, run_blocking
from trainingrun_runtime.dataplane.replay_index import ReplayConfig, ReplayIndex, inventory_difference
from trainingrun_runtime.dataplane.row_client import DataPlaneClient
from trainingrun_runtime.errors import CheckpointCorrupt, DigestError, InventoryMismatch
from trainingrun_runtime.storage import commit, layout, manifest, verification

__all__ = [
    "INDEX_FILE_FORMAT",
    "REPLAY_MODE",
    "SAVE_STAGES",
    "DataPlaneCheckpointer",
    "PendingCheckpoint",
    "Selection",
    "Snapshot",
    "read_index_file",
    "select",
]

log = logging.getLogger(__name__)

REPLAY_MODE: Final = "authoritative"
"""The data plane is restored exactly (not regenerated): TQ's rows are the truth the index is checked against."""
INDEX_FILE_FORMAT: Final = 1
"""The layout of the replay index file (`replay_buffer_metadata.pt`) this version writes and reads."""
SAVE_STAGES: Final = ("begun", "data_plane_saved", "index_file_written", *commit.COMMIT_STAGES)
"""Every point of a save where `on_stage` is called, in order."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What the exclusive window captured and how long it took (seconds)."""

    step: int
    replay_digest: str
    groups: int
    rows: int
    restart: Mapping[str, Any]
    """What `capture()` returned, read in the same window as the index."""
    exclusive_s: float
    """The barrier's exclusive window (index, capture, inventory check, TQ snapshot)."""
    snapshot_s: float
    """TransferQueue's own snapshot call alone."""
    check_s: float
    """Inside the window before the snapshot: capturing the index and `capture()`, the inventory check."""
    hold_s: float
    """From asking for the window to leaving it (waiting for active mutations included)."""


class PendingCheckpoint:
    """A save in progress in `tmp_step_N/`: `snapshot()` once, then `commit()`; `abort()` discards it."""

    def __init__(self, saver: DataPlaneCheckpointer, pending: commit.PendingBundle) -> None:
        self._saver = saver
        self._pending = pending
        self.step = pending.step
        self.path = pending.path
        self.snap: Snapshot | None = None
        self._written: data_plane_snapshot.PendingSnapshot | None = None

    async def snapshot(self, capture: Callable[[], Mapping[str, Any]] | None = None) -> Snapshot:
        """Capture the index (+ `capture()`), check it against TQ and snapshot TQ, all in one exclusive window."""
        if self.snap is not None:
            raise RuntimeError(f"{self.path}: the data plane was already snapshotted")
        s = self._saver
        try:
            requested = time.monotonic()
            async with s.barrier.checkpoint():
                entered = time.monotonic()
                state = s.buffer.metadata_state_dict()
                restart = dict(capture()) if capture is not None else {}
                digest.canonical_json(restart)  # JSON values only; names the bad field
                indexed = s.buffer.index.stored_sample_ids()
                stored = await run_blocking(lambda: s.dataplane.list_sample_ids(s.buffer.partition))
                _check_inventory(indexed, stored, self.step)
                meta = {
                    "run": s.run,
                    "step": self.step,
                    "replay_digest": state["digest"],
                    "groups": len(state["groups"]),
                    "rows": len(indexed),
                }
                started = time.monotonic()
                check_s = started - entered
                written = await run_blocking(lambda: s.dataplane.snapshot(self.path / layout.DATA_PLANE, meta))
                snapshot_s = time.monotonic() - started
            self._written = written
            hold_s = time.monotonic() - requested
            s.stage("data_plane_saved")
            index_file = {
                "format": INDEX_FILE_FORMAT,
                "run": s.run,
                "step": self.step,
                "replay": state,
                "restart": restart,
            }
            torch.save(index_file, self.path / layout.REPLAY_METADATA)
            s.stage("index_file_written")
        except BaseException:
            self.abort()
            raise
        exclusive = s.barrier.stats.last_exclusive_s
        self.snap = Snapshot(
            step=self.step,
            replay_digest=state["digest"],
            groups=len(state["groups"]),
            rows=len(indexed),
            restart=restart,
            exclusive_s=exclusive if exclusive is not None else hold_s,
            snapshot_s=snapshot_s,
            check_s=check_s,
            hold_s=hold_s,
        )
        log.info(
            "data plane snapshot for step %d: %d groups, %d rows, exclusive %.3fs (TQ snapshot %.3fs)",
            self.step, self.snap.groups, self.snap.rows, self.snap.exclusive_s, snapshot_s,
        )  # fmt: skip
        return self.snap

    def commit(
        self,
        *,
        attempt: int,
        config_hash: str,
        weights_sha256: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Path:
        """Fsync and hash every file, write the manifest last, rename to `step_N`; returns its path."""
        if self.snap is None:
            self.abort()
            raise RuntimeError(f"{self.path}: commit() before snapshot(); the pending save was discarded")
        # The storage units hashed their files as they wrote them (after the window): commit won't re-read them.
        written = self._written
        assert written is not None
        try:
            self._pending.add_hashed({
                f"{layout.DATA_PLANE}/{rel}": manifest.FileEntry(size=written.sizes[rel], digest=digest)
                for rel, digest in written.digests().items()
            })  # fmt: skip
        except BaseException:
            self.abort()
            raise
        return self._pending.commit(
            attempt=attempt,
            config_hash=config_hash,
            replay_digest=self.snap.replay_digest,
            replay_mode=REPLAY_MODE,
            weights_sha256=weights_sha256,
            extra=extra,
        )

    def abort(self) -> None:
        """Discard the save: no `step_N` is produced."""
        self._pending.abort()

    @property
    def manifest_blake3(self) -> str | None:
        """BLAKE3 of the committed manifest.json (None before `commit`)."""
        return self._pending.manifest_blake3


class DataPlaneCheckpointer:
    """Writes checkpoints of one run: the data plane, the replay index, and whatever the trainer adds."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        run: str,
        *,
        dataplane: DataPlaneClient,
        buffer: TQReplayBuffer,
        barrier: DataPlaneCheckpointBarrier,
        on_stage: Callable[[str], None] | None = None,
        attempt: int | None = None,
        run_uid: str | None = None,
        guard: Callable[[str], None] | None = None,
    ) -> None:
        self.run = run
        self.dataplane = dataplane
        self.buffer = buffer
        self.barrier = barrier
        self._on_stage = on_stage
        self._writer = commit.BundleWriter(
            root, run, attempt=attempt, run_uid=run_uid, guard=guard, on_stage=on_stage
        )  # the guard (the fence) runs before begin's cleanup and right before the rename

    def stage(self, name: str) -> None:
        """Report a save stage to `on_stage` (crash-test hook)."""
        if self._on_stage is not None:
            self._on_stage(name)

    def begin(self, step: int) -> PendingCheckpoint:
        """Create `tmp_step_N/` (cleaning leftovers of crashed saves) for a new checkpoint."""
        pending = PendingCheckpoint(self, self._writer.begin(step))
        self.stage("begun")
        return pending


def _check_inventory(indexed: set[str], stored: list[str], step: int) -> None:
    difference = inventory_difference(indexed, stored)
    if difference is not None:
        raise InventoryMismatch(
            f"checkpoint of step {step} abandoned: TransferQueue's rows differ from the replay index: {difference}"
        )


# -- restore -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Selection:
    """A checkpoint that passed every check, with its decoded index file; nothing was loaded yet."""

    verified: verification.VerifiedBundle
    replay_state: Mapping[str, Any]
    restart: Mapping[str, Any]
    skipped: list[tuple[Path, str]]

    @property
    def manifest(self) -> manifest.Manifest:
        """The verified manifest."""
        return self.verified.manifest


def read_index_file(opened: verification.VerifiedBundle) -> dict[str, Any]:
    """Load a verified bundle's `replay_buffer_metadata.pt` with `weights_only=True`, from the descriptor its
    checksum was checked through (`VerifiedBundle.open`); CheckpointCorrupt naming the file otherwise."""
    path = opened.replay_metadata
    try:
        with opened.open(layout.REPLAY_METADATA) as f:
            raw = torch.load(f, weights_only=True, map_location="cpu")
    except CheckpointCorrupt:
        raise
    except Exception as e:
        raise CheckpointCorrupt(f"{path}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict) or raw.get("format") != INDEX_FILE_FORMAT or not {"replay", "restart"} <= set(raw):
        raise CheckpointCorrupt(f"{path}: not a replay index file of format {INDEX_FILE_FORMAT}")
    return raw


def _validate(
    candidate: Path, run: str, config: ReplayConfig, storage_units: int | None, manifest_blake3: str | None = None
) -> Selection:
    opened = verification.open_verified(candidate, run=run, manifest_blake3=manifest_blake3)
    return _check_verified(opened, run, config, storage_units)


def _check_verified(
    opened: verification.VerifiedBundle, run: str, config: ReplayConfig, storage_units: int | None
) -> Selection:
    """Every restore check beyond the checksums (which `opened` passed): index file, preflight, data-plane dir."""
    candidate = opened.path
    manifest = opened.manifest
    if manifest.replay_mode != REPLAY_MODE:
        raise CheckpointCorrupt(f"{candidate / layout.MANIFEST}: replay_mode {manifest.replay_mode!r} is unknown")
    index_path = opened.replay_metadata
    index_file = read_index_file(opened)
    if index_file.get("step") != manifest.step or index_file.get("run") != run:
        raise CheckpointCorrupt(f"{index_path}: belongs to {index_file.get('run')!r} step {index_file.get('step')}")
    ReplayIndex.from_state_dict(
        index_file["replay"],
        partition=config.partition,
        group_size=config.group_size,
        capacity=config.capacity,
        expected_digest=manifest.replay_digest,
        where=str(index_path),
    )
    data_plane, entries = opened.data_plane, opened.entries(layout.DATA_PLANE)
    data_plane_snapshot.check_dir(data_plane, storage_units=storage_units, expected=entries)
    tq_meta = data_plane_snapshot.read_user_metadata(data_plane, entries)
    if tq_meta.get("replay_digest") != manifest.replay_digest:
        raise DigestError(
            f"{data_plane}/metadata.json: the data plane was saved with replay digest {tq_meta.get('replay_digest')}, "
            f"the manifest says {manifest.replay_digest}"
        )
    return Selection(verified=opened, replay_state=index_file["replay"], restart=index_file["restart"], skipped=[])


def select(
    root: str | os.PathLike[str],
    run: str,
    *,
    config: ReplayConfig,
    storage_units: int | None = None,
    step: int | None = None,
    manifest_blake3: str | None = None,
) -> Selection | None:
    """The newest checkpoint that passes every restore check (or exactly `step`), without loading anything.

    With `step`, `manifest_blake3` (the run's status's record of it) is what the step's manifest must hash to.

    None when the run has no checkpoint directory at all (leftover `tmp_step_N` only counts as
    nothing). CheckpointCorrupt when checkpoints exist but none is valid, or the pinned one is not.
    """
    run_path = layout.run_dir(root, run)
    if not run_path.is_dir():
        return None
    if step is not None:
        pinned = run_path / layout.step_dirname(step)
        if not pinned.is_dir():
            raise CheckpointCorrupt(f"{pinned}: the pinned checkpoint does not exist")
        return _validate(pinned, run, config, storage_units, manifest_blake3)
    found = verification.discover(
        root, run, check=lambda opened: _check_verified(opened, run, config, storage_units), skip_on=(DigestError,)
    )
    if isinstance(found.checked, Selection):
        return dataclasses.replace(found.checked, skipped=found.skipped)
    if found.candidates:
        reasons = "; ".join(f"{p.name}: {why}" for p, why in found.skipped)
        raise CheckpointCorrupt(f"{run_path}: no valid checkpoint among {found.candidates}: {reasons}")
    return None
