"""The on-disk format of one storage unit's snapshot: a header, then each field's rows as raw bytes.

Written and read inside the storage-unit processes by `tq_storage_fix.CompactStorageUnitData`
(TransferQueue's own save/load calls reach it there). Format 2 replaces format 1, which was a
pickle of `{storage_unit_id, storage_unit_size, field_data, active_keys}` with one compacted column
per field: building that pickle copied every byte twice (torch.stack into a new buffer, then the
in-band pickle buffer) and loading it copied it again. Here nothing is copied on the way out::

    offset 0    MAGIC (8 bytes, b"TRCOLS\\x00\\x02")  header length (8 bytes, little endian)
    16          header: JSON (storage unit id and size, active keys, per field: global indexes,
                dtype and shape (one for the column, or one per row), byte offset and length)
    aligned(64) field data: each field's rows back to back, each row's own bytes, in header order;
                every column starts 64-byte aligned, every row at a multiple of its item size
    ...         rows that are not dense CPU tensors (strings, nested tensors, None): one pickle

`write` hands the rows' own memory to `os.writev` (runs of rows adjacent in memory, as the rows of
one put are, become one iovec) and returns as soon as the bytes are in the page cache; background
threads then start the kernel's writeback and SHA-256-hash the same memory (`PendingWrite`),
so the caller gets the file's digest without reading the file back (the bundle manifest takes it),
and the hash overlaps the disk's writeback instead of lengthening the barrier's window. It does not
fsync: the bundle commit does, after the window.

`read` reads the data section with `readinto` into one preallocated buffer and hands out each row
as a view into it. A file that does not start with MAGIC (format 1, or not ours) is refused with a
`CheckpointCorrupt` naming the file; nothing is unpickled before the magic and header check out.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import mmap
import os
import pickle
import struct
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import torch

from trainingrun_runtime.errors import CheckpointCorrupt

__all__ = ["FORMAT", "MAGIC", "UnitState", "PendingWrite", "Written", "write", "read", "is_dense_cpu"]

FORMAT: Final = 2
MAGIC: Final = b"TRCOLS\x00\x02"
_PREFIX = struct.Struct("<8sQ")
_ALIGN: Final = 64
_IOV_MAX: Final = min(1024, os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024)
_ZEROS: Final = bytes(_ALIGN)
_HUGE: Final = 4 << 20  # read buffers from this size on ask for transparent huge pages
_DTYPE_NAMES: dict[torch.dtype, str] = {}


@dataclasses.dataclass
class UnitState:
    """What a storage unit's snapshot holds (the state layout of TransferQueue 0.1.11's StorageUnitData)."""

    storage_unit_id: str
    storage_unit_size: int | None
    field_data: dict[str, dict[int, Any]]
    active_keys: set[int]
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds per phase of the `read` that produced this state (profiling; empty when written)."""


@dataclasses.dataclass(frozen=True)
class Written:
    """The file `write` produced: its size and the SHA-256 of its bytes (computed from memory)."""

    size: int
    sha256: str
    timings: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Seconds per phase: plan (inspect rows), write (syscalls), hash (after the write, from memory)."""


def is_dense_cpu(value: object) -> bool:
    """A plain strided CPU tensor (written as raw bytes); anything else is pickled."""
    # `is_cpu` rather than `device.type`: the latter builds a device object per call (slow per row).
    return type(value) is torch.Tensor and value.layout == torch.strided and value.is_cpu and not value.is_quantized


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype).removeprefix("torch.")
        _DTYPE_NAMES[dtype] = name
    return name


def _dtype(name: object, where: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise CheckpointCorrupt(f"{where}: unknown dtype {name!r} in the header")
    return dtype


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


class _Layout:
    """The file being planned: byte ranges of memory in file order, and the running offset."""

    def __init__(self) -> None:
        self.chunks: list[memoryview | bytes] = []
        self.offset = 0  # relative to the start of the data section
        self._run_ptr = 0
        self._run_len = 0

    def pad(self, to: int) -> None:
        gap = _align(self.offset, to) - self.offset
        if gap:
            self._flush()
            self.chunks.append(_ZEROS[:gap])
            self.offset += gap

    def add(self, ptr: int, nbytes: int) -> None:
        if not nbytes:
            return
        if self._run_len and ptr == self._run_ptr + self._run_len:
            self._run_len += nbytes  # adjacent in memory: extend the current iovec
        else:
            self._flush()
            self._run_ptr, self._run_len = ptr, nbytes
        self.offset += nbytes

    def add_bytes(self, data: bytes) -> None:
        self._flush()
        if data:
            self.chunks.append(data)
            self.offset += len(data)

    def _flush(self) -> None:
        if self._run_len:
            self.chunks.append(memoryview((ctypes.c_char * self._run_len).from_address(self._run_ptr)).cast("B"))
            self._run_len = 0

    def done(self) -> list[memoryview | bytes]:
        self._flush()
        return self.chunks


def _plan_column(name: str, rows: Mapping[int, Any], layout: _Layout, keep: list[torch.Tensor]
                 ) -> tuple[dict[str, Any], dict[int, Any]]:  # fmt: skip
    """Lay out one field's dense rows; returns its header entry and the rows to pickle instead."""
    indexes: list[int] = []
    tensors: list[torch.Tensor] = []
    others: dict[int, Any] = {}
    for gi, value in rows.items():
        if is_dense_cpu(value):
            if not value.is_contiguous():
                value = value.contiguous()
            keep.append(value)  # the memory written and hashed stays alive until the digest is done
            indexes.append(gi)
            tensors.append(value)
        else:
            others[gi] = value
    layout.pad(_ALIGN)
    start = layout.offset
    entry: dict[str, Any] = {"name": name, "indexes": indexes, "offset": start}
    if tensors:
        first = tensors[0]
        dtype, shape = first.dtype, first.shape
        uniform = all(t.dtype == dtype and t.shape == shape for t in tensors)
        if uniform:
            entry["dtype"], entry["shape"] = _dtype_name(dtype), list(shape)
            for t in tensors:
                layout.add(t.data_ptr(), t.nbytes)
        else:
            entry["dtype"] = [_dtype_name(t.dtype) for t in tensors]
            entry["shape"] = [list(t.shape) for t in tensors]
            offsets = []
            for t in tensors:
                layout.pad(t.element_size())
                offsets.append(layout.offset - start)
                layout.add(t.data_ptr(), t.nbytes)
            entry["row_offsets"] = offsets
    entry["nbytes"] = layout.offset - start
    return entry, others


