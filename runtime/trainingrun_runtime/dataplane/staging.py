"""The staged write of one storage unit's file: rows copied through reused buffers, hashed there, written O_DIRECT.

    column_file.write (inside the barrier's window)        PendingWrite (a background thread, after the window)
    ─────────────────────────────────────────────────       ──────────────────────────────────────────────────────
    plan the layout from the rows' own memory               copy the pieces into a staging buffer (4 MiB, reused,
    create the file at its final size (ftruncate)  ─────►     page-aligned) ─► BLAKE3 it there ─► queue it
    return PendingWrite                                      writer thread: pwrite at its offset with O_DIRECT
                                                             (the unaligned tail buffered; everything buffered
                                                             where the filesystem refuses O_DIRECT)
                                                             start the kernel's writeback; result() ─► Written

So the barrier's window pays only for the plan; the checksum comes from the bytes as they were written, and the
bundle never reads the file back to hash it. Nothing is fsynced here: the bundle's commit fsyncs every file after
`PendingWrite.result()`. The file never grows past the size the snapshot has already listed. This is the one
description of the pipeline; `column_file` (the format), `storage_unit` (who runs it) and the checkpointer refer
here. Staging buffers come from a process-wide pool (`storage.buffer_pool`): writing from memory that is already
mapped.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os
import queue
import threading
import time
from collections.abc import Mapping
from typing import Final

import torch

from trainingrun_runtime.storage import checksum
from trainingrun_runtime.storage.buffer_pool import BufferPool

__all__ = ["PendingWrite", "Written"]


@dataclasses.dataclass(frozen=True)
class Written:
    """A file a `PendingWrite` finished: its size and the checksum of its bytes (hashed as they were staged)."""

    size: int
    digest: str
    """`checksum.CURRENT` (BLAKE3) of the file's bytes, hex."""
    timings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Seconds per phase: `plan` (in the window), `write` (the background thread, all of it), `hash` (of that)."""


class PendingWrite:
    """A file `column_file.write` has created; a background thread is writing and hashing its bytes."""

    def __init__(self, path: str, fd: int, size: int, chunks: list[memoryview | bytes], keep: list[torch.Tensor],
                 timings: dict[str, float]) -> None:  # fmt: skip
        self.path = path
        self.size = size
        self.timings = timings
        self._digest = checksum.new(checksum.CURRENT)
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(fd, chunks, keep), name="column-file-write", daemon=True
        )
        self._thread.start()

    def _run(self, fd: int, chunks: list[memoryview | bytes], keep: list[torch.Tensor]) -> None:
        started = time.perf_counter()
        try:
            self.timings["hash"] = _stage_out(self.path, fd, self.size, chunks, self._digest)
        except BaseException as e:  # re-raised by result()
            self._error = e
        finally:
            os.close(fd)
            del chunks[:], keep[:]  # the rows may be freed now
            self.timings["write"] = time.perf_counter() - started

    def result(self, timeout: float | None = None) -> Written:
        """Wait for the bytes and the digest; the file's size and checksum."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"{self.path}: writing did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return Written(size=self.size, digest=self._digest.hexdigest(), timings=dict(self.timings))


_STAGE_BYTES: Final = 4 << 20
"""One staging buffer; a multiple of every O_DIRECT alignment (logical block and page size)."""


_STAGE_DEPTH: Final = 3
"""Staging buffers per write: one being filled and hashed, the others queued or being written."""


_DIRECT_ALIGN: Final = 4096


