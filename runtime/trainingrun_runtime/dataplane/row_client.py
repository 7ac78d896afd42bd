"""The row client: puts, overwrites, clears and reads of whole GRPO groups of rows in TransferQueue, by sample id.

    put_groups(partition, groups, fields)      store whole new groups, all or nothing (rolled back on failure)
    update_fields(partition, ids, fields)      overwrite fields of rows that exist (the advantage stage)
    clear_groups(partition, groups)            delete whole groups
    read_rows(partition, ids, fields)          rows in the order asked for: dense tensors where shapes agree
    list_sample_ids(partition), inventory(partition)     what is stored (metadata only)
    snapshot(directory, metadata)              TransferQueue's snapshot (`snapshot`), inside the barrier's window

Rows are keyed by the caller's own stable sample ids (TransferQueue's KV interface), never by TransferQueue's
global indexes, which it reuses after a clear. Every row is tagged with its group (`tr_group`, `tr_group_size`);
puts, overwrites and clears must cover whole groups, checked against those tags, so a partial clear can never
mix two GRPO groups. Reads return dense tensors where every row has the same shape (TransferQueue hands back
jagged nested tensors), a list of tensors where they differ, and a list of objects for non-tensor fields.

`DataPlaneClient` is the base of the two roles in `lifecycle` (the bootstrap client and the connect-only client),
never built directly. All methods block; async callers use `asyncio.to_thread`. Used by the replay buffer (puts,
clears), the controller (reads, the advantage stage's overwrites), the trainer worker (reads) and the
checkpointer (list, snapshot).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import ray
import torch

from trainingrun_runtime.dataplane import snapshot
from trainingrun_runtime.dataplane.replay_index import GroupRows
from trainingrun_runtime.dataplane.tq_modules import NonTensorStack, TensorDict
from trainingrun_runtime.errors import DataPlaneError

__all__ = [
    "TAG_GROUP",
    "TAG_GROUP_SIZE",
    "DataPlaneClient",
    "PartitionState",
    "RowState",
    "controller",
    "find_controller",
    "partition_state",
]

log = logging.getLogger(__name__)

TAG_GROUP: Final = "tr_group"

TAG_GROUP_SIZE: Final = "tr_group_size"

_RESERVED_TAG_PREFIX: Final = "tr_"

_CONTROLLER_NAME: Final = "TransferQueueController"
_CONTROLLER_NAMESPACE: Final = "transfer_queue"

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


class DataPlaneClient:
    """Row operations shared by both roles. Not constructed directly: use the two subclasses in `lifecycle`."""

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

    def list_sample_ids(self, partition: str) -> list[str]:
        """Sorted sample ids stored in `partition` (metadata only, no tensors move)."""
        client = self._begin("list_sample_ids")
        listing = client.kv_list(partition)
        return sorted(listing.get(partition, {}))

    def inventory(self, partition: str) -> PartitionState | None:
        """Metadata of one partition (rows, tags, fields, consumption), or None if it does not exist."""
        self._begin("inventory")
        snap = ray.get(controller().get_partition_snapshot.remote(partition))
        return None if snap is None else partition_state(partition, snap)

    # -- snapshot -------------------------------------------------------------------------------

    def snapshot(self, directory: str | os.PathLike[str], metadata: Mapping[str, Any]) -> snapshot.PendingSnapshot:
        """Snapshot TransferQueue into `directory` (must not exist); see `snapshot.write`. Callers hold the window."""
        client = self._begin("snapshot")
        return snapshot.write(client, Path(directory), metadata)

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


def find_controller() -> Any:
    """TransferQueue's controller actor in this Ray cluster, or None."""
    try:
        return ray.get_actor(_CONTROLLER_NAME, namespace=_CONTROLLER_NAMESPACE)
    except ValueError:
        return None


def partition_state(partition: str, snap: Any) -> PartitionState:
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


def controller() -> Any:
    """TransferQueue's controller actor; DataPlaneError if there is none."""
    found = find_controller()
    if found is None:
        raise DataPlaneError("TransferQueue controller is gone")
    return found
