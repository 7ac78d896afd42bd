"""The replay index: which stored rows form which GRPO group. Pure bookkeeping: no tensors, no I/O.

Reservations (groups being generated), committed groups in commit order, the state written to the replay index
file (`replay_buffer_metadata.pt`), and the preflight that rebuilds an index from it. `replay_buffer` puts the
rows beside it in TransferQueue, behind the barrier. The state (JSON values only, so `torch.load(weights_only=True)`
reads it back)::

    {"format": 1, "partition": str, "group_size": int, "capacity": int,
     "groups": [{"group_id": str, "sample_ids": [str, ...], "meta": {...}}, ...],  # commit order
     "digest": sha256 of canonical JSON of "groups"}

Only committed groups are saved; reservations (groups still being generated) are not, because they have no rows
(the in-flight ledger re-dispatches them). Rebuilding (`from_state_dict`) never touches TransferQueue: it checks
the partition, group size, duplicate ids, capacity and digest, and, given the ids TransferQueue holds, that they
are exactly the index's. Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from trainingrun_runtime import digest
from trainingrun_runtime.errors import DataPlaneError, DigestError, PreflightError

__all__ = ["STATE_FORMAT", "GroupRecord", "GroupRows", "ReplayConfig", "ReplayIndex", "inventory_difference"]

STATE_FORMAT: Final = 1


@dataclasses.dataclass(frozen=True)
class GroupRows:
    """The rows of one GRPO group: its id and its members' stable sample ids, in member order."""

    group_id: str
    sample_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """The buffer's shape: the partition its rows live in, rows per group, and the most groups it holds."""

    partition: str
    group_size: int
    capacity: int


@dataclasses.dataclass(frozen=True)
class GroupRecord:
    """One group in the index: its rows, caller metadata (JSON values), and whether its rows are stored."""

    group_id: str
    sample_ids: tuple[str, ...]
    meta: Mapping[str, Any]
    committed: bool

    @property
    def rows(self) -> GroupRows:
        """The group as the data plane addresses it."""
        return GroupRows(self.group_id, self.sample_ids)


