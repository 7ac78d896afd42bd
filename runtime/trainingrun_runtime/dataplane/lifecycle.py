"""The data-plane client: the only code that talks to TransferQueue (0.1.11, SimpleStorage backend).

Two roles, and the order between them is enforced by types, not by statement order::

    driver setup (one process, before the controller actor exists)
      dp = BootstrapDataPlane.start()              # creates TQ (fix installed, CPU slots checked, polling on)
      token, meta = dp.load_checkpoint(dir)        # restore onto a pristine TQ ...
      token = dp.start_fresh()                     # ... or decide explicitly that there is nothing to restore
    controller actor (or any other process), later
      cp = ConnectOnlyDataPlane.connect(token)     # attaches; refuses a token this TQ never issued

A `DataPlaneToken` is only ever minted by `load_checkpoint` / `start_fresh`; its
nonce is written into the TQ controller's config, and `connect` checks it there,
so a connect-only client cannot exist before the restore decision was taken on
*this* TransferQueue. The bootstrap client refuses data operations until that
decision, and refuses a restore once any operation went through it (a failed
restore leaves it dirty). Before loading it also checks TransferQueue's *global*
state (no partitions, no rows, nothing consumed, storage units empty), so a write
by any other client is caught too, and it names what it found.

Rows are keyed by the caller's own stable sample ids (TQ's KV interface), never
by TQ's global indexes, which TQ reuses after a clear. Every row is tagged with
its group (`tr_group`, `tr_group_size`); puts, field overwrites and clears must
cover whole groups, checked against those tags, so a partial clear can never mix
two GRPO groups. Reads return dense tensors where every row has the same shape
(TQ hands back jagged nested tensors), a list of tensors where they differ, and a
list of objects for non-tensor fields.

Pitfalls of 0.1.11 handled here: `tq.init` hangs when Ray lacks free CPU slots
(checked first, and init runs under a timeout); `polling_mode` is on; reads are
normalized; `tq.close()` is only ever called by the bootstrap client, because
from an attaching process it kills the shared controller; TQ's checkpoint load
has no guard and is not atomic, so files are checked before it runs, it only
ever runs on a pristine TQ, and a failure poisons the client (the TQ must be
restarted). Snapshots use TQ's own layout and its client's controller and
storage checkpoint calls, run concurrently (`tq.save_checkpoint` and
`tq.load_checkpoint` run them one after the other). The SimpleStorage
checkpoint blow-up is fixed in `tq_storage_fix`, whose storage units write
their files in `column_file` format 2: `snapshot` returns once the units have
planned their files and created them at their final sizes (inside the barrier's
window); the units then write and hash the rows in the background, and
`PendingSnapshot.digests` waits for their SHA-256s, so the bundle never reads
those files back to hash them. The
snapshot's sidecar (`SIDECAR`, format 2) lists every file with its size; a
snapshot of format 1 (pickled storage units) is refused, naming the sidecar.

All methods are blocking; async callers use `asyncio.to_thread`. Used by
`replay_buffer` (puts, clears) and `checkpoint` (list, save, restore).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import ray
import torch
import transfer_queue as tq  # type: ignore[import-untyped]
from tensordict import NonTensorStack, TensorDict

from trainingrun_runtime.dataplane import storage_unit
from trainingrun_runtime.errors import CheckpointCorrupt, DataPlaneError, RestoreRefused
from trainingrun_runtime.dataplane.replay_buffer import GroupRows

__all__ = [
    "TAG_GROUP",
    "TAG_GROUP_SIZE",
    "SIDECAR",
    "GroupRows",
    "RowState",
    "PartitionState",
    "DataPlaneState",
    "DataPlaneToken",
    "Restored",
    "PendingSnapshot",
    "DataPlaneClient",
    "BootstrapDataPlane",
    "ConnectOnlyDataPlane",
    "check_data_plane_dir",
]

log = logging.getLogger(__name__)

TAG_GROUP: Final = "tr_group"
TAG_GROUP_SIZE: Final = "tr_group_size"
_RESERVED_TAG_PREFIX: Final = "tr_"
SIDECAR: Final = "trainingrun_data_plane.json"
"""Written into every data-plane snapshot: TQ version, storage-unit count, every file with its size."""
_SIDECAR_FORMAT: Final = 2
"""2: storage units in `column_file` format 2; 1: storage units pickled (refused, naming the fix)."""
_CONTROLLER_NAME: Final = "TransferQueueController"
_CONTROLLER_NAMESPACE: Final = "transfer_queue"
_UNIT_NAME: Final = "TransferQueueStorageUnit#{}"
_TOKEN_KEY: Final = "trainingrun_token"
_UNIT_DIR: Final = "simple_storage"
_UNIT_INFO: Final = f"{_UNIT_DIR}/storage_unit_info.json"
_METADATA_FILE: Final = "metadata.json"  # the names tq.save_checkpoint / tq.load_checkpoint use (0.1.11)
_CONTROLLER_FILE: Final = "controller_state.pkl"
_MINT: Final = object()

Batch = Mapping[str, "torch.Tensor | Sequence[Any]"]


@dataclasses.dataclass(frozen=True)
class RowState:
    """One stored row as the TQ controller sees it: tags, produced fields, tasks that consumed it."""

    sample_id: str | None
    tags: Mapping[str, Any]
    fields: tuple[str, ...]
    consumed_by: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PartitionState:
    """Metadata of one partition: rows by sample id (unkeyed rows under None ids are counted only)."""

    partition: str
    rows: Mapping[str, RowState]
    unkeyed_rows: int
    consumed: Mapping[str, int]
    """Per consumer task: how many rows it has consumed."""

    @property
    def row_count(self) -> int:
        """Keyed plus unkeyed rows."""
        return len(self.rows) + self.unkeyed_rows


@dataclasses.dataclass(frozen=True)
class DataPlaneState:
    """TransferQueue's global state: every partition, and the keys each storage unit holds."""

    partitions: Mapping[str, PartitionState]
    storage_keys: Mapping[str, int]

    @property
    def pristine(self) -> bool:
        """No partition, no row, nothing consumed, every storage unit empty."""
        return not self.partitions and not any(self.storage_keys.values())

    def describe(self) -> str:
        """What makes this state non-pristine, in words."""
        found = []
        for p in self.partitions.values():
            line = f"partition {p.partition!r} holds {p.row_count} rows"
            used = {t: n for t, n in p.consumed.items() if n}
            if used:
                line += ", consumed " + ", ".join(f"{n} by task {t!r}" for t, n in sorted(used.items()))
            found.append(line)
        for unit, n in sorted(self.storage_keys.items()):
            if n:
                found.append(f"storage unit {unit} holds {n} keys")
        return "; ".join(found) if found else "nothing (pristine)"