def write(path: str | os.PathLike[str], state: UnitState) -> PendingWrite:
    """Write `state` to a new file at `path` from the rows' own memory; the SHA-256 follows (`PendingWrite`).

    Returns once the bytes are written (not fsynced). The digest is computed from the same memory by
    a thread started then, so it overlaps the disk's writeback and whatever the caller does next;
    the rows written are kept alive until it is done. Mutating a row in place before
    `PendingWrite.result()` returns would make the digest disagree with the file: TransferQueue
    never does (a put replaces the row object, a clear drops it).
    """
    started = time.perf_counter()
    layout = _Layout()
    keep: list[torch.Tensor] = []
    columns = []
    others: dict[str, dict[int, Any]] = {}
    for name, rows in state.field_data.items():
        entry, rest = _plan_column(name, rows, layout, keep)
        columns.append(entry)
        if rest:
            others[name] = rest
    pickled = pickle.dumps(others, protocol=5) if others else b""
    others_at = layout.offset
    layout.add_bytes(pickled)
    header = {
        "format": FORMAT,
        "storage_unit_id": state.storage_unit_id,
        "storage_unit_size": state.storage_unit_size,
        "active_keys": sorted(state.active_keys),
        "fields": columns,
        "others": {"offset": others_at, "nbytes": len(pickled)},
        "data_nbytes": layout.offset,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, len(head)) + head
    prefix += bytes(_align(len(prefix), _ALIGN) - len(prefix))
    chunks: list[memoryview | bytes] = [prefix, *layout.done()]
    planned = time.perf_counter()

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _writev_all(fd, chunks)
    finally:
        os.close(fd)
    written = time.perf_counter()
    timings = {"plan": planned - started, "write": written - planned}
    threading.Thread(target=_start_writeback, args=(os.fspath(path),), name="column-file-writeback", daemon=True).start()
    return PendingWrite(len(prefix) + layout.offset, chunks, keep, timings)


class PendingWrite:
    """A file `write` has written; its SHA-256 is being computed from memory in a background thread."""

    def __init__(self, size: int, chunks: list[memoryview | bytes], keep: list[torch.Tensor],
                 timings: dict[str, float]) -> None:  # fmt: skip
        self.size = size
        self.timings = timings
        self._chunks: list[memoryview | bytes] | None = chunks
        self._keep: list[torch.Tensor] | None = keep
        self._digest = hashlib.sha256()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._hash, name="column-file-hash", daemon=True)
        self._thread.start()

    def _hash(self) -> None:
        started = time.perf_counter()
        try:
            assert self._chunks is not None
            _hash_all(self._digest, self._chunks)  # hashlib releases the GIL on large buffers
        except BaseException as e:  # re-raised by result()
            self._error = e
        finally:
            self._chunks = self._keep = None  # the rows may be freed now
            self.timings["hash"] = time.perf_counter() - started

    def result(self, timeout: float | None = None) -> Written:
        """Wait for the digest; the file's size and SHA-256."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"hashing did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return Written(size=self.size, sha256=self._digest.hexdigest(), timings=dict(self.timings))


def _hash_all(digest: Any, chunks: Iterable[memoryview | bytes]) -> None:
    for chunk in chunks:
        digest.update(chunk)


def _writev_all(fd: int, chunks: list[memoryview | bytes]) -> None:
    views = [memoryview(c) for c in chunks]
    i = 0
    while i < len(views):
        batch = views[i : i + _IOV_MAX]
        done = os.writev(fd, batch)
        # Skip what was written; a partial write leaves the rest of one view for the next call.
        for view in batch:
            if done >= len(view):
                done -= len(view)
                i += 1
            else:
                views[i] = view[done:]
                break


def _start_writeback(path: str) -> None:
    """Start the kernel's writeback of a file's dirty pages without waiting for it.

    `POSIX_FADV_DONTNEED` on dirty pages queues their writeback (and drops the pages once clean),
    so the disk works while the digest is computed, and the commit's fsync has little left to wait for.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError:
        pass  # an optimization only: the commit's fsync writes whatever is left


