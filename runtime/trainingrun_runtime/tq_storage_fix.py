"""The SimpleStorage checkpoint blow-up fix for TransferQueue 0.1.11: compact on save.

The problem. A SimpleStorage unit stores each row as a *view* into the buffer of
the put message it arrived in (`torch.frombuffer` on the ZMQ frame, then one row
per global index). `StorageUnitData.save_checkpoint` pickles those rows one by
one, and pickling a torch view writes its whole underlying storage, so a
checkpoint of rows put N at a time is about N times the raw data (19 MiB of rows
put 256 at a time became 4.9 GB and took 27 s).

The fix, in one place: storage units started through `install()` keep a
`CompactStorageUnitData` whose `save_checkpoint` writes each field as one column,
a single contiguous byte buffer holding only each row's own bytes, plus the
per-row dtype and shape (or one dtype and shape when the column is uniform).
The file stays a pickle with the same top-level layout, so 0.1.11's own
`StorageUnitData.load_checkpoint` reads it unchanged: unpickling calls
`rebuild_column`, which hands back `{global_index: tensor}` with each row a view
into one buffer read straight from the file (one copy, no per-row pickling).
Rows that are not dense CPU tensors (strings, nested tensors, `None`) are
pickled as before.

Who calls it: `dataplane.BootstrapDataPlane.start()` calls `install()` right
before `tq.init`, which makes TransferQueue's SimpleStorage bootstrap create
`CompactSimpleStorageUnit` actors (same names, same config) instead of the stock
ones. The actor class lives in this module, so every storage-unit process
imports it, and with it `rebuild_column` for loading.

What it relies on (checked by `check_version()`, pinned to 0.1.11): the
`StorageUnitData` checkpoint state layout (`storage_unit_id`,
`storage_unit_size`, `field_data`, `active_keys`), the attribute
`SimpleStorageUnit.storage_data`, and the module global
`simple_storage_bootstrap.SimpleStorageUnit`. SSD offload (a different storage
class with its own format) is refused. `tests/integration/test_dataplane.py`
measures the checkpoint against the raw bytes of the live rows, put 256 at a
time, and fails if the fix stops applying.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import ray
import torch
import transfer_queue  # type: ignore[import-untyped]
from transfer_queue.storage import simple_storage  # type: ignore[import-untyped]
from transfer_queue.storage.bootstrap import simple_storage_bootstrap  # type: ignore[import-untyped]

from trainingrun_runtime.errors import DataPlaneError

__all__ = [
    "PINNED_TQ_VERSION",
    "CompactSimpleStorageUnit",
    "CompactStorageUnitData",
    "check_version",
    "install",
    "installed",
    "rebuild_column",
]

log = logging.getLogger(__name__)

PINNED_TQ_VERSION: Final = "0.1.11"
"""The only TransferQueue version whose SimpleStorage internals this fix was written and tested against."""

_DTYPE_NAMES: dict[torch.dtype, str] = {}


def check_version() -> None:
    """Refuse to run on a TransferQueue other than the pinned one, naming both versions."""
    found = getattr(transfer_queue, "__version__", "unknown")
    if found != PINNED_TQ_VERSION:
        raise DataPlaneError(
            f"transferqueue {found} is installed but the SimpleStorage checkpoint fix "
            f"(trainingrun_runtime.tq_storage_fix) relies on {PINNED_TQ_VERSION} internals "
            "(StorageUnitData checkpoint layout, simple_storage_bootstrap.SimpleStorageUnit); "
            "re-check the fix against the new version before changing the pin"
        )
    missing = [
        name
        for owner, name in (
            (simple_storage, "StorageUnitData"),
            (simple_storage, "SimpleStorageUnit"),
            (simple_storage_bootstrap, "SimpleStorageUnit"),
        )
        if not hasattr(owner, name)
    ]
    if missing:
        raise DataPlaneError(f"transferqueue {found} lacks {missing}; the SimpleStorage fix cannot apply")


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype).removeprefix("torch.")
        _DTYPE_NAMES[dtype] = name
    return name


def _is_dense_cpu(value: object) -> bool:
    # `is_cpu` rather than `device.type`: the latter builds a device object per call (slow per row).
    return type(value) is torch.Tensor and value.layout == torch.strided and value.is_cpu and not value.is_quantized


class _Column:
    """One field of one storage unit, pickled as a single contiguous byte buffer."""

    def __init__(self, rows: Mapping[int, Any]) -> None:
        self.rows = rows

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        tensors: dict[int, torch.Tensor] = {}
        others: dict[int, Any] = {}
        for gi, value in self.rows.items():
            if _is_dense_cpu(value):
                tensors[gi] = value
            else:
                others[gi] = value
        values = list(tensors.values())
        if not values:
            return rebuild_column, ((), None, None, None, pickle.PickleBuffer(bytearray()), others)
        indexes = tuple(tensors)
        first = values[0]
        if len({v.dtype for v in values}) == 1:
            try:
                # One C call checks that the shapes agree and copies every row once into a fresh, owned buffer.
                blob = torch.stack(values).reshape(-1).view(torch.uint8)
            except RuntimeError:
                pass  # rows of different shapes: one (dtype, shape) per row below
            else:
                dtype, shape = _dtype_name(first.dtype), tuple(first.shape)
                return rebuild_column, (indexes, dtype, shape, None, _buffer(blob), others)
        dtypes = [_dtype_name(v.dtype) for v in values]
        shapes = [tuple(v.shape) for v in values]
        blob = torch.cat([v.detach().contiguous().reshape(-1).view(torch.uint8) for v in values])
        return rebuild_column, (indexes, dtypes, shapes, None, _buffer(blob), others)


def _buffer(blob: torch.Tensor) -> pickle.PickleBuffer:
    return pickle.PickleBuffer(blob.numpy().data)


def rebuild_column(
    indexes: tuple[int, ...],
    dtypes: str | list[str] | None,
    shapes: tuple[int, ...] | list[tuple[int, ...]] | None,
    _reserved: None,
    buffer: bytearray | bytes,
    others: dict[int, Any],
) -> dict[int, Any]:
    """Unpickle one column written by `CompactStorageUnitData`: `{global_index: row}`.

    Called by pickle inside TransferQueue's own `StorageUnitData.load_checkpoint`.
    Tensor rows are views into the one buffer read from the file.
    """
    rows: dict[int, Any] = {}
    if indexes:
        flat = torch.frombuffer(buffer, dtype=torch.uint8) if len(buffer) else torch.empty(0, dtype=torch.uint8)
        if isinstance(dtypes, str):
            assert shapes is not None and not isinstance(shapes, list)
            dtype = getattr(torch, dtypes)
            stacked = flat.view(dtype).view(len(indexes), *shapes)
            rows.update(zip(indexes, stacked.unbind(0), strict=True))
        else:
            assert isinstance(dtypes, list) and isinstance(shapes, list)
            offset = 0
            for gi, dtype_name, shape in zip(indexes, dtypes, shapes, strict=True):
                dtype = getattr(torch, dtype_name)
                numel = 1
                for dim in shape:
                    numel *= dim
                nbytes = numel * dtype.itemsize
                rows[gi] = flat[offset : offset + nbytes].view(dtype).view(shape)
                offset += nbytes
            if offset != len(flat):
                raise ValueError(f"column buffer holds {len(flat)} bytes but its rows describe {offset}")
    rows.update(others)
    return rows


class CompactStorageUnitData(simple_storage.StorageUnitData):  # type: ignore[misc]
    """`StorageUnitData` whose checkpoint holds each row's own bytes once, written column by column."""

    def save_checkpoint(self, path: str | Path, storage_unit_id: str) -> None:
        """Write the same state layout as 0.1.11, with columns instead of per-row views (not fsynced)."""
        state = {
            "storage_unit_id": storage_unit_id,
            "storage_unit_size": self.storage_size,
            "field_data": {name: _Column(rows) for name, rows in self.field_data.items()},
            "active_keys": self._active_keys,
        }
        with open(path, "wb") as f:
            pickle.dump(state, f, protocol=5)