class DataPlaneToken:
    """Proof that the bootstrap client restored TransferQueue or decided to start fresh; needed to connect.

    Minted only by `BootstrapDataPlane.load_checkpoint` / `start_fresh`; picklable, so it
    can travel to the controller actor. `connect` checks its nonce against the TQ it attaches to.
    """

    __slots__ = ("nonce", "decision", "source")

    nonce: str
    decision: str
    source: str | None

    def __init__(self, nonce: str, decision: str, source: str | None, *, _mint: object = None) -> None:
        if _mint is not _MINT:
            raise TypeError(
                "DataPlaneToken is issued only by BootstrapDataPlane.load_checkpoint() or start_fresh(); "
                "restore (or decide to start fresh) before building a connect-only client"
            )
        object.__setattr__(self, "nonce", nonce)
        object.__setattr__(self, "decision", decision)
        object.__setattr__(self, "source", source)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("DataPlaneToken is immutable")

    def __reduce__(self) -> tuple[Any, tuple[str, str, str | None]]:
        return _unpickle_token, (self.nonce, self.decision, self.source)

    def __repr__(self) -> str:
        return f"DataPlaneToken(decision={self.decision!r}, source={self.source!r})"


def _new_token(decision: str, source: str | None) -> DataPlaneToken:
    """A token with a fresh secret nonce; valid once `BootstrapDataPlane._store_nonce` has stored the nonce."""
    return DataPlaneToken(secrets.token_hex(16), decision, source, _mint=_MINT)


def _unpickle_token(nonce: str, decision: str, source: str | None) -> DataPlaneToken:
    return DataPlaneToken(nonce, decision, source, _mint=_MINT)