class ReplayIndex:
    """Which rows form which group: reservations and committed groups (commit order). Pure, no I/O."""

    def __init__(self, *, partition: str, group_size: int, capacity: int) -> None:
        if not partition:
            raise ValueError("partition must be a non-empty string")
        if group_size < 1 or capacity < 1:
            raise ValueError(f"group_size and capacity must be >= 1, got {group_size}, {capacity}")
        self.partition = partition
        self.group_size = group_size
        self.capacity = capacity
        self._groups: dict[str, GroupRecord] = {}  # insertion order = reservation order
        self._committed: dict[str, None] = {}  # commit order
        self._owner: dict[str, str] = {}  # sample id -> group id

    # -- queries --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Committed groups."""
        return len(self._committed)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._groups

    def get(self, group_id: str) -> GroupRecord:
        """The record of a reserved or committed group (KeyError naming it otherwise)."""
        try:
            return self._groups[group_id]
        except KeyError:
            raise KeyError(f"group {group_id!r} is not in the replay index") from None

    def committed(self) -> list[GroupRecord]:
        """Committed groups, oldest commit first."""
        return [self._groups[g] for g in self._committed]

    def reserved(self) -> list[GroupRecord]:
        """Groups reserved but not committed (no rows stored)."""
        return [r for r in self._groups.values() if not r.committed]

    def stored_sample_ids(self) -> set[str]:
        """Sample ids of committed groups: exactly the rows the data plane must hold."""
        return {sid for g in self._committed for sid in self._groups[g].sample_ids}

    # -- transitions ----------------------------------------------------------------------------

    def reserve(
        self, group_id: str, sample_ids: Sequence[str] | None = None, meta: Mapping[str, Any] | None = None
    ) -> GroupRecord:
        """Claim a slot and sample ids for a group (default ids: `<group_id>:<member>`)."""
        ids = tuple(sample_ids) if sample_ids is not None else tuple(f"{group_id}:{i}" for i in range(self.group_size))
        record = GroupRecord(group_id, ids, dict(meta or {}), committed=False)
        _check_group(record, self.group_size, f"group {group_id!r}", ValueError)
        digest.canonical_json(dict(record.meta))  # JSON values only; names the bad field
        if group_id in self._groups:
            raise DataPlaneError(f"group {group_id!r} is already in the replay index")
        taken = [sid for sid in ids if sid in self._owner]
        if taken:
            raise DataPlaneError(f"sample ids {taken[:8]} already belong to group {self._owner[taken[0]]!r}")
        if len(self._groups) >= self.capacity:
            raise DataPlaneError(f"replay buffer is full: {len(self._groups)} of {self.capacity} groups")
        self._groups[group_id] = record
        self._owner.update((sid, group_id) for sid in ids)
        return record

    def commit(self, group_id: str) -> GroupRecord:
        """Mark a reserved group's rows as stored."""
        record = self.get(group_id)
        if record.committed:
            raise DataPlaneError(f"group {group_id!r} is already committed")
        record = dataclasses.replace(record, committed=True)
        self._groups[group_id] = record
        self._committed[group_id] = None
        return record

    def release(self, group_id: str) -> GroupRecord:
        """Drop a group (reserved or committed) from the index and free its sample ids."""
        self.get(group_id)  # KeyError naming the group
        record = self._groups.pop(group_id)
        self._committed.pop(group_id, None)
        for sid in record.sample_ids:
            self._owner.pop(sid, None)
        return record

    # -- state ----------------------------------------------------------------------------------

    def groups_payload(self) -> list[dict[str, Any]]:
        """The committed groups as JSON values, in commit order (what the digest covers)."""
        return [
            {"group_id": r.group_id, "sample_ids": list(r.sample_ids), "meta": dict(r.meta)} for r in self.committed()
        ]

    def digest(self) -> str:
        """SHA-256 over the canonical JSON of the committed groups."""
        return digest.sha256_hex(self.groups_payload())

    def state_dict(self) -> dict[str, Any]:
        """The index as plain JSON values (committed groups only)."""
        groups = self.groups_payload()
        return {
            "format": STATE_FORMAT,
            "partition": self.partition,
            "group_size": self.group_size,
            "capacity": self.capacity,
            "groups": groups,
            "digest": digest.sha256_hex(groups),
        }

    @classmethod
    def from_state_dict(
        cls,
        state: Mapping[str, Any],
        *,
        partition: str,
        group_size: int,
        capacity: int,
        stored_ids: Collection[str] | None = None,
        expected_digest: str | None = None,
        where: str = "replay index",
    ) -> ReplayIndex:
        """Rebuild an index after preflight; PreflightError / DigestError name `where` and the problem.

        Checks: format, partition, group size, every group well formed, no duplicate group
        or sample ids, capacity, the digest (against the state's own and `expected_digest`),
        and, when `stored_ids` is given, that it equals the index's sample ids.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise PreflightError(f"{where}: unsupported state format {got!r} (expected {STATE_FORMAT})")
        if state.get("partition") != partition:
            raise PreflightError(f"{where}: partition is {state.get('partition')!r}, this buffer uses {partition!r}")
        if state.get("group_size") != group_size:
            raise PreflightError(f"{where}: group size is {state.get('group_size')!r}, this buffer uses {group_size}")
        groups = state.get("groups")
        if not isinstance(groups, list):
            raise PreflightError(f"{where}: 'groups' must be a list")
        if len(groups) > capacity:
            raise PreflightError(f"{where}: {len(groups)} groups exceed this buffer's capacity of {capacity}")
        records = [_record_from(g, group_size, f"{where}: groups[{i}]") for i, g in enumerate(groups)]
        try:
            computed = digest.sha256_hex(groups)
        except DigestError as e:
            raise DigestError(f"{where}: {e}") from None
        if state.get("digest") != computed:
            raise DigestError(f"{where}: digest mismatch: recorded {state.get('digest')}, computed {computed}")
        if expected_digest is not None and expected_digest != computed:
            raise DigestError(f"{where}: digest {computed} does not match the manifest's {expected_digest}")
        index = cls(partition=partition, group_size=group_size, capacity=capacity)
        for i, record in enumerate(records):
            if record.group_id in index._groups:
                raise PreflightError(f"{where}: groups[{i}]: duplicate group id {record.group_id!r}")
            dup = [sid for sid in record.sample_ids if sid in index._owner]
            if dup:
                raise PreflightError(f"{where}: groups[{i}]: duplicate sample ids {dup[:8]}")
            index._groups[record.group_id] = record
            index._committed[record.group_id] = None
            index._owner.update((sid, record.group_id) for sid in record.sample_ids)
        if stored_ids is not None:
            _check_inventory(index.stored_sample_ids(), set(stored_ids), where)
        return index


def _check_group(record: GroupRecord, group_size: int, where: str, error: type[Exception] = PreflightError) -> None:
    if not isinstance(record.group_id, str) or not record.group_id:
        raise error(f"{where}: group id must be a non-empty string")
    if len(record.sample_ids) != group_size:
        raise error(f"{where}: has {len(record.sample_ids)} sample ids, the group size is {group_size}")
    if not all(isinstance(s, str) and s for s in record.sample_ids):
        raise error(f"{where}: sample ids must be non-empty strings")
    if len(set(record.sample_ids)) != len(record.sample_ids):
        raise error(f"{where}: duplicate sample ids within the group")


def _record_from(raw: object, group_size: int, where: str) -> GroupRecord:
    if not isinstance(raw, Mapping) or set(raw) != {"group_id", "sample_ids", "meta"}:
        raise PreflightError(f"{where}: must be {{group_id, sample_ids, meta}}")
    ids, meta = raw["sample_ids"], raw["meta"]
    if not isinstance(ids, list) or not isinstance(meta, Mapping):
        raise PreflightError(f"{where}: sample_ids must be a list and meta an object")
    record = GroupRecord(raw["group_id"], tuple(ids), dict(meta), committed=True)
    _check_group(record, group_size, where)
    return record


def inventory_difference(indexed: Collection[str], stored: Collection[str]) -> str | None:
    """How the sample ids the data plane stores differ from the index's, in words; None when they are the same."""
    indexed, stored = set(indexed), set(stored)
    if indexed == stored:
        return None
    extra, missing = sorted(stored - indexed), sorted(indexed - stored)
    return f"{len(extra)} stored but not indexed {extra[:5]}, {len(missing)} indexed but not stored {missing[:5]}"


def _check_inventory(indexed: set[str], stored: set[str], where: str) -> None:
    difference = inventory_difference(indexed, stored)
    if difference is not None:
        raise PreflightError(f"{where}: the data plane's rows differ from the index: {difference}")
