"""The on-disk format of one storage unit's snapshot: a header, then each field's rows as raw bytes.

Written and read inside the storage-unit processes by `storage_unit.CompactStorageUnitData`
(TransferQueue's own save/load calls reach it there). Format 2 replaced format 1, a pickle of the unit's
state with one compacted column per field, which copied every byte twice on save and once more on load;
format 3 replaces format 2's pickled section of other rows with JSON (`row_values`), so reading a file never
unpickles. The layout::

    offset 0    MAGIC (8 bytes, b"TRCOLS\\x00\\x03")  header length (8 bytes, little endian)
    16          header: JSON (storage unit id and size, active keys, per field: global indexes,
                dtype and shape (one for the column, or one per row), byte offset and length)
    aligned(64) field data: each field's rows back to back, each row's own bytes, in header order;
                every column starts 64-byte aligned, every row at a multiple of its item size
    ...         rows that are not dense CPU tensors (strings, None, tags): `row_values` JSON; a value it
                cannot hold fails the save (`UnstorableValue`)

`write` plans the layout from the rows' own memory (runs of rows adjacent in memory, as the rows of
one put are, become one piece), creates the file at its final size and returns a `staging.PendingWrite`,
which writes and hashes the bytes after the barrier's window (see `staging` for the pipeline).

`read` maps the file copy-on-write and hands out each row as a view into the mapping (no copy; see
`read` for what that relies on), made when the row is first read (`RestoredRows`). A file that does
not start with MAGIC (format 1, or not ours) is refused with a `CheckpointCorrupt` naming the file.
A format 2 file is read only if its pickled section is empty (every row a dense tensor, as in the bundles
`tests/fixtures/bundle-format-1` stands for), and refused otherwise, naming the file, the format and the fix:
like the older formats of the snapshot, nothing of it is unpickled.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import mmap
import os
import struct
import time
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Final

import torch

from trainingrun_runtime.dataplane import row_values, staging
from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import files
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = [
    "FORMAT",
    "MAGIC",
    "UNREAD",
    "RestoredRows",
    "UnitState",
    "is_dense_cpu",
    "read",
    "write",
]

FORMAT: Final = 3
MAGIC: Final = b"TRCOLS\x00\x03"
_MAGIC_2: Final = b"TRCOLS\x00\x02"  # format 2: the same layout, its other rows pickled (read only without them)
_PREFIX = struct.Struct("<8sQ")
_ALIGN: Final = 64
_ZEROS: Final = bytes(_ALIGN)
_DTYPE_NAMES: dict[torch.dtype, str] = {}


@dataclasses.dataclass
class UnitState:
    """What a storage unit's snapshot holds (the state layout of TransferQueue 0.1.11's StorageUnitData)."""

    storage_unit_id: str
    storage_unit_size: int | None
    field_data: dict[str, MutableMapping[int, Any]]
    active_keys: set[int]
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds per phase of the `read` that produced this state (profiling; empty when written)."""