class PendingSnapshot:
    """A snapshot whose files exist at their final sizes; the storage units are still writing and hashing theirs."""

    def __init__(self, path: Path, sizes: Mapping[str, int], unit_files: Sequence[str]) -> None:
        self.path = path
        self.sizes = dict(sizes)
        """Every file but the sidecar, POSIX path relative to the snapshot directory (what the sidecar lists)."""
        self.unit_files = list(unit_files)
        self._digests: dict[str, str] | None = None

    def digests(self, timeout_s: float = 300.0) -> dict[str, str]:
        """{relpath: sha256} of the storage-unit files, as their units hashed them; waits for them.

        Raises DataPlaneError if a unit reports a failure, reports another size than the file
        has, or reports nothing within `timeout_s` (a unit that died).
        """
        if self._digests is not None:
            return dict(self._digests)
        found: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        pause = 0.0005
        for rel in self.unit_files:
            side = self.path / f"{rel}{storage_unit.DIGEST_SUFFIX}"
            while not side.exists():
                if time.monotonic() > deadline:
                    raise DataPlaneError(f"{self.path / rel}: its storage unit reported no digest within {timeout_s:g} s")
                time.sleep(pause)  # a stat every half millisecond: a small snapshot is done in tens of them
                pause = min(pause * 2, 0.001)
            entry = json.loads(side.read_text())
            side.unlink()
            if "error" in entry:
                raise DataPlaneError(f"{self.path / rel}: its storage unit failed to hash it: {entry['error']}")
            if entry.get("size") != self.sizes.get(rel):
                raise DataPlaneError(
                    f"{self.path / rel}: {self.sizes.get(rel)} bytes on disk, its storage unit hashed {entry.get('size')}"
                )
            found[rel] = str(entry["sha256"])
        self._digests = found
        return dict(found)


class Restored(NamedTuple):
    """What a restore returns: the token for connect-only clients and the metadata saved with the snapshot."""

    token: DataPlaneToken
    metadata: dict[str, Any]