def read(path: str | os.PathLike[str]) -> UnitState:
    """Read a file written by `write`; tensor rows are views into one buffer read straight from the file."""
    where = str(path)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
            raise CheckpointCorrupt(
                f"{where}: not a storage-unit snapshot of format {FORMAT} (a format 1 pickle written by an older "
                "trainingrun, or not ours); restore it with the trainingrun version that wrote it, or resume "
                "from a newer checkpoint"
            )
        _magic, head_len = _PREFIX.unpack(prefix)
        if head_len > size:
            raise CheckpointCorrupt(f"{where}: truncated (header of {head_len} bytes, file of {size})")
        try:
            header = json.loads(f.read(head_len))
            data_start = _align(_PREFIX.size + head_len, _ALIGN)
            data_nbytes = int(header["data_nbytes"])
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointCorrupt(f"{where}: unreadable header ({e})") from None
        if data_start + data_nbytes != size:
            raise CheckpointCorrupt(f"{where}: {size} bytes, the header describes {data_start + data_nbytes}")
        flat = _buffer(data_nbytes)
        f.seek(data_start)
        _readinto_all(f, flat.numpy().data, where)
    read_s = time.perf_counter() - started
    try:
        field_data = {c["name"]: _rows(flat, c, where) for c in header["fields"]}
        others = header["others"]
        if others["nbytes"]:
            at = int(others["offset"])
            extra = pickle.loads(flat.numpy().data[at : at + int(others["nbytes"])])
            for name, rows in extra.items():
                field_data.setdefault(name, {}).update(rows)
        return UnitState(
            storage_unit_id=header["storage_unit_id"],
            storage_unit_size=header["storage_unit_size"],
            field_data=field_data,
            active_keys=set(header["active_keys"]),
            timings={"read": read_s, "rows": time.perf_counter() - started - read_s},
        )
    except CheckpointCorrupt:
        raise
    except (ValueError, KeyError, TypeError, RuntimeError, pickle.UnpicklingError) as e:
        raise CheckpointCorrupt(f"{where}: inconsistent header ({type(e).__name__}: {e})") from None


def _buffer(nbytes: int) -> torch.Tensor:
    """An uninitialized byte tensor for a file's data; backed by transparent huge pages where the kernel allows.

    Faulting in 4 KiB pages one by one cost about as much as the read itself (measured: 100 MiB read
    into fresh memory in ~75 ms with small pages, ~25 ms with huge pages).
    """
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < _HUGE or advice is None:
        return torch.empty(nbytes, dtype=torch.uint8)
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(advice)
    except OSError:
        pass  # THP off: small pages still work
    return torch.frombuffer(region, dtype=torch.uint8)  # the tensor keeps the mapping alive


def _readinto_all(f: Any, view: memoryview, where: str) -> None:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise CheckpointCorrupt(f"{where}: truncated (read {got} of {len(view)} data bytes)")
        got += n


def _rows(flat: torch.Tensor, column: Mapping[str, Any], where: str) -> dict[int, Any]:
    indexes = column["indexes"]
    if not indexes:
        return {}
    start, nbytes = int(column["offset"]), int(column["nbytes"])
    if start < 0 or start + nbytes > flat.numel():
        raise CheckpointCorrupt(f"{where}: field {column['name']!r} lies outside the data section")
    data = flat[start : start + nbytes]
    dtypes, shapes = column["dtype"], column["shape"]
    if isinstance(dtypes, str):
        dtype = _dtype(dtypes, where)
        stacked = data.view(dtype).view(len(indexes), *shapes)
        return dict(zip(indexes, stacked.unbind(0), strict=True))
    rows: dict[int, Any] = {}
    for gi, name, shape, at in zip(indexes, dtypes, shapes, column["row_offsets"], strict=True):
        dtype = _dtype(name, where)
        numel = 1
        for dim in shape:
            numel *= dim
        rows[gi] = data[at : at + numel * dtype.itemsize].view(dtype).view(shape)
    return rows