def is_dense_cpu(value: object) -> bool:
    """A plain strided CPU tensor (written as raw bytes); anything else goes to `row_values`."""
    # `is_cpu` rather than `device.type`: the latter builds a device object per call (slow per row).
    return (
        type(value) is torch.Tensor
        and value.layout == torch.strided
        and value.is_cpu
        and not value.is_quantized
        and not value.is_nested  # a strided nested tensor reports the strided layout
    )


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
    """Lay out one field's dense rows; returns its header entry and the other rows (for `row_values`).

    Runs in the barrier's window, once per row: it keeps nothing per row that the garbage collector tracks
    (addresses and lengths are ints; dtypes and shapes only once the rows turn out to differ). Kept tuples
    set off the collector's full passes over the unit's whole heap several times per snapshot, which cost more
    than the plan itself.
    """
    indexes: list[int] = []
    ptrs: list[int] = []  # per dense row: its address and its length in bytes
    sizes: list[int] = []
    first: tuple[torch.dtype, torch.Size] | None = None  # the first dense row's dtype and shape
    mixed: list[tuple[torch.dtype, torch.Size]] | None = None  # every row's, once one differs from the first
    others: dict[int, Any] = {}
    restored = rows if isinstance(rows, RestoredRows) else None
    if restored is not None:
        keep.append(restored.column)  # rows restored and never read are written from it, no view made for each
        restored_meta = (restored.column.dtype, restored.column.shape[1:])
    for gi, value in rows.items() if restored is None else restored.raw_items():
        if value is UNREAD and restored is not None:
            ptr, nbytes = restored.span(gi)
            dtype, shape = restored_meta
        elif is_dense_cpu(value):
            if not value.is_contiguous():
                value = value.contiguous()
            keep.append(value)  # the memory written and hashed stays alive until the digest is done
            ptr, nbytes, dtype, shape = value.data_ptr(), value.nbytes, value.dtype, value.shape
        else:
            others[gi] = value
            continue
        indexes.append(gi)
        ptrs.append(ptr)
        sizes.append(nbytes)
        if first is None:
            first = (dtype, shape)
        elif mixed is not None:
            mixed.append((dtype, shape))
        elif dtype != first[0] or shape != first[1]:
            mixed = [first] * (len(ptrs) - 1)
            mixed.append((dtype, shape))
    layout.pad(_ALIGN)
    start = layout.offset
    entry: dict[str, Any] = {"name": name, "indexes": indexes, "offset": start}
    if first is not None and mixed is None:
        entry["dtype"], entry["shape"] = _dtype_name(first[0]), list(first[1])
        for ptr, nbytes in zip(ptrs, sizes, strict=True):
            layout.add(ptr, nbytes)
    elif mixed is not None:
        entry["dtype"] = [_dtype_name(d) for d, _ in mixed]
        entry["shape"] = [list(s) for _, s in mixed]
        offsets = []
        for ptr, nbytes, (d, _) in zip(ptrs, sizes, mixed, strict=True):
            layout.pad(d.itemsize)
            offsets.append(layout.offset - start)
            layout.add(ptr, nbytes)
        entry["row_offsets"] = offsets
    entry["nbytes"] = layout.offset - start
    return entry, others


