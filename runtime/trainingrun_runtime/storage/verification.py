"""Reading a bundle: verify every checksum before anything reads a file, and find the newest step that verifies.

    verified = open_verified(step_dir, run=run)   # a VerifiedBundle: the only sanctioned way to read a checkpoint
    verified.open("train_dataloader.pt")           # read what was checked: the bytes of this descriptor
    verified.entries("policy")                    # for a reader in another process (`files.open_checked`)
    found = discover(root, run, check=...)        # newest first; a step that fails is skipped with the reason

Standard library only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Final

from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import checksum, files, layout
from trainingrun_runtime.storage.manifest import FileEntry, Manifest

__all__ = ["Discovery", "VerifiedBundle", "discover", "looks_valid", "open_verified", "verify"]

log = logging.getLogger(__name__)

_HASH_WORKERS: Final = max(1, min(8, os.cpu_count() or 1))


def verify(step_dir: str | os.PathLike[str], *, run: str | None = None, manifest_blake3: str | None = None) -> Manifest:
    """Verify a checkpoint and return its manifest; raise CheckpointCorrupt naming the file and the problem.

    With `manifest_blake3` (what the run's status recorded for this step), manifest.json's bytes must hash to it
    first: whoever can write the volume can rewrite a file and its checksum in the manifest, but not the status.

    Checks: manifest.json present, valid JSON, every required key with the right type,
    supported format_version; its step equals N of `step_N` (or `old_step_N`) and its run
    equals `run` (default: the parent directory's name); every listed file present, a
    regular file, of the listed size ("truncated" when shorter) and checksum (BLAKE3, or
    SHA-256 in a format 1 bundle); no file in the bundle that the manifest does not list.
    """
    return _verify(Path(step_dir), run, manifest_blake3)[0]


def _verify(path: Path, run: str | None, manifest_blake3: str | None) -> tuple[Manifest, str]:
    """`verify`, and the BLAKE3 of the manifest bytes that were checked and parsed (read once)."""
    manifest, digest = _read_manifest(path, run, manifest_blake3)
    files.check_listed(path, {rel: e.size for rel, e in manifest.files.items()}, listing="the manifest",
                       unlisted=frozenset({layout.MANIFEST}))  # fmt: skip
    # Each file is read once and hashed as it is read, one thread per file on every core, largest first so the
    # big files (the storage units', the policy's) overlap each other instead of queueing behind small ones.
    # One thread per file: cold reads are bound by the disk, not the hash (measured in `files.hash_file`).
    with concurrent.futures.ThreadPoolExecutor(_HASH_WORKERS, thread_name_prefix="bundle-verify") as pool:
        checks = [
            pool.submit(_check_file, path / rel, want)
            for rel, want in sorted(manifest.files.items(), key=lambda item: (-item[1].size, item[0]))
        ]
        for check in checks:
            check.result()
    return manifest, digest


def _check_file(path: Path, want: FileEntry) -> None:
    files.open_checked(path, want).close()


def looks_valid(step_dir: Path, run: str) -> bool:
    """The cheap check (no checksums): the manifest is valid and the files are exactly the listed ones and sizes."""
    try:
        manifest, _ = _read_manifest(step_dir, run, None)
        files.check_listed(step_dir, {rel: e.size for rel, e in manifest.files.items()}, listing="the manifest",
                           unlisted=frozenset({layout.MANIFEST}))  # fmt: skip
    except (OSError, CheckpointCorrupt):
        return False
    return True


def _read_manifest(path: Path, run: str | None, manifest_blake3: str | None) -> tuple[Manifest, str]:
    """The manifest of `path`, checked against the directory's name (step), `run` (default: the parent's name) and
    `manifest_blake3`, with the BLAKE3 of its bytes: the bytes hashed are the bytes parsed (one read)."""
    where = str(path / layout.MANIFEST)
    if not path.is_dir():
        raise CheckpointCorrupt(f"{path}: not a directory")
    try:
        raw = (path / layout.MANIFEST).read_bytes()
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{where}: missing (the save never completed)") from None
    except OSError as e:
        raise CheckpointCorrupt(f"{where}: unreadable ({e})") from None
    digest = checksum.blake3_of_bytes(raw)
    if manifest_blake3 is not None and digest != manifest_blake3:
        raise CheckpointCorrupt(
            f"{where}: BLAKE3 {digest}, but the run's status recorded {manifest_blake3} for this step: the manifest "
            "was rewritten or replaced after the step was recorded, so none of its checksums can be trusted"
        )
    manifest = Manifest.from_json(raw, where=where)
    step = layout.step_of(path.name)
    if step is None:
        step = layout.old_step_of(path.name)
    if step is None:
        raise CheckpointCorrupt(f"{path}: directory name is not step_N")
    if manifest.step != step:
        raise CheckpointCorrupt(f"{where}: step is {manifest.step} but the directory is {path.name}")
    expected_run = run if run is not None else path.resolve().parent.name
    if manifest.run != expected_run:
        raise CheckpointCorrupt(f"{where}: run is {manifest.run!r}, expected {expected_run!r}")
    return manifest, digest


@dataclasses.dataclass(frozen=True)
class VerifiedBundle:
    """A checkpoint whose every checksum has been verified; the only sanctioned way to read one."""

    path: Path
    manifest: Manifest
    manifest_blake3: str = ""
    """BLAKE3 of the manifest bytes that were verified (what the status records as `manifestBlake3`)."""

    def file(self, relpath: str) -> Path:
        """The path of a listed file; CheckpointCorrupt if the manifest does not list it."""
        if relpath not in self.manifest.files:
            raise CheckpointCorrupt(f"{self.path / relpath}: not in the manifest of this checkpoint")
        return self.path / relpath

    def open(self, relpath: str) -> BinaryIO:
        """A listed file, open at its start, its bytes checked against the manifest through the same descriptor
        that the caller then reads (`files.open_checked`); CheckpointCorrupt if it is unlisted or fails."""
        return files.open_checked(self.file(relpath), self.manifest.files[relpath])

    def entries(self, directory: str) -> dict[str, FileEntry]:
        """The manifest's entries of the files under `directory` (a bundle-relative folder), keyed by their path
        inside it: what a reader in another process checks each file against (`files.open_checked`)."""
        prefix = directory.rstrip("/") + "/"
        return {rel[len(prefix) :]: entry for rel, entry in self.manifest.files.items() if rel.startswith(prefix)}

    @property
    def data_plane(self) -> Path:
        """`data_plane/`, to hand to TransferQueue's loader (CheckpointCorrupt if no file of it is listed)."""
        if not any(rel.startswith(layout.DATA_PLANE + "/") for rel in self.manifest.files):
            raise CheckpointCorrupt(f"{self.path / layout.DATA_PLANE}: missing (the manifest lists no data-plane file)")
        return self.path / layout.DATA_PLANE

    @property
    def replay_metadata(self) -> Path:
        """`replay_buffer_metadata.pt`, the replay index file (CheckpointCorrupt if the manifest does not list it)."""
        return self.file(layout.REPLAY_METADATA)


def open_verified(
    step_dir: str | os.PathLike[str], *, run: str | None = None, manifest_blake3: str | None = None
) -> VerifiedBundle:
    """Verify every checksum of `step_dir` (see `verify`) and return it for reading."""
    path = Path(step_dir)
    manifest, digest = _verify(path, run, manifest_blake3)
    return VerifiedBundle(path=path, manifest=manifest, manifest_blake3=digest)


@dataclasses.dataclass(frozen=True)
class Discovery:
    """What `discover` found: the newest checkpoint that passed, and why each newer candidate was skipped."""

    chosen: VerifiedBundle | None
    skipped: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
    checked: Any = None
    """What `discover`'s `check` returned for the chosen checkpoint (None without a check)."""
    candidates: int = 0
    """How many step directories were tried or could have been (`tmp_`/`del_` ones never count)."""


def discover(
    root: str | os.PathLike[str],
    run: str,
    *,
    check: Callable[[VerifiedBundle], Any] | None = None,
    skip_on: tuple[type[Exception], ...] = (),
) -> Discovery:
    """Find the newest valid `step_N` of a run, verifying candidates newest first and stopping at the first valid one.

    `check`, when given, runs on each candidate whose checksums verified: a candidate it
    rejects with `CheckpointCorrupt` (or one of `skip_on`) is skipped with the reason like a
    corrupt one; what it returns for the chosen checkpoint is `Discovery.checked`. Any other
    exception propagates (a mismatch that older steps would share).
    """
    run_path = layout.run_dir(root, run)
    if not run_path.is_dir():
        return Discovery(chosen=None)
    found, skipped = layout.candidates(run_path)
    refusals: tuple[type[Exception], ...] = (CheckpointCorrupt, *skip_on)
    for _step, path in found:
        try:
            verified = open_verified(path, run=run)
            checked = check(verified) if check is not None else None
        except refusals as e:
            log.warning("skipping checkpoint %s: %s", path, e)
            skipped.append((path, str(e)))
            continue
        return Discovery(chosen=verified, skipped=skipped, checked=checked, candidates=len(found))
    return Discovery(chosen=None, skipped=skipped, candidates=len(found))
