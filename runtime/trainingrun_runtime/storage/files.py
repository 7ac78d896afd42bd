"""The file operations a bundle is made of: durable writes, fsyncs, hashing, listing, and the listing check.

Every writer of a bundle (the commit, the fence, the data-plane snapshot) and every reader (verification, the
data plane's snapshot check, retention) goes through these, so "durable" and "listed" mean one thing.
Standard library only.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, Final

from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import checksum
from trainingrun_runtime.storage.buffer_pool import BufferPool
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = [
    "CHUNK",
    "check_listed",
    "fsync_dir",
    "fsync_file",
    "hash_file",
    "open_checked",
    "remove_tree",
    "replace_synced",
    "walk",
    "write_synced",
]

CHUNK: Final = 256 << 10
"""Bytes per read when hashing: small enough to stay in the core's cache between the read and the hash."""

_CHUNKS: BufferPool[bytearray] = BufferPool(lambda: bytearray(CHUNK))
"""Read buffers, one per hashing thread, kept for the life of the process (see `buffer_pool`)."""


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (creations, renames, removals) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Make a file's bytes durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Create `path` (it must not exist), write `data` and fsync it; the caller fsyncs the directory."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_synced(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably: a temporary file, fsync, rename over it, fsync the directory.

    A reader sees the old content or the new, never a torn file; the temporary name is unique to this process.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def hash_file(path: str | os.PathLike[str], algorithm: str = checksum.CURRENT, *, threads: int = 1) -> FileEntry:
    """Size and checksum (`algorithm`, default the one this version writes) of a file.

    One thread: read in chunks of `CHUNK` bytes into a reused buffer, hashing each as it arrives (what a
    cold file wants: the disk is the bottleneck, and a read error is an OSError naming the file). `threads`
    > 1 (BLAKE3 only): the file is mapped and hashed on that many threads, for a large file that is already
    in the page cache (just written), where hashing, not the disk, is the bottleneck.
    """
    if threads > 1 and algorithm == "blake3":
        size = os.stat(path).st_size  # the caller checks it against what it listed
        return FileEntry(size=size, digest=checksum.blake3_of_mapped_file(path, threads=threads), algorithm=algorithm)
    with open(path, "rb", buffering=0) as f:
        return _hash_stream(f, algorithm)


def _hash_stream(f: io.RawIOBase, algorithm: str) -> FileEntry:
    h = checksum.new(algorithm)
    size = 0
    with _CHUNKS.lend() as buf, memoryview(buf) as view:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return FileEntry(size=size, digest=h.hexdigest(), algorithm=algorithm)


def open_checked(path: str | os.PathLike[str], want: FileEntry) -> BinaryIO:
    """A bundle's file, open for reading at its start once the bytes read through this same descriptor had
    `want`'s size and checksum; CheckpointCorrupt naming the file otherwise. The caller closes it.

    Whoever reads a checkpoint reads what was checked: the file is opened once, without following a link, and
    the caller reads it from the returned object, never by its path again, so a file renamed over it after the
    check (or a link put in its place) is never what is read. A writer who changes the same file in place after
    the check is not caught (the checkpoint volume's permissions are what keep other writers out).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{path}: missing") from None
    except OSError as e:
        why = "a symbolic link, which a bundle never holds" if e.errno == errno.ELOOP else f"unreadable ({e})"
        raise CheckpointCorrupt(f"{path}: {why}") from None
    raw = io.FileIO(fd, "rb", closefd=True)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointCorrupt(f"{path}: not a regular file")
        try:
            got = _hash_stream(raw, want.algorithm)
        except OSError as e:
            raise CheckpointCorrupt(f"{path}: unreadable ({e})") from None
        if got.size != want.size:
            raise CheckpointCorrupt(f"{path}: {got.size} bytes, the manifest says {want.size}")
        if got.digest != want.digest:
            raise CheckpointCorrupt(
                f"{path}: checksum mismatch ({want.algorithm} {got.digest}, manifest says {want.digest})"
            )
        raw.seek(0)
        return io.BufferedReader(raw)
    except BaseException:
        raw.close()
        raise


def walk(top: Path) -> tuple[list[str], list[Path], list[str]]:
    """(regular files as POSIX relpaths, directories, other entries as relpaths) under `top`, links not followed."""
    files: list[str] = []
    dirs: list[Path] = []
    other: list[str] = []
    stack = [top]
    while stack:
        d = stack.pop()
        dirs.append(d)
        with os.scandir(d) as it:
            for entry in it:
                p = Path(entry.path)
                rel = p.relative_to(top).as_posix()
                if entry.is_dir(follow_symlinks=False):
                    stack.append(p)
                elif entry.is_file(follow_symlinks=False):
                    files.append(rel)
                else:
                    other.append(rel)
    return sorted(files), dirs, sorted(other)


def check_listed(top: Path, listed: Mapping[str, int], *, listing: str, unlisted: frozenset[str] = frozenset()) -> None:
    """The files under `top` are exactly `listed` (relpath -> size); CheckpointCorrupt naming the first that is not.

    A link or other non-regular entry, a file not listed (except the names in `unlisted`: the listing itself), a
    listed file missing, shorter ("truncated") or of another size are each refused, naming the file and `listing`
    (the manifest, the data plane's snapshot listing).
    """
    files, _dirs, other = walk(top)
    if other:
        raise CheckpointCorrupt(f"{top / other[0]}: not a regular file (links are not allowed in a bundle)")
    present = set(files) - unlisted
    for rel in sorted(present | set(listed)):
        path = top / rel
        if rel not in listed:
            raise CheckpointCorrupt(f"{path}: not listed in {listing}")
        if rel not in present:
            raise CheckpointCorrupt(f"{path}: missing (listed in {listing})")
        size, want = path.stat().st_size, listed[rel]
        if size != want:
            what = "truncated" if size < want else "size mismatch"
            raise CheckpointCorrupt(f"{path}: {what} ({size} bytes, {listing} says {want})")


def remove_tree(path: Path) -> None:
    """Delete a directory and everything under it (errors propagate)."""
    shutil.rmtree(path, ignore_errors=False)
