"""Writing a bundle: `tmp_step_N/` filled by its writers, then committed crash-consistently as `step_N/`.

    writer = BundleWriter(root, run, attempt=A, guard=fence_check)
    pending = writer.begin(step)          # guard; cleans leftovers of crashed saves, makes tmp_step_N.attempt_A/
    ... write files under pending.path (the data plane's snapshot, the index file, policy/, the loader place)
    pending.add_hashed({...})             # files whose writer already hashed them (the storage units)
    step_dir = pending.commit(...)        # or pending.abort()

The commit, with `on_stage(name)` called after each step so crash tests can kill the writer between any two:

    files_synced      every file under tmp_step_N fsynced and hashed (size, blake3); every directory fsynced
    manifest_written  tmp_step_N/manifest.json written, fsynced, tmp dir fsynced
                      guard, again: the fence holds right up to the swap, not only at the save's start
    old_moved         re-save only: an existing step_N renamed to old_step_N, parent fsynced (never one whose
                      manifest names a newer attempt: Superseded)
    renamed           tmp_step_N renamed to step_N
    parent_synced     <root>/<run> fsynced: the checkpoint is now durable
    old_removed       re-save only: old_step_N deleted

A re-save of an existing step N (possible after resuming from an older step) moves the old step_N to
old_step_N before the rename and deletes it after. A crash between the two renames leaves old_step_N and no
step_N: discovery treats old_step_N as step N (it is the previous, complete checkpoint) and the next `begin()`
renames it back (`recover`).

The `guard` (the driver passes the fence, `storage.fence.check`) runs before `begin()` cleans anything and again
right before the swap: a zombie attempt whose save outlasted the next attempt's claim (hashing and fsyncs can take
minutes) stops there, and its cleanup never touches a newer attempt's `tmp_step_N.attempt_B`. Standard library only.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from trainingrun_runtime import timestamps
from trainingrun_runtime.digest import canonical_json
from trainingrun_runtime.errors import CheckpointCorrupt, Superseded
from trainingrun_runtime.storage import checksum, files, layout
from trainingrun_runtime.storage.manifest import FORMAT_VERSION, FileEntry, Manifest, check_entry

__all__ = ["COMMIT_STAGES", "RUN_UID", "BundleWriter", "PendingBundle", "recover", "sync_and_hash"]

log = logging.getLogger(__name__)

COMMIT_STAGES: Final = ("files_synced", "manifest_written", "old_moved", "renamed", "parent_synced", "old_removed")
_HASH_WORKERS: Final = max(1, min(8, os.cpu_count() or 1))
_SYNC_WORKERS: Final = 4
RUN_UID: Final = "runUid"
"""The key of the writer's run uid in a manifest's `extra`."""
_SPLIT_HASH_BYTES: Final = 16 << 20
"""A file at least this large, when fewer such files than hashing threads are left to hash, is hashed on several
threads (`files.hash_file(threads=...)`): the commit's files were just written, so they are in the page cache."""


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class BundleWriter:
    """Writes checkpoints of one run under `<root>/<run>/`; the only writer of that directory."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        run: str,
        *,
        attempt: int | None = None,
        run_uid: str | None = None,
        guard: Callable[[str], None] | None = None,
        on_stage: Callable[[str], None] | None = None,
        now: Callable[[], datetime.datetime] = _utc_now,
    ) -> None:
        self.root = Path(root)
        self.run = run
        self.run_dir = layout.run_dir(root, run)
        self.attempt = attempt
        """The attempt that writes (None: a writer that names none, such as a tool; its saves are `tmp_step_N`)."""
        self.run_uid = run_uid
        """The run's uid, recorded in each manifest's `extra` (`runUid`): a newer attempt's step is never replaced."""
        self._guard = guard
        self._on_stage = on_stage
        self._now = now

    def begin(self, step: int) -> PendingBundle:
        """Guard, clean leftovers of crashed saves, and return an empty `tmp_step_N.attempt_A/` to write into."""
        name = layout.step_dirname(step)
        tmp = self.run_dir / layout.tmp_dirname(step, self.attempt)
        self.guard(f"clean up and begin {tmp.name}")  # recover() removes leftovers: never after a newer claim
        self.run_dir.mkdir(parents=True, exist_ok=True)
        recover(self.run_dir, attempt=self.attempt)
        tmp.mkdir()
        return PendingBundle(self, step, tmp, self.run_dir / name)

    def guard(self, doing: str) -> None:
        """Run the guard (the fence): raises (Superseded) when this writer may no longer do `doing`."""
        if self._guard is not None:
            self._guard(doing)

    def stage(self, name: str) -> None:
        """Report a commit stage to `on_stage` (the crash tests' hook)."""
        if self._on_stage is not None:
            self._on_stage(name)

    def now(self) -> datetime.datetime:
        """The time a commit records."""
        return self._now()