def write(path: str | os.PathLike[str], state: UnitState) -> staging.PendingWrite:
    """Create `path` for `state` at its final size; the returned `PendingWrite` writes and hashes it (`staging`).

    What runs in the caller (inside the barrier's window): planning the layout, which takes a
    reference to every row written, and creating the file at its final size. Mutating a row in place
    before `result()` returns would make the file disagree with the snapshot: TransferQueue never does
    (a put replaces the row object, a clear drops it), and the references keep cleared rows alive
    until the write is done.
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
    encoded = row_values.encode(others) if others else b""  # UnstorableValue before the file exists
    others_at = layout.offset
    layout.add_bytes(encoded)
    header = {
        "format": FORMAT,
        "storage_unit_id": state.storage_unit_id,
        "storage_unit_size": state.storage_unit_size,
        "active_keys": sorted(state.active_keys),
        "fields": columns,
        "others": {"offset": others_at, "nbytes": len(encoded)},
        "data_nbytes": layout.offset,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, len(head)) + head
    prefix += bytes(_align(len(prefix), _ALIGN) - len(prefix))
    chunks: list[memoryview | bytes] = [prefix, *layout.done()]
    size = len(prefix) + layout.offset
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, size)  # the snapshot lists its files' sizes as soon as the units return
    except BaseException:
        os.close(fd)
        raise
    timings = {"plan": time.perf_counter() - started}
    return staging.PendingWrite(os.fspath(path), fd, size, chunks, keep, timings)


def read(path: str | os.PathLike[str], want: FileEntry | None = None) -> UnitState:
    """Read a file written by `write`; tensor rows are views into a private mapping of the file.

    With `want` (the bundle manifest's entry of the file), the file is read and mapped through the descriptor
    its size and checksum were checked through (`files.open_checked`), so the rows are the checked bytes.

    The file is mapped copy-on-write (`MAP_PRIVATE`), as `torch.load(mmap=True)` and safetensors do,
    not copied into new memory: the rows share the page cache's pages (a restore right after the
    bundle's checksum pass reads nothing from disk again), and a row written in place would get its
    own copy, never touching the file. What this relies on: a committed bundle's files are never
    rewritten in place (the bundle only creates, renames and unlinks them; an unlinked file stays
    readable while mapped). Its cost: the file's disk blocks stay allocated until the last restored
    row is dropped, and on a network filesystem a page re-read after reclaim may fail (SIGBUS).
    A field whose rows share one dtype and shape (every field TransferQueue's puts of tensors
    make) comes back as a `RestoredRows`, which makes a row's view when the row is first read.
    """
    where = str(path)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) if want is None else files.open_checked(path, want) as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size or prefix[:8] not in (MAGIC, _MAGIC_2):
            raise CheckpointCorrupt(
                f"{where}: not a storage-unit snapshot of format {FORMAT} (a format 1 pickle written by an older "
                "trainingrun, or not ours); restore it with the trainingrun version that wrote it, or resume "
                "from a newer checkpoint"
            )
        version = FORMAT if prefix[:8] == MAGIC else 2
        _magic, head_len = _PREFIX.unpack(prefix)
        if head_len > size:
            raise CheckpointCorrupt(f"{where}: truncated (header of {head_len} bytes, file of {size})")
        try:
            header = json.loads(f.read(head_len))
            data_start = _align(_PREFIX.size + head_len, _ALIGN)
            data_nbytes = int(header["data_nbytes"])
            others = header["others"]
            others_at, others_nbytes = int(others["offset"]), int(others["nbytes"])
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointCorrupt(f"{where}: unreadable header ({e})") from None
        if version != FORMAT and others_nbytes:
            raise CheckpointCorrupt(
                f"{where}: a storage-unit snapshot of format {version} whose rows that are not dense tensors "
                f"({others_nbytes} bytes) are a pickle, which this trainingrun never loads (it reads format "
                f"{FORMAT}); restore it with the trainingrun version that wrote it, or resume from a checkpoint "
                "written by this version"
            )
        if data_start + data_nbytes != size:
            raise CheckpointCorrupt(f"{where}: {size} bytes, the header describes {data_start + data_nbytes}")
        flat = _map(f.fileno(), size, data_start, data_nbytes)
    read_s = time.perf_counter() - started
    try:
        positions: dict[tuple[int, ...], dict[int, int]] = {}  # fields of the same rows share one position map
        field_data = {c["name"]: _rows(flat, c, where, positions) for c in header["fields"]}
        if others_nbytes:
            if others_at < 0 or others_at + others_nbytes > flat.numel():
                raise CheckpointCorrupt(f"{where}: the rows section lies outside the data section")
            extra = row_values.decode(flat.numpy().data[others_at : others_at + others_nbytes], where)
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
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointCorrupt(f"{where}: inconsistent header ({type(e).__name__}: {e})") from None


def _map(fd: int, size: int, data_start: int, data_nbytes: int) -> torch.Tensor:
    """The file's data section as a byte tensor over a private (copy-on-write) mapping of the file."""
    if not data_nbytes:
        return torch.empty(0, dtype=torch.uint8)
    region = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        region.madvise(mmap.MADV_WILLNEED)  # read ahead now (a no-op when the checksum pass left it cached)
    except (AttributeError, OSError):
        pass
    # The tensor keeps the mapping alive (and with it the file's pages) as long as any row view lives.
    return torch.frombuffer(region, dtype=torch.uint8, count=data_nbytes, offset=data_start)


def _rows(flat: torch.Tensor, column: Mapping[str, Any], where: str, positions: dict[tuple[int, ...], dict[int, int]]
          ) -> MutableMapping[int, Any]:  # fmt: skip
    indexes = column["indexes"]
    if not indexes:
        return {}
    start, nbytes = int(column["offset"]), int(column["nbytes"])
    if start < 0 or start + nbytes > flat.numel():
        raise CheckpointCorrupt(f"{where}: field {column['name']!r} lies outside the data section")
    data = flat[start : start + nbytes]
    dtypes, shapes = column["dtype"], column["shape"]
    if isinstance(dtypes, str):
        key = tuple(indexes)
        position = positions.get(key)
        if position is None:
            position = positions[key] = dict(zip(indexes, range(len(indexes)), strict=True))
            if len(position) != len(indexes):
                raise CheckpointCorrupt(f"{where}: field {column['name']!r} lists a row twice")
        return RestoredRows(position, data.view(_dtype(dtypes, where)).view(len(indexes), *shapes))
    rows: dict[int, Any] = {}
    for gi, name, shape, at in zip(indexes, dtypes, shapes, column["row_offsets"], strict=True):
        dtype = _dtype(name, where)
        numel = 1
        for dim in shape:
            numel *= dim
        rows[gi] = data[at : at + numel * dtype.itemsize].view(dtype).view(shape)
    return rows


UNREAD: Final = object()
"""What `RestoredRows.raw_items` gives for a row that was restored and has not been read since."""
_ABSENT: Final = object()


class RestoredRows(MutableMapping[int, Any]):
    """One field's restored rows, keyed by global index: each row's view is made the first time it is read.

    A restored column is one tensor `[rows, *shape]` over the mapped file. Making a view per row up
    front would cost the restore a Python object per row; `read` makes none. A row's view is made
    when TransferQueue first reads it and then kept, so reading a row twice gives the same tensor,
    as a plain dict would. Puts, overwrites and clears
    (`[gi] = row`, `pop`) make no view. Order, length and membership are a dict's: one entry per row,
    in the file's order, later puts after them. `column_file.write` writes rows never read straight
    from the column (`raw_items`), so a save right after a restore makes no views either. Not locked,
    like the dict it replaces: TransferQueue 0.1.11 serves a unit's gets, puts and clears (and its
    checkpoint calls) on one worker thread.
    """

    __slots__ = ("_base", "_position", "_row_nbytes", "_rows", "column")

    def __init__(self, position: Mapping[int, int], column: torch.Tensor) -> None:
        """`position`: each row's global index -> its row in `column` (read only, may be shared by fields)."""
        if len(position) != len(column):
            raise ValueError(f"{len(position)} row positions for a column of {len(column)} rows")
        self._rows: dict[int, Any] = dict.fromkeys(position, UNREAD)
        self._position = position
        self.column = column
        """The restored rows, stacked in file order."""
        self._base = column.data_ptr()
        self._row_nbytes = math.prod(column.shape[1:]) * column.element_size()

    def __getitem__(self, gi: int) -> Any:
        row = self._rows[gi]
        if row is UNREAD:
            row = self._rows[gi] = self.column[self._position[gi]]
        return row

    def __setitem__(self, gi: int, row: Any) -> None:
        self._rows[gi] = row

    def __delitem__(self, gi: int) -> None:
        del self._rows[gi]

    def __contains__(self, gi: object) -> bool:
        return gi in self._rows

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def pop(self, gi: int, *default: Any) -> Any:
        """Remove `gi` and return its row (or `default`); a row never read gets its view made only here."""
        row = self._rows.pop(gi, _ABSENT)
        if row is _ABSENT:
            if default:
                return default[0]
            raise KeyError(gi)
        return self.column[self._position[gi]] if row is UNREAD else row

    def raw_items(self) -> Iterator[tuple[int, Any]]:
        """(global index, row) in order, with `UNREAD` for a restored row not read since (no view made)."""
        return iter(self._rows.items())

    def span(self, gi: int) -> tuple[int, int]:
        """Address and length of the bytes restored for `gi` (inside `column`)."""
        return self._base + self._position[gi] * self._row_nbytes, self._row_nbytes