class CompactSimpleStorageUnit(simple_storage.SimpleStorageUnit.__ray_actor_class__):  # type: ignore[misc]
    """A stock SimpleStorage unit that keeps its rows in a `CompactStorageUnitData`."""

    def __init__(self, config: dict[str, Any]) -> None:
        ssd = config.get("ssd_offload")
        if ssd is not None and ssd.get("enabled", False):
            raise DataPlaneError("SimpleStorage SSD offload is not supported with the checkpoint fix")
        super().__init__(config)
        # No client can reach the unit before its ZMQ address is handed out after __init__ returns,
        # so swapping the store here races with nothing.
        self.storage_data = CompactStorageUnitData(self.storage_unit_size)


_COMPACT_UNIT: Any = None


def install() -> None:
    """Make TransferQueue's SimpleStorage bootstrap start `CompactSimpleStorageUnit`s; call before `tq.init`.

    Idempotent. Affects storage units created afterwards by this process.
    """
    global _COMPACT_UNIT
    check_version()
    if _COMPACT_UNIT is None:
        _COMPACT_UNIT = ray.remote(num_cpus=1)(CompactSimpleStorageUnit)
    if simple_storage_bootstrap.SimpleStorageUnit is not _COMPACT_UNIT:
        simple_storage_bootstrap.SimpleStorageUnit = _COMPACT_UNIT
        log.info("SimpleStorage checkpoint fix installed (transferqueue %s)", PINNED_TQ_VERSION)


def installed() -> bool:
    """Whether storage units started by this process from now on carry the fix."""
    return _COMPACT_UNIT is not None and simple_storage_bootstrap.SimpleStorageUnit is _COMPACT_UNIT