def recover(run_path: Path, *, attempt: int | None = None) -> list[str]:
    """Bring `<root>/<run>` back to a clean state after crashes; returns what was done (called by begin()).

    Removes `tmp_step_*` (but a `tmp_step_N.attempt_B` of an attempt B newer than `attempt`: that attempt's
    save in progress) and every `del_step_*`, removes `old_step_N` when `step_N` exists, and renames
    `old_step_N` back to `step_N` when it does not.
    """
    actions: list[str] = []
    if not run_path.is_dir():
        return actions
    names = {e.name for e in os.scandir(run_path)}
    for name in sorted(names):
        path = run_path / name
        if name.startswith(layout.TMP_PREFIX) and _newer(layout.tmp_attempt_of(name), attempt):
            log.warning("checkpoint dir %s: %s is a newer attempt's save in progress, left alone", run_path, name)
            continue
        if name.startswith((layout.TMP_PREFIX, layout.DEL_PREFIX)) and path.is_dir() and not path.is_symlink():
            files.remove_tree(path)
            actions.append(f"removed {name}")
            continue
        step = layout.old_step_of(name)
        if step is None:
            continue
        if f"{layout.STEP_PREFIX}{step}" in names:
            files.remove_tree(path)
            actions.append(f"removed {name} (step_{step} exists)")
        else:
            os.rename(path, run_path / f"{layout.STEP_PREFIX}{step}")
            actions.append(f"renamed {name} back to step_{step} (a re-save was interrupted)")
    if actions:
        files.fsync_dir(run_path)
        for a in actions:
            log.info("checkpoint dir %s: %s", run_path, a)
    return actions


def _newer(theirs: int | None, mine: int | None) -> bool:
    """Whether attempt `theirs` is newer than `mine` (an unnamed attempt is never newer; a writer naming none
    treats every named one as newer)."""
    if theirs is None:
        return False
    return mine is None or theirs > mine


def _writer_of(step_dir: Path) -> tuple[int, str | None] | None:
    """The attempt and run uid that the manifest in `step_dir` names (None: no readable manifest, no checkpoint)."""
    try:
        data = json.loads((step_dir / layout.MANIFEST).read_bytes())
        attempt, uid = data.get("attempt"), (data.get("extra") or {}).get(RUN_UID)
    except (OSError, ValueError, AttributeError):
        return None
    return (attempt, uid if isinstance(uid, str) else None) if type(attempt) is int else None


