"""Storage units whose snapshot is a `column_file`: the fix of TransferQueue 0.1.11's SimpleStorage checkpoint.

The problem. A SimpleStorage unit stores each row as a *view* into the buffer of the put message it arrived in
(`torch.frombuffer` on the ZMQ frame, then one row per global index). `StorageUnitData.save_checkpoint` pickles
those rows one by one, and pickling a torch view writes its whole underlying storage, so a checkpoint of rows put
N at a time is about N times the raw data.

The fix, in one place: storage units started after `install()` keep a `CompactStorageUnitData`, whose
`save_checkpoint` writes a `column_file` (each row's own bytes once): inside the barrier's window the unit only
plans the file and creates it, and the bytes are written and hashed behind it (`staging`). The unit then leaves
`{size, blake3}` beside the file in a digest file (`DIGEST_SUFFIX`) for `snapshot.PendingSnapshot.digests`, so
the bundle never reads the file back to hash it. `load_checkpoint` maps the file and hands out each row as a
view (`column_file.read`); a file in the old pickle format, or of format 2 with pickled rows, is refused, naming
the file; nothing a unit reads is unpickled (its rows that are not dense tensors are JSON: `row_values`).

Who calls it: `lifecycle.BootstrapDataPlane.start()` calls `install()` right before `tq.init`, which makes
TransferQueue's SimpleStorage bootstrap create `CompactSimpleStorageUnit` actors (same names, same config)
instead of the stock ones, and `tq.init` create a `tq_controller.DirectPickleController` (the controller's save
without deep copies). The actor class lives in this module, so every storage-unit process imports it.

What it relies on (checked by `check_version()`, pinned to 0.1.11): the `StorageUnitData` checkpoint state
layout (`storage_unit_id`, `storage_unit_size`, `field_data`, `active_keys`), the attribute
`SimpleStorageUnit.storage_data`, and the module global `simple_storage_bootstrap.SimpleStorageUnit`. SSD
offload (a different storage class with its own format) is refused. `tests/integration/test_dataplane.py`
measures a checkpoint against the raw bytes of the live rows, put 256 at a time, and fails if the fix stops
applying.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainingrun_runtime.dataplane import column_file, staging, tq_controller
from trainingrun_runtime.dataplane.tq_modules import (
    simple_storage,
    simple_storage_bootstrap,
    tq_interface,
    transfer_queue,
)
from trainingrun_runtime.errors import CheckpointCorrupt, DataPlaneError
from trainingrun_runtime.storage import checksum
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = [
    "DIGEST_SUFFIX",
    "PINNED_TQ_VERSION",
    "CompactSimpleStorageUnit",
    "CompactStorageUnitData",
    "check_version",
    "install",
    "is_digest_file",
]

log = logging.getLogger(__name__)

PINNED_TQ_VERSION: Final = "0.1.11"
"""The only TransferQueue version whose SimpleStorage internals this fix was written and tested against."""


def check_version() -> None:
    """Refuse to run on a TransferQueue other than the pinned one, naming both versions."""
    found = getattr(transfer_queue, "__version__", "unknown")
    if found != PINNED_TQ_VERSION:
        raise DataPlaneError(
            f"transferqueue {found} is installed but the SimpleStorage checkpoint fix "
            f"(trainingrun_runtime.dataplane.storage_unit) relies on {PINNED_TQ_VERSION} internals "
            "(StorageUnitData checkpoint layout, simple_storage_bootstrap.SimpleStorageUnit); "
            "re-check the fix against the new version before changing the pin"
        )
    missing = [
        name
        for owner, name in (
            (simple_storage, "StorageUnitData"),
            (simple_storage, "SimpleStorageUnit"),
            (simple_storage_bootstrap, "SimpleStorageUnit"),
            (simple_storage_bootstrap, "get_node_round_robin_scheduling_strategies"),
            (tq_interface, "TransferQueueController"),
        )
        if not hasattr(owner, name)
    ]
    if missing:
        raise DataPlaneError(f"transferqueue {found} lacks {missing}; the SimpleStorage fix cannot apply")


DIGEST_SUFFIX: Final = ".digest"
"""`<unit file><DIGEST_SUFFIX>`: JSON {size, blake3} (or {error}) of a unit file, computed by the unit from memory.

TransferQueue's save reply carries no payload, and the bytes are written and hashed after the reply
(after the barrier's window), so the unit publishes the digest beside the file (written to a temporary
name, then renamed); `snapshot.PendingSnapshot.digests` waits for, reads and deletes these files."""


def is_digest_file(name: str) -> bool:
    """Whether `name` is a unit's digest file (or its temporary), which the snapshot does not list."""
    return name.endswith((DIGEST_SUFFIX, DIGEST_SUFFIX + ".tmp"))