class DataPlaneClient:
    """Row operations shared by both roles. Not constructed directly: use the two subclasses."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used_by: str | None = None
        self._closed = False
        self._client: Any = None

    # -- writes ---------------------------------------------------------------------------------

    def put_groups(
        self,
        partition: str,
        groups: Sequence[GroupRows],
        fields: Batch,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Store whole new groups: `fields` are batched over all rows in group order; all or nothing.

        Refuses sample ids that are already stored. On failure every row of this call is
        cleared again before the error propagates.
        """
        client = self._begin("put_groups")
        ids = _flatten(groups)
        row_tags = _group_tags(groups, tags)
        data = _to_tensordict(fields, len(ids))
        meta = client.kv_retrieve_meta(ids, partition, create=True)
        # Every row this client stores carries group tags, so an untagged row was registered just now.
        current = list(meta.custom_meta)
        fresh = [i for i, tag in enumerate(current) if not tag]
        try:
            if meta.size != len(ids):
                raise DataPlaneError(f"put_groups: TQ registered {meta.size} of {len(ids)} keys")
            clash = [sid for sid, tag in zip(ids, current, strict=True) if tag]
            if clash:
                raise DataPlaneError(f"put_groups: sample ids already stored in {partition!r}: {clash[:8]}")
            meta.update_custom_meta(row_tags)
            client.put(data, metadata=meta)
        except BaseException as e:
            # Undo only what this call registered: never a row that existed before it.
            if fresh:
                self._rollback(client, meta.select_samples(fresh), partition)
            if isinstance(e, Exception) and not isinstance(e, DataPlaneError):
                raise DataPlaneError(f"put_groups into {partition!r} failed and was rolled back: {e}") from e
            raise

    def update_fields(self, partition: str, sample_ids: Sequence[str], fields: Batch) -> None:
        """Overwrite or add fields on rows that already exist (the advantage stage); never creates rows.

        The rows must form whole groups. The stored row ids, and so the checkpoint's
        inventory, are unchanged by this call.
        """
        client = self._begin("update_fields")
        meta = self._existing(client, partition, list(sample_ids), "update_fields")
        _check_whole_groups(meta, list(sample_ids), "update_fields")
        client.put(_to_tensordict(fields, len(sample_ids)), metadata=meta)

    def clear_groups(self, partition: str, groups: Sequence[GroupRows]) -> None:
        """Delete whole groups (data and metadata); refuses ids that are missing or do not form whole groups."""
        client = self._begin("clear_groups")
        ids = _flatten(groups)
        meta = self._existing(client, partition, ids, "clear_groups")
        owners = [g.group_id for g in groups for _ in g.sample_ids]
        for sid, owner, tag in zip(ids, owners, _tags_for(meta, ids), strict=True):
            if tag.get(TAG_GROUP) != owner:
                found = tag.get(TAG_GROUP)
                raise DataPlaneError(f"clear_groups: row {sid!r} belongs to group {found!r}, not {owner!r}")
        _check_whole_groups(meta, ids, "clear_groups")
        client.clear_samples(meta)

    # -- reads ----------------------------------------------------------------------------------

    def read_rows(
        self, partition: str, sample_ids: Sequence[str], fields: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor | list[Any]]:
        """Read rows by sample id, in the given order; `fields=None` reads every field all of them have."""
        client = self._begin("read_rows")
        meta = self._existing(client, partition, list(sample_ids), "read_rows")
        if fields is not None:
            missing = sorted(set(fields) - set(meta.field_names))
            if missing:
                raise DataPlaneError(f"read_rows: fields {missing} are not stored for every requested row")
            meta = meta.select_fields(list(fields))
        if not meta.is_ready:
            raise DataPlaneError(f"read_rows: some requested fields are not produced yet in {partition!r}")
        data = client.get_data(meta)
        return {name: _normalize(data.get(name)) for name in data.keys()}

    def read_tags(self, partition: str, sample_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The tags of rows (their TQ custom metadata, group tags included), in the given order."""
        client = self._begin("read_tags")
        meta = self._existing(client, partition, list(sample_ids), "read_tags")
        return [dict(t) for t in _tags_for(meta, list(sample_ids))]

    def list_sample_ids(self, partition: str) -> list[str]:
        """Sorted sample ids stored in `partition` (metadata only, no tensors move)."""
        client = self._begin("list_sample_ids")
        listing = client.kv_list(partition)
        return sorted(listing.get(partition, {}))

    def inventory(self, partition: str) -> PartitionState | None:
        """Metadata of one partition (rows, tags, fields, consumption), or None if it does not exist."""
        self._begin("inventory")
        snap = ray.get(_controller().get_partition_snapshot.remote(partition))
        return None if snap is None else _partition_state(partition, snap)

    # -- snapshot -------------------------------------------------------------------------------

    def save_checkpoint(self, directory: str | os.PathLike[str], metadata: Mapping[str, Any]) -> dict[str, int]:
        """Snapshot TransferQueue into `directory` (must not exist) and wait for the digests; {relpath: size}."""
        pending = self.snapshot(directory, metadata)
        pending.digests()
        return dict(pending.sizes)

    def snapshot(self, directory: str | os.PathLike[str], metadata: Mapping[str, Any]) -> PendingSnapshot:
        """Snapshot TransferQueue into `directory` (must not exist); returns once every file exists at its size.

        `metadata` (JSON values) is stored with the snapshot and returned by `load_checkpoint`.
        Callers hold the barrier's exclusive window so no mutation runs meanwhile. The storage
        units go on writing and hashing their rows after this returns (`PendingSnapshot.digests`
        waits for them), so the window includes neither. Files are not fsynced here:
        the bundle commit fsyncs every file after the window closes.
        """
        self._begin("save_checkpoint")
        path = Path(directory).absolute()
        if path.exists():
            raise DataPlaneError(f"{path}: already exists; a snapshot is written into a new directory")
        user = json.loads(json.dumps(dict(metadata), allow_nan=False))
        path.mkdir()
        try:
            # What tq.save_checkpoint does, with the controller and the storage units writing concurrently.
            _concurrently(
                lambda: self._client.save_controller_checkpoint(str(path / _CONTROLLER_FILE)),
                lambda: self._client.save_storage_checkpoint(str(path)),
            )
            meta = {"storage_saved": True, "user_metadata": user}
            (path / _METADATA_FILE).write_text(json.dumps(meta, indent=2))
            units = json.loads((path / _UNIT_INFO).read_text())
            unit_files = [f"{_UNIT_DIR}/su_{u['position']}_{u['storage_unit_id']}.pkl" for u in units]
        except Exception as e:
            shutil.rmtree(path, ignore_errors=True)
            raise DataPlaneError(f"TransferQueue snapshot into {path} failed: {e}") from e
        files = {
            p.relative_to(path).as_posix(): p.stat().st_size
            for p in sorted(path.rglob("*"))
            if p.is_file() and not _is_digest(p.name)
        }
        sidecar = {
            "format": _SIDECAR_FORMAT,
            "transferqueue": storage_unit.PINNED_TQ_VERSION,
            "storage_units": len(units),
            "files": files,
        }
        (path / SIDECAR).write_text(json.dumps(sidecar, sort_keys=True, indent=1) + "\n")
        return PendingSnapshot(path, files, unit_files)

    # -- plumbing -------------------------------------------------------------------------------

    def _begin(self, op: str) -> Any:
        with self._lock:
            if self._closed:
                raise DataPlaneError(f"{op}: this data-plane client is closed")
            self._check_ready(op)
            if self._used_by is None:
                self._used_by = op
        return self._client

    def _check_ready(self, op: str) -> None:
        """Raise if operations are not allowed yet (overridden by the bootstrap role)."""

    @staticmethod
    def _existing(client: Any, partition: str, ids: list[str], op: str) -> Any:
        if len(set(ids)) != len(ids):
            raise DataPlaneError(f"{op}: duplicate sample ids")
        meta = client.kv_retrieve_meta(ids, partition, create=False)
        if meta.size != len(ids):
            found = set(_ids_of(client, meta, partition)) if meta.size else set()
            missing = [i for i in ids if i not in found]
            raise DataPlaneError(f"{op}: sample ids not stored in {partition!r}: {missing[:8]}")
        return meta

    @staticmethod
    def _rollback(client: Any, meta: Any, partition: str) -> None:
        try:
            client.clear_samples(meta)
        except Exception:
            log.exception("rollback of a failed put into %r failed; %d rows may remain", partition, meta.size)


class BootstrapDataPlane(DataPlaneClient):
    """The trainer's client: creates TransferQueue, is the only one that may restore it, and closes it."""

    def __init__(self, *, _mint: object = None, storage_units: int = 0, conf: Any = None) -> None:
        if _mint is not _MINT:
            raise TypeError("use BootstrapDataPlane.start()")
        super().__init__()
        self._storage_units = storage_units
        self._conf = conf  # TQ's merged config as stored in its controller; the token nonce goes into it
        self._units = [ray.get_actor(_UNIT_NAME.format(rank)) for rank in range(storage_units)]
        self._controller = _controller()  # the one this client created; a restart would be another TQ
        self._token: DataPlaneToken | None = None
        self._poisoned: str | None = None

    @classmethod
    def start(
        cls,
        *,
        storage_units: int = 2,
        capacity: int | None = None,
        init_timeout_s: float = 300.0,
    ) -> BootstrapDataPlane:
        """Create TransferQueue in the connected Ray cluster (which must not have one yet).

        Checks that Ray has `1 + storage_units` free CPU slots first (0.1.11's `tq.init`
        otherwise waits forever), installs the storage fix, turns polling mode on.
        `capacity` bounds the rows stored (None: unbounded).
        """
        if not ray.is_initialized():
            raise DataPlaneError("Ray is not initialized; call ray.init() before starting the data plane")
        if _find_controller() is not None:
            raise DataPlaneError(
                "a TransferQueue controller already runs in this Ray cluster; the bootstrap client must create "
                "its own (a leftover of an earlier process? close it, or connect with a token instead)"
            )
        need = 1 + storage_units
        free = ray.available_resources().get("CPU", 0.0)  # type: ignore[no-untyped-call]
        if free < need:
            raise DataPlaneError(
                f"TransferQueue needs {need} free Ray CPU slots (1 controller + {storage_units} storage units) "
                f"but only {free:g} are free; tq.init would wait forever. Start Ray with more logical CPUs "
                "(e.g. ray.init(num_cpus=8)) or fewer storage units"
            )
        storage_unit.install()
        conf = {
            "controller": {"polling_mode": True},
            "backend": {
                "storage_backend": "SimpleStorage",
                "SimpleStorage": {"num_data_storage_units": storage_units, "total_storage_size": capacity},
            },
        }
        final_conf = _run_with_timeout(lambda: tq.init(conf), init_timeout_s, "tq.init")
        self = cls(_mint=_MINT, storage_units=storage_units, conf=final_conf)
        self._client = tq.get_client()
        # The first `__ray_call__` into each unit ships the function (~15 ms here): pay it now, with the
        # start-up, rather than in the restore's pristine check.
        self.state()
        log.info("TransferQueue started: %d storage units, capacity %s", storage_units, capacity)
        return self

    @property
    def storage_units(self) -> int:
        """How many SimpleStorage units this TransferQueue has (a snapshot must have as many)."""
        return self._storage_units

    def _check_ready(self, op: str) -> None:
        if self._poisoned is not None:
            raise DataPlaneError(f"{op}: {self._poisoned}")
        if self._token is None:
            raise DataPlaneError(
                f"{op}: the bootstrap client must first restore (load_checkpoint) or start_fresh()"
            )

    def state(self) -> DataPlaneState:
        """TransferQueue's global state, whoever wrote it (metadata only; Ray calls in parallel).

        One round of calls when TransferQueue is pristine (the restore path): the units' key
        counts and the controller's partitions at once; a second for the partitions' details.
        """
        controller = self._controller
        names = [_UNIT_NAME.format(rank) for rank in range(self._storage_units)]
        *units, listed = ray.get(
            [*(u.__ray_call__.remote(_active_key_count) for u in self._units), controller.list_partitions.remote()]
        )
        pids = sorted(listed)
        snaps = ray.get([controller.get_partition_snapshot.remote(pid) for pid in pids]) if pids else []
        partitions = {pid: _partition_state(pid, snap) for pid, snap in zip(pids, snaps, strict=True) if snap}
        return DataPlaneState(partitions=partitions, storage_keys=dict(zip(names, map(int, units), strict=True)))

    def start_fresh(self) -> DataPlaneToken:
        """Decide that there is nothing to restore; TransferQueue must be pristine. Returns the token."""
        self._claim_decision("start_fresh")
        state = self.state()
        if not state.pristine:
            raise RestoreRefused(f"start_fresh refused: TransferQueue is not pristine: {state.describe()}")
        return self._issue("fresh", None)

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> Restored:
        """Restore TransferQueue from a snapshot written by `save_checkpoint`; returns (token, metadata).

        Refused (RestoreRefused) once anything went through this client, a failed load
        included, and when TransferQueue's global state is not pristine. The snapshot's
        files are checked against its sidecar (sizes, TQ version, unit count) before TQ's
        loader sees them; checksums are the caller's job (`verification.open_verified`).
        """
        self._claim_decision("load_checkpoint")
        path = Path(directory).absolute()
        state = self.state()
        if not state.pristine:
            raise RestoreRefused(f"restore from {path} refused: TransferQueue is not pristine: {state.describe()}")
        check_data_plane_dir(path, storage_units=self._storage_units)
        try:
            user = dict(json.loads((path / _METADATA_FILE).read_text())["user_metadata"])
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointCorrupt(f"{path / _METADATA_FILE}: unreadable ({type(e).__name__}: {e})") from None
        token = _new_token("restored", str(path))
        try:
            # What tq.load_checkpoint does, with the storage units and the controller loading concurrently; the
            # token's nonce is stored meanwhile (nobody can connect with it before this returns the token).
            _concurrently(
                lambda: self._client.load_storage_checkpoint(str(path)),
                lambda: self._client.load_controller_checkpoint(str(path / _CONTROLLER_FILE)),
                lambda: self._store_nonce(token),
            )
        except Exception as e:
            self._poisoned = f"a restore from {path} failed half-way; TransferQueue is in an unknown state"
            raise DataPlaneError(f"{self._poisoned}: {e}") from e
        return Restored(self._ready(token), user)

    def close(self) -> None:
        """Shut TransferQueue down (controller and storage units) and wait until it is gone."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        tq.close()
        deadline = time.monotonic() + 60.0
        while _find_controller() is not None:
            if time.monotonic() > deadline:
                raise DataPlaneError("TransferQueue controller still alive 60 s after tq.close()")
            time.sleep(0.2)

    def _claim_decision(self, op: str) -> None:
        with self._lock:
            if self._closed:
                raise DataPlaneError(f"{op}: this data-plane client is closed")
            if self._used_by is not None:
                raise RestoreRefused(
                    f"{op} refused: this client was already used ({self._used_by}); a restore must be the "
                    "first operation on a fresh TransferQueue"
                )
            self._used_by = op

    def _issue(self, decision: str, source: str | None) -> DataPlaneToken:
        token = _new_token(decision, source)
        self._store_nonce(token)
        return self._ready(token)

    def _store_nonce(self, token: DataPlaneToken) -> None:
        """Write the token's nonce into the controller's config, where `ConnectOnlyDataPlane.connect` checks it."""
        self._conf[_TOKEN_KEY] = token.nonce  # TQ's merged config (an OmegaConf object, not a dict)
        ray.get(self._controller.store_config.remote(self._conf))

    def _ready(self, token: DataPlaneToken) -> DataPlaneToken:
        self._token = token
        log.info("data plane ready: %s", token)
        return token


class ConnectOnlyDataPlane(DataPlaneClient):
    """A client that attaches to the TransferQueue a bootstrap client restored; never restores, never closes TQ."""

    def __init__(self, *, _mint: object = None) -> None:
        if _mint is not _MINT:
            raise TypeError("use ConnectOnlyDataPlane.connect(token), with the token the restore returned")
        super().__init__()

    @classmethod
    def connect(cls, token: DataPlaneToken) -> ConnectOnlyDataPlane:
        """Attach to the running TransferQueue; refused unless `token` was issued by its bootstrap client."""
        if not isinstance(token, DataPlaneToken):
            raise TypeError(f"connect() needs the DataPlaneToken from the restore, got {type(token).__name__}")
        controller = _find_controller()
        if controller is None:
            raise DataPlaneError("no TransferQueue runs in this Ray cluster; the bootstrap client starts it")
        conf = ray.get(controller.get_config.remote())
        issued = None if conf is None else conf.get(_TOKEN_KEY)
        if issued != token.nonce:
            raise DataPlaneError(
                f"{token} was not issued by the TransferQueue running in this Ray cluster"
                + ("" if issued else " (it has not been restored or started fresh yet)")
            )
        tq.init()  # attaches: a controller exists, so this only builds the client
        self = cls(_mint=_MINT)
        self._client = tq.get_client()
        return self

    def close(self) -> None:
        """Stop using this client. Never calls `tq.close()`: from an attaching process that kills the shared TQ."""
        with self._lock:
            self._closed = True


def check_data_plane_dir(path: Path, *, storage_units: int | None = None) -> dict[str, Any]:
    """Check a snapshot directory against its sidecar before any loader reads it; returns the sidecar.

    Raises CheckpointCorrupt naming the file and the problem (missing, unlisted, wrong size,
    other TransferQueue version, other storage-unit count).
    """
    if not path.is_dir():
        raise CheckpointCorrupt(f"{path}: missing (no data-plane snapshot)")
    side = path / SIDECAR
    try:
        sidecar = json.loads(side.read_text())
        found_format = sidecar.get("format")
        files = sidecar["files"]
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{side}: missing") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointCorrupt(f"{side}: unreadable ({e})") from None
    if found_format != _SIDECAR_FORMAT:
        raise CheckpointCorrupt(
            f"{side}: data-plane snapshot format {found_format!r}, this trainingrun reads format {_SIDECAR_FORMAT} "
            "only (format 1 pickled the storage units); restore it with the trainingrun version that wrote it, "
            "or resume from a checkpoint written by this version"
        )
    if not isinstance(files, dict):
        raise CheckpointCorrupt(f"{side}: unreadable (unexpected layout)")
    if sidecar.get("transferqueue") != storage_unit.PINNED_TQ_VERSION:
        raise CheckpointCorrupt(
            f"{side}: written by transferqueue {sidecar.get('transferqueue')}, "
            f"this process runs {storage_unit.PINNED_TQ_VERSION}"
        )
    if storage_units is not None and sidecar.get("storage_units") != storage_units:
        raise CheckpointCorrupt(
            f"{side}: snapshot has {sidecar.get('storage_units')} storage units, this TransferQueue {storage_units}"
        )
    present = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {SIDECAR}
    for rel in sorted(set(files) | present):
        f = path / rel
        if rel not in files:
            raise CheckpointCorrupt(f"{f}: not listed in {SIDECAR}")
        if rel not in present:
            raise CheckpointCorrupt(f"{f}: missing (listed in {SIDECAR})")
        size = f.stat().st_size
        if size != files[rel]:
            what = "truncated" if size < files[rel] else "size mismatch"
            raise CheckpointCorrupt(f"{f}: {what} ({size} bytes, {SIDECAR} says {files[rel]})")
    for required in (_METADATA_FILE, _CONTROLLER_FILE):
        if required not in files:
            raise CheckpointCorrupt(f"{path / required}: missing from the snapshot")
    return dict(sidecar)


# -- helpers ------------------------------------------------------------------------------------------


def _is_digest(name: str) -> bool:
    return name.endswith((storage_unit.DIGEST_SUFFIX, storage_unit.DIGEST_SUFFIX + ".tmp"))


def _find_controller() -> Any:
    try:
        return ray.get_actor(_CONTROLLER_NAME, namespace=_CONTROLLER_NAMESPACE)
    except ValueError:
        return None


def _controller() -> Any:
    controller = _find_controller()
    if controller is None:
        raise DataPlaneError("TransferQueue controller is gone")
    return controller


def _active_key_count(unit: Any) -> int:
    return int(unit.storage_data.active_key_count)


def _partition_state(partition: str, snap: Any) -> PartitionState:
    """Summarize a controller `DataPartitionStatus` snapshot."""
    names = sorted(snap.field_name_mapping, key=snap.field_name_mapping.__getitem__)
    produced = snap.production_status
    rows: dict[str, RowState] = {}
    unkeyed = 0
    for gi in sorted(snap.global_indexes):
        key = snap.revert_keys_mapping.get(gi)
        fields = tuple(
            sorted(n for n in names if gi < produced.shape[0] and int(produced[gi, snap.field_name_mapping[n]]))
        )
        consumed = tuple(
            sorted(t for t, status in snap.consumption_status.items() if gi < status.shape[0] and int(status[gi]))
        )
        if key is None:
            unkeyed += 1
            continue
        rows[key] = RowState(key, dict(snap.custom_meta.get(gi, {})), fields, consumed)
    consumed_counts = {
        t: int(sum(int(status[gi]) for gi in snap.global_indexes if gi < status.shape[0]))
        for t, status in snap.consumption_status.items()
    }
    return PartitionState(partition, rows, unkeyed, consumed_counts)


def _run_with_timeout(fn: Any, timeout_s: float, what: str) -> Any:
    error: list[BaseException] = []
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # re-raised in the caller's thread
            error.append(e)

    thread = threading.Thread(target=run, name=f"trainingrun-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise DataPlaneError(f"{what} did not finish within {timeout_s:g} s (Ray short of CPU slots?)")
    if error:
        raise DataPlaneError(f"{what} failed: {error[0]}") from error[0]
    return result[0]


def _concurrently(*calls: Callable[[], object]) -> None:
    """Run blocking TQ calls at once (each waits on a different actor, or the same one for a different thing);
    raise the first failure, after all have ended."""
    with concurrent.futures.ThreadPoolExecutor(len(calls), thread_name_prefix="trainingrun-tq") as pool:
        futures = [pool.submit(call) for call in calls]
        for future in futures:
            future.result()


def _flatten(groups: Sequence[GroupRows]) -> list[str]:
    if not groups:
        raise DataPlaneError("no groups given")
    seen_groups: set[str] = set()
    ids: list[str] = []
    for g in groups:
        if not g.sample_ids:
            raise DataPlaneError(f"group {g.group_id!r} has no rows")
        if g.group_id in seen_groups:
            raise DataPlaneError(f"group {g.group_id!r} given twice")
        seen_groups.add(g.group_id)
        ids.extend(g.sample_ids)
    if len(set(ids)) != len(ids):
        raise DataPlaneError("duplicate sample ids across the given groups")
    return ids


def _group_tags(groups: Sequence[GroupRows], tags: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    n = sum(len(g.sample_ids) for g in groups)
    if tags is not None and len(tags) != n:
        raise DataPlaneError(f"{len(tags)} tags for {n} rows")
    out: list[dict[str, Any]] = []
    for g in groups:
        for _ in g.sample_ids:
            user = dict(tags[len(out)]) if tags is not None else {}
            reserved = [k for k in user if k.startswith(_RESERVED_TAG_PREFIX)]
            if reserved:
                raise DataPlaneError(f"tag keys {reserved} use the reserved prefix {_RESERVED_TAG_PREFIX!r}")
            user[TAG_GROUP] = g.group_id
            user[TAG_GROUP_SIZE] = len(g.sample_ids)
            out.append(user)
    return out


def _tags_for(meta: Any, ids: list[str]) -> list[Mapping[str, Any]]:
    # kv_retrieve_meta returns rows in the order of the keys asked for.
    by_position = list(meta.custom_meta)
    if len(by_position) != len(ids):
        raise DataPlaneError(f"expected tags for {len(ids)} rows, TQ returned {len(by_position)}")
    return by_position


def _check_whole_groups(meta: Any, ids: list[str], op: str) -> None:
    members: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for sid, tag in zip(ids, _tags_for(meta, ids), strict=True):
        group = tag.get(TAG_GROUP)
        if group is None:
            raise DataPlaneError(f"{op}: row {sid!r} carries no group tag")
        members[group] = members.get(group, 0) + 1
        sizes[group] = int(tag.get(TAG_GROUP_SIZE, -1))
    partial = {g: f"{n} of {sizes[g]}" for g, n in members.items() if n != sizes[g]}
    if partial:
        raise DataPlaneError(f"{op}: must cover whole groups; partial: {dict(sorted(partial.items()))}")


def _ids_of(client: Any, meta: Any, partition: str) -> list[str]:
    return list(client.kv_retrieve_keys(list(meta.global_indexes), partition))


def _to_tensordict(fields: Batch, n: int) -> TensorDict:
    if not fields:
        raise DataPlaneError("no fields given")
    batch: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.shape[0] != n:
                raise DataPlaneError(f"field {name!r}: first dimension must be {n} rows, got {tuple(value.shape)}")
            batch[name] = value
            continue
        values = list(value)
        if len(values) != n:
            raise DataPlaneError(f"field {name!r}: {len(values)} values for {n} rows")
        if values and all(isinstance(v, torch.Tensor) for v in values):
            if all(v.shape == values[0].shape and v.dtype == values[0].dtype for v in values):
                batch[name] = torch.stack(values)
            else:
                try:
                    batch[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
                except (RuntimeError, TypeError):
                    batch[name] = torch.nested.as_nested_tensor(values, layout=torch.strided)
        else:
            batch[name] = NonTensorStack(*values)
    return TensorDict(batch, batch_size=[n])


def _normalize(value: Any) -> torch.Tensor | list[Any]:
    """TQ returns jagged nested tensors even when every row has the same shape: densify or list them."""
    if isinstance(value, torch.Tensor):
        if not value.is_nested:
            return value
        rows = list(value.unbind())
        if rows and all(r.shape == rows[0].shape for r in rows):
            return torch.stack(rows)
        return rows
    if isinstance(value, NonTensorStack):
        return list(value.tolist())
    return list(value)