_POOL: BufferPool[mmap.mmap] = BufferPool(
    lambda: mmap.mmap(-1, _STAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
)
"""Page-aligned staging buffers, kept for the life of the process so a snapshot writes from memory that is
already mapped (see `buffer_pool`)."""


def _stage_out(path: str, fd: int, size: int, chunks: list[memoryview | bytes], digest: checksum.Hasher) -> float:
    """Copy `chunks` through staging buffers, hash each, write each at its offset; seconds spent hashing."""
    direct = _DirectFile(path, fd)
    writer = _Writer(direct)
    try:
        stager = _Stager(digest, writer)
        for chunk in chunks:
            stager.copy(memoryview(chunk).cast("B"))
        stager.finish()
    finally:
        writer.stop()
        direct.close()
    writer.raise_failure()
    if stager.offset != size:
        raise OSError(f"{path}: wrote {stager.offset} bytes, planned {size}")
    _start_writeback(fd)  # the buffered tail, if any (or every byte, without O_DIRECT)
    return stager.hashing_s


class _Writer:
    """A thread that writes queued staging buffers at their offsets and gives each back to the pool."""

    def __init__(self, direct: _DirectFile) -> None:
        self._direct = direct
        self._todo: queue.Queue[tuple[mmap.mmap, int, int] | None] = queue.Queue(maxsize=_STAGE_DEPTH - 1)
        self.failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="column-file-writer", daemon=True)
        self._thread.start()

    def put(self, buf: mmap.mmap, n: int, offset: int) -> None:
        """Queue `n` bytes of `buf` for `offset` (blocks while the queue is full)."""
        self._todo.put((buf, n, offset))

    def raise_failure(self) -> None:
        """Re-raise the first write that failed, if any."""
        if self.failed:
            raise self.failed[0]

    def stop(self) -> None:
        """Let the queued writes finish and the thread end."""
        self._todo.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._todo.get()) is not None:
            buf, n, offset = item
            try:
                if not self.failed:
                    self._direct.write(buf, n, offset)
            except BaseException as e:  # reported after the producer stops
                self.failed.append(e)
            finally:
                _POOL.give(buf)


class _Stager:
    """Fills staging buffers from the pieces in order, hashes each full one and hands it to the writer."""

    def __init__(self, digest: checksum.Hasher, writer: _Writer) -> None:
        self._digest = digest
        self._writer = writer
        self.offset = 0
        self.hashing_s = 0.0
        self._buf = _POOL.take()
        self._view = memoryview(self._buf)
        self._filled = 0

    def copy(self, piece: memoryview) -> None:
        """Append `piece` (bytes) to the file being staged."""
        while piece:
            take = min(len(piece), _STAGE_BYTES - self._filled)
            self._view[self._filled : self._filled + take] = piece[:take]
            self._filled += take
            piece = piece[take:]
            if self._filled == _STAGE_BYTES:
                self._ship()
                self._writer.raise_failure()
                self._buf, self._filled = _POOL.take(), 0
                self._view = memoryview(self._buf)

    def finish(self) -> None:
        """Ship the last, partly filled buffer (or give an empty one back)."""
        if self._filled:
            self._ship()
        else:
            self._view.release()
            _POOL.give(self._buf)

    def _ship(self) -> None:
        at = time.perf_counter()
        self._digest.update(self._view[: self._filled])
        self.hashing_s += time.perf_counter() - at
        self._view.release()
        self._writer.put(self._buf, self._filled, self.offset)
        self.offset += self._filled


class _DirectFile:
    """Writes staging buffers at their offsets with O_DIRECT; buffered if the filesystem refuses O_DIRECT."""

    def __init__(self, path: str, fd: int) -> None:
        self._fd = fd
        self._direct = -1
        o_direct = getattr(os, "O_DIRECT", 0)
        if o_direct:
            try:
                self._direct = os.open(path, os.O_WRONLY | o_direct)
            except OSError:
                self._direct = -1  # refused (older tmpfs, some network filesystems): buffered writes

    def write(self, buf: mmap.mmap, n: int, offset: int) -> None:
        direct = n - n % _DIRECT_ALIGN if self._direct >= 0 else 0
        if direct:
            try:
                self._pwrite_all(self._direct, memoryview(buf)[:direct], offset)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                os.close(self._direct)  # alignment refused after all: buffered from here on
                self._direct, direct = -1, 0
        if direct < n:
            # The last chunk's unaligned tail (or everything, buffered): never past the file's final size,
            # which the snapshot has already listed.
            self._pwrite_all(self._fd, memoryview(buf)[direct:n], offset + direct)

    @staticmethod
    def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
        with view:
            while view:
                done = os.pwrite(fd, view, offset)
                view, offset = view[done:], offset + done

    def close(self) -> None:
        if self._direct >= 0:
            os.close(self._direct)
            self._direct = -1


def _start_writeback(fd: int) -> None:
    """Queue the kernel's writeback of a buffered file's dirty pages without waiting, so the commit's fsync finds
    little left to do (`POSIX_FADV_DONTNEED` on dirty pages starts their writeback)."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass  # an optimization only: the commit's fsync writes whatever is left