class CompactStorageUnitData(simple_storage.StorageUnitData):  # type: ignore[misc]
    """`StorageUnitData` whose snapshot holds each row's own bytes once (`column_file` format 3)."""

    last_timings: dict[str, float] = {}  # noqa: RUF012 - replaced, never mutated
    """Seconds per phase of this unit's last snapshot write or load (profiling, read through Ray)."""
    expected: Mapping[str, FileEntry] | None = None
    """The manifest's entries of the units' files, by file name, set by the bootstrap client right before a
    restore (`lifecycle.BootstrapDataPlane.load_checkpoint`): `load_checkpoint` reads its file through the
    descriptor it checks against its entry. None: read unchecked (a snapshot outside a bundle)."""

    def save_checkpoint(self, path: str | Path, storage_unit_id: str) -> None:
        """Plan and create the unit's file; its bytes and digest follow in the background (not fsynced).

        A row holding a value `row_values` cannot store exactly fails the save (`UnstorableValue`, no file made)."""
        state = column_file.UnitState(storage_unit_id, self.storage_size, self.field_data, self._active_keys)
        pending = column_file.write(path, state)
        self.last_timings = pending.timings
        threading.Thread(target=_publish_digest, args=(str(path), pending), name="unit-digest", daemon=True).start()

    def load_checkpoint(self, path: str | Path) -> int | None:
        """Replace the unit's rows with a `column_file` snapshot; a file of another format is refused, naming it,
        and so is one that does not match its entry of `expected`."""
        want = None
        if self.expected is not None:
            want = self.expected.get(Path(path).name)
            if want is None:
                raise CheckpointCorrupt(f"{path}: not in the manifest of this checkpoint")
        state = column_file.read(path, want)
        self.last_timings = dict(state.timings)
        self.field_data = state.field_data
        self._active_keys = state.active_keys
        return state.storage_unit_size


def _publish_digest(path: str, pending: staging.PendingWrite) -> None:
    try:
        written = pending.result()
        body = {"size": written.size, checksum.CURRENT: written.digest}
    except Exception as e:  # reported to the waiter, which raises it
        body = {"error": f"{type(e).__name__}: {e}"}
    tmp = f"{path}{DIGEST_SUFFIX}.tmp"
    try:
        Path(tmp).write_text(json.dumps(body))
        os.replace(tmp, f"{path}{DIGEST_SUFFIX}")
    except OSError as e:  # the snapshot directory was discarded meanwhile
        log.info("digest of %s not published: %s", path, e)


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
_CONTROLLER: Any = None
_SPREAD_UNITS = simple_storage_bootstrap.get_node_round_robin_scheduling_strategies


def install(node_id: str | None = None) -> None:
    """Make TransferQueue's bootstrap start `CompactSimpleStorageUnit`s and a `DirectPickleController`, on `node_id`
    if given; call before `tq.init`.

    With `node_id` (the head: the driver's node), TransferQueue's controller and every storage unit are created
    there with hard node affinity, so no worker's loss can take run state with it; without it, TransferQueue
    places them itself (its units go round robin over every node). Affects what `tq.init` creates afterwards in
    this process; calling it again replaces the placement.
    """
    global _COMPACT_UNIT, _CONTROLLER
    check_version()
    if _COMPACT_UNIT is None:
        _COMPACT_UNIT = ray.remote(num_cpus=1)(CompactSimpleStorageUnit)
        _CONTROLLER = ray.remote(num_cpus=1)(tq_controller.DirectPickleController)  # the stock class's options
    if simple_storage_bootstrap.SimpleStorageUnit is not _COMPACT_UNIT:
        simple_storage_bootstrap.SimpleStorageUnit = _COMPACT_UNIT
        log.info("SimpleStorage checkpoint fix installed (transferqueue %s)", PINNED_TQ_VERSION)
    if node_id is None:
        simple_storage_bootstrap.get_node_round_robin_scheduling_strategies = _SPREAD_UNITS
        tq_interface.TransferQueueController = _CONTROLLER
        return
    pinned = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    simple_storage_bootstrap.get_node_round_robin_scheduling_strategies = lambda n, **_: [pinned] * n
    tq_interface.TransferQueueController = _PinnedActorClass(_CONTROLLER, pinned)


class _PinnedActorClass:
    """A Ray actor class whose `.options(...)` always adds one scheduling strategy (TransferQueue's own call sets
    only the name and the namespace)."""

    def __init__(self, actor_class: Any, strategy: NodeAffinitySchedulingStrategy) -> None:
        self._actor_class = actor_class
        self._strategy = strategy

    def options(self, **options: Any) -> Any:
        return self._actor_class.options(**options, scheduling_strategy=self._strategy)
