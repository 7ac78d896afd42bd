"""Writing a bundle: `tmp_step_N/` filled by its writers, then committed crash-consistently as `step_N/`.

    writer = BundleWriter(root, run)
    pending = writer.begin(step)          # cleans leftovers of crashed saves, makes an empty tmp_step_N/
    ... write files under pending.path (the data plane's snapshot, the index file, policy/, the loader place)
    pending.add_hashed({...})             # files whose writer already hashed them (the storage units)
    step_dir = pending.commit(...)        # or pending.abort()

The commit, with `on_stage(name)` called after each step so crash tests can kill the writer between any two:

    files_synced      every file under tmp_step_N fsynced and hashed (size, blake3); every directory fsynced
    manifest_written  tmp_step_N/manifest.json written, fsynced, tmp dir fsynced
    old_moved         re-save only: an existing step_N renamed to old_step_N, parent fsynced
    renamed           tmp_step_N renamed to step_N
    parent_synced     <root>/<run> fsynced: the checkpoint is now durable
    old_removed       re-save only: old_step_N deleted

A re-save of an existing step N (possible after resuming from an older step) moves the old step_N to
old_step_N before the rename and deletes it after. A crash between the two renames leaves old_step_N and no
step_N: discovery treats old_step_N as step N (it is the previous, complete checkpoint) and the next `begin()`
renames it back (`recover`). Standard library only.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from trainingrun_runtime import timestamps
from trainingrun_runtime.digest import canonical_json
from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import files, layout
from trainingrun_runtime.storage.manifest import FORMAT_VERSION, FileEntry, Manifest, check_entry

__all__ = ["COMMIT_STAGES", "BundleWriter", "PendingBundle", "recover", "sync_and_hash"]

log = logging.getLogger(__name__)

COMMIT_STAGES: Final = ("files_synced", "manifest_written", "old_moved", "renamed", "parent_synced", "old_removed")
_HASH_WORKERS: Final = max(1, min(8, os.cpu_count() or 1))
_SYNC_WORKERS: Final = 4
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
        on_stage: Callable[[str], None] | None = None,
        now: Callable[[], datetime.datetime] = _utc_now,
    ) -> None:
        self.root = Path(root)
        self.run = run
        self.run_dir = layout.run_dir(root, run)
        self._on_stage = on_stage
        self._now = now

    def begin(self, step: int) -> PendingBundle:
        """Clean leftovers of crashed saves and return an empty `tmp_step_N/` to write the bundle into."""
        name = layout.step_dirname(step)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        recover(self.run_dir)
        tmp = self.run_dir / f"{layout.TMP_PREFIX}{step}"
        tmp.mkdir()
        return PendingBundle(self, step, tmp, self.run_dir / name)

    def stage(self, name: str) -> None:
        """Report a commit stage to `on_stage` (the crash tests' hook)."""
        if self._on_stage is not None:
            self._on_stage(name)

    def now(self) -> datetime.datetime:
        """The time a commit records."""
        return self._now()


def recover(run_path: Path) -> list[str]:
    """Bring `<root>/<run>` back to a clean state after crashes; returns what was done (called by begin()).

    Removes every `tmp_step_*` and `del_step_*`, removes `old_step_N` when `step_N`
    exists, and renames `old_step_N` back to `step_N` when it does not.
    """
    actions: list[str] = []
    if not run_path.is_dir():
        return actions
    names = {e.name for e in os.scandir(run_path)}
    for name in sorted(names):
        path = run_path / name
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


class PendingBundle:
    """A save in progress: write files under `.path`, then `commit(...)` (or `abort()`); usable as a context manager."""

    def __init__(self, writer: BundleWriter, step: int, path: Path, final_path: Path) -> None:
        self._writer = writer
        self.step = step
        self.path = path
        self.final_path = final_path
        self._state = "open"
        self._hashed: dict[str, FileEntry] = {}

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
        self._state = "committing"
        w = self._writer
        try:
            canonical_json(dict(extra or {}))  # fail before the expensive part, naming the bad field
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
                extra=dict(extra or {}),
            )
            self._write_manifest(manifest)
            w.stage("manifest_written")
            old = self._swap_in()
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

    def _swap_in(self) -> Path | None:
        """Rename tmp_step_N to step_N, moving an existing step_N aside first; returns where it went (or None)."""
        w = self._writer
        old = w.run_dir / f"{layout.OLD_PREFIX}{self.step}"
        moved = False
        if self.final_path.exists():
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