class PendingBundle:
    """A save in progress: write files under `.path`, then `commit(...)` (or `abort()`); usable as a context manager."""

    def __init__(self, writer: BundleWriter, step: int, path: Path, final_path: Path) -> None:
        self._writer = writer
        self.step = step
        self.path = path
        self.final_path = final_path
        self._state = "open"
        self._hashed: dict[str, FileEntry] = {}
        self.manifest_blake3: str | None = None
        """BLAKE3 of the manifest.json written (set by `commit`): what the run's status records as manifestBlake3."""

    def add_hashed(self, entries: Mapping[str, FileEntry]) -> None:
        """Take the size and BLAKE3 of files whose writer hashed them (relpaths under `.path`).

        `commit` fsyncs them like every file but does not read them back to hash them; it checks
        that each is still of the recorded size.
        """
        for rel, entry in entries.items():
            try:
                self._hashed[rel] = check_entry(rel, entry.to_dict(), str(self.path))
            except CheckpointCorrupt as e:
                raise ValueError(str(e)) from None

    def __enter__(self) -> PendingBundle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and self._state == "open":
            self.abort()

    def abort(self) -> None:
        """Discard the pending save (no step_N is produced); a no-op once committed or aborted."""
        if self._state != "open":
            return
        self._state = "aborted"
        shutil.rmtree(self.path, ignore_errors=True)

    def commit(
        self,
        attempt: int,
        config_hash: str,
        replay_digest: str,
        replay_mode: str,
        weights_sha256: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Path:
        """Fsync and hash every file, write the manifest last, rename to step_N, fsync the parent; return step_N.

        On an exception before the rename the pending save is discarded (no step_N, and an
        existing step_N is left as it was); the exception propagates.
        """
        if self._state != "open":
            raise RuntimeError(f"{self.path}: this pending bundle was already {self._state}")
        w = self._writer
        if w.attempt is not None and attempt != w.attempt:
            raise ValueError(f"{self.path}: begun by attempt {w.attempt}, committed as attempt {attempt}")
        self._state = "committing"
        try:
            extra = dict(extra or {})
            if w.run_uid is not None:
                extra.setdefault(RUN_UID, w.run_uid)
            canonical_json(extra)  # fail before the expensive part, naming the bad field
            entries = sync_and_hash(self.path, self._hashed)
            w.stage("files_synced")
            manifest = Manifest(
                format_version=FORMAT_VERSION,
                run=w.run,
                step=self.step,
                attempt=attempt,
                config_hash=config_hash,
                created=timestamps.rfc3339(w.now()),
                files=entries,
                replay_digest=replay_digest,
                replay_mode=replay_mode,
                weights_sha256=weights_sha256,
                extra=extra,
            )
            self._write_manifest(manifest)
            w.stage("manifest_written")
            w.guard(f"rename {self.path.name} to {self.final_path.name}")  # no await or wait from here to the swap
            old = self._swap_in(attempt)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            self._state = "aborted"
            raise
        self._state = "committed"
        w.stage("renamed")
        files.fsync_dir(w.run_dir)
        w.stage("parent_synced")
        if old is not None:
            files.remove_tree(old)
        w.stage("old_removed")
        total = sum(e.size for e in entries.values())
        log.info("checkpoint committed: %s (%d files, %d bytes)", self.final_path, len(entries), total)
        return self.final_path

    def _write_manifest(self, manifest: Manifest) -> None:
        raw = manifest.to_json()
        try:
            Manifest.from_json(raw)  # never write a manifest that the reader would refuse
        except CheckpointCorrupt as e:
            raise ValueError(f"refusing to write an invalid manifest: {e}") from None
        files.write_synced(self.path / layout.MANIFEST, raw)
        files.fsync_dir(self.path)
        self.manifest_blake3 = checksum.blake3_of_bytes(raw)

    def _swap_in(self, attempt: int) -> Path | None:
        """Rename tmp_step_N to step_N, moving an existing step_N aside first; returns where it went (or None).

        Superseded, and nothing moved, when the existing step_N was written by a newer attempt than `attempt`.
        """
        w = self._writer
        old = w.run_dir / f"{layout.OLD_PREFIX}{self.step}"
        moved = False
        if self.final_path.exists():
            theirs = _writer_of(self.final_path)
            if theirs is not None and theirs[0] > attempt and theirs[1] == w.run_uid:
                raise Superseded(
                    f"{self.final_path} was written by attempt {theirs[0]}, newer than attempt {attempt}: not "
                    "replaced; this attempt ended and lives on only because its node lost contact, and stops writing"
                )
            if old.exists():
                files.remove_tree(old)
            os.rename(self.final_path, old)
            moved = True
            files.fsync_dir(w.run_dir)
        w.stage("old_moved")
        try:
            os.rename(self.path, self.final_path)
        except BaseException:
            if moved:
                os.rename(old, self.final_path)
            raise
        return old if moved else None


def sync_and_hash(top: Path, hashed: Mapping[str, FileEntry] | None = None) -> dict[str, FileEntry]:
    """Fsync every file and directory under `top` and hash every file, overlapping fsyncs with hashing.

    Files in `hashed` (hashed by their writer) are fsynced and size-checked but not read back.
    """
    hashed = hashed or {}
    found, dirs, other = files.walk(top)
    if other:
        raise CheckpointCorrupt(
            f"{top / other[0]}: not a regular file or directory (links are not allowed in a bundle)"
        )
    if layout.MANIFEST in found:
        raise CheckpointCorrupt(
            f"{top / layout.MANIFEST}: written by someone else; manifest.json is reserved for the writer"
        )
    # Largest first, so one big file (the policy's) does not start last; split over the spare threads when
    # fewer big files than threads are left (the data plane's big files are in `hashed`: their units hashed them).
    todo = sorted(((top / rel).stat().st_size, rel) for rel in found if rel not in hashed)[::-1]
    big = sum(1 for size, _ in todo if size >= _SPLIT_HASH_BYTES)
    split = max(1, _HASH_WORKERS // big) if big else 1
    # fsync is I/O wait and hashing is CPU (hashlib and blake3 release the GIL): separate pools overlap them.
    with (
        concurrent.futures.ThreadPoolExecutor(_SYNC_WORKERS, thread_name_prefix="bundle-fsync") as sync_pool,
        concurrent.futures.ThreadPoolExecutor(_HASH_WORKERS, thread_name_prefix="bundle-hash") as hash_pool,
    ):
        syncs = [sync_pool.submit(files.fsync_file, top / rel) for rel in found]
        # Directories too, at the same time: what orders them is that all of it is durable before the
        # manifest is written (and one journal commit can then carry many of them at once).
        syncs += [sync_pool.submit(files.fsync_dir, d) for d in dirs]
        hashes = {
            rel: hash_pool.submit(files.hash_file, top / rel, threads=split if size >= _SPLIT_HASH_BYTES else 1)
            for size, rel in todo
        }
        entries = {rel: fut.result() for rel, fut in hashes.items()}
        for fut in syncs:
            fut.result()
    missing = sorted(set(hashed) - set(found))
    if missing:
        raise CheckpointCorrupt(f"{top / missing[0]}: hashed by its writer but no longer present")
    for rel, entry in hashed.items():
        size = (top / rel).stat().st_size
        if size != entry.size:
            raise CheckpointCorrupt(f"{top / rel}: {size} bytes, its writer hashed {entry.size}")
        entries[rel] = entry
    return dict(sorted(entries.items()))
