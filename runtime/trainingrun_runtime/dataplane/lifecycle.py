"""The data plane's life: TransferQueue started, restored or started fresh, attached to, closed: two roles.

The order between the roles is enforced by types, not by statement order::

    driver setup (one process, before the controller actor exists)
      dp = BootstrapDataPlane.start()              # creates TQ (compact units installed, CPU slots checked)
      token, meta = dp.load_checkpoint(dir)        # restore onto a pristine TQ ...
      token = dp.start_fresh()                     # ... or decide explicitly that there is nothing to restore
    controller actor, trainer worker (any other process), later
      cp = ConnectOnlyDataPlane.connect(token)     # attaches; refuses a token this TQ never issued

A `DataPlaneToken` is only ever handed out by `load_checkpoint` / `start_fresh`; its nonce, drawn when the
bootstrap client starts TQ and secret until then, is written into the TQ controller's config at start-up (off
the restore's path), and `connect` checks it there, so a connect-only client cannot exist before the restore
decision was taken on *this* TransferQueue. The bootstrap client refuses data operations until that decision,
and refuses a restore once any operation went through it (a failed restore leaves it dirty). Before loading it
also checks TransferQueue's *global* state (no partitions, no rows, nothing consumed, storage units empty), so a
write by any other client is caught too, and it names what it found.

Pitfalls of TransferQueue 0.1.11 handled here: `tq.init` hangs when Ray lacks free CPU slots (checked first, and
init runs under a timeout); `polling_mode` is on; `tq.close()` is only ever called by the bootstrap client,
because from an attaching process it kills the shared controller; TQ's checkpoint load has no guard and is not
atomic, so the snapshot is checked before it runs (`snapshot.check_dir`), it only ever runs on a pristine TQ,
and a failure poisons the client (the TQ must be restarted).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

import ray

from trainingrun_runtime.dataplane import row_client, snapshot, storage_unit
from trainingrun_runtime.dataplane.row_client import DataPlaneClient, PartitionState
from trainingrun_runtime.dataplane.tq_modules import transfer_queue as tq
from trainingrun_runtime.errors import DataPlaneError, RestoreRefused
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = [
    "BootstrapDataPlane",
    "ConnectOnlyDataPlane",
    "DataPlaneState",
    "DataPlaneToken",
    "Restored",
]

log = logging.getLogger(__name__)

_UNIT_NAME: Final = "TransferQueueStorageUnit#{}"
_TOKEN_KEY: Final = "trainingrun_token"
_MINT: Final = object()


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

    __slots__ = ("decision", "nonce", "source")

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


def _unpickle_token(nonce: str, decision: str, source: str | None) -> DataPlaneToken:
    return DataPlaneToken(nonce, decision, source, _mint=_MINT)


class Restored(NamedTuple):
    """What a restore returns: the token for connect-only clients and the metadata saved with the snapshot."""

    token: DataPlaneToken
    metadata: dict[str, Any]


class BootstrapDataPlane(DataPlaneClient):
    """The trainer's client: creates TransferQueue, is the only one that may restore it, and closes it."""

    def __init__(self, *, _mint: object = None, storage_units: int = 0, conf: Any = None) -> None:
        if _mint is not _MINT:
            raise TypeError("use BootstrapDataPlane.start()")
        super().__init__()
        self._storage_units = storage_units
        self._conf = conf  # TQ's merged config as stored in its controller; the token nonce goes into it
        self._units = [ray.get_actor(_UNIT_NAME.format(rank)) for rank in range(storage_units)]
        self._controller = row_client.controller()  # the one this client created; a restart would be another TQ
        self._token: DataPlaneToken | None = None
        self._nonce = secrets.token_hex(16)
        """This TransferQueue's token nonce: stored in its controller by `start`, handed out in the decision's token."""
        self._poisoned: str | None = None
        self.load_timings: dict[str, float] = {}
        """Seconds per phase of `load_checkpoint` (profiling): `pristine_check` (one round of Ray calls),
        `listing_check` (the snapshot's listing and metadata), then, from their common start, the ends of `units`
        and `controller` (TransferQueue's two load calls); `total`."""

    @classmethod
    def start(
        cls,
        *,
        storage_units: int = 2,
        capacity: int | None = None,
        init_timeout_s: float = 300.0,
        node_id: str | None = None,
    ) -> BootstrapDataPlane:
        """Create TransferQueue in the connected Ray cluster (which must not have one yet).

        Checks that Ray has `1 + storage_units` free CPU slots first (0.1.11's `tq.init`
        otherwise waits forever), installs the storage fix, turns polling mode on.
        `capacity` bounds the rows stored (None: unbounded). `node_id`: the Ray node that holds
        TransferQueue's controller and every storage unit (the head; see `storage_unit.install`).
        """
        if not ray.is_initialized():
            raise DataPlaneError("Ray is not initialized; call ray.init() before starting the data plane")
        if row_client.find_controller() is not None:
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
        if node_id is not None:
            nodes = ray.nodes()  # type: ignore[no-untyped-call]
            on_node = next((n["Resources"].get("CPU", 0.0) for n in nodes if n["NodeID"] == node_id), 0.0)
            if on_node < need:
                raise DataPlaneError(
                    f"TransferQueue's controller and {storage_units} storage units live on the head (Ray node "
                    f"{node_id[:12]}), which has {on_node:g} logical CPUs; they need {need}. Give the head more "
                    "(spec.ray.head.rayStartParams num-cpus; they are logical slots, not cores)"
                )
        storage_unit.install(node_id)
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
        # The first `__ray_call__` into each unit ships the function to it, and the client's first request to
        # TransferQueue's controller opens its socket (it takes several times as long as a later request): pay
        # both now, with the start-up, rather than in the restore (its pristine check; the controller's load, the
        # longest of its calls). Both only read. The nonce goes in now too, so the decision's round of Ray calls
        # is the pristine check alone.
        self._conf[_TOKEN_KEY] = self._nonce  # TQ's merged config (an OmegaConf object, not a dict)
        stored = self._controller.store_config.remote(self._conf)
        self.state()
        self._client.get_partition_list()
        ray.get(stored)
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
            raise DataPlaneError(f"{op}: the bootstrap client must first restore (load_checkpoint) or start_fresh()")

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
        partitions = {pid: row_client.partition_state(pid, snap) for pid, snap in zip(pids, snaps, strict=True) if snap}
        return DataPlaneState(partitions=partitions, storage_keys=dict(zip(names, map(int, units), strict=True)))

    def start_fresh(self) -> DataPlaneToken:
        """Decide that there is nothing to restore; TransferQueue must be pristine. Returns the token."""
        self._claim_decision("start_fresh")
        state = self.state()
        if not state.pristine:
            raise RestoreRefused(f"start_fresh refused: TransferQueue is not pristine: {state.describe()}")
        return self._ready("fresh", None)

    def load_checkpoint(
        self, directory: str | os.PathLike[str], expected: Mapping[str, FileEntry] | None = None
    ) -> Restored:
        """Restore TransferQueue from a snapshot written by `snapshot`; returns (token, metadata).

        Refused (RestoreRefused) once anything went through this client, a failed load
        included, and when TransferQueue's global state is not pristine. The snapshot's
        files are checked against its listing (sizes, TQ version, unit count) before TQ's
        loader sees them; checksums are the caller's job (`verification.open_verified`). With `expected` (the
        bundle manifest's entries of `data_plane/`, by path inside it), every process that reads a file of the
        snapshot (this one, each storage unit, the controller) reads it from the descriptor it checked against
        its entry (`files.open_checked`): a file replaced after the caller's verification is refused, not loaded.
        """
        self._claim_decision("load_checkpoint")
        path = Path(directory).absolute()
        started = time.perf_counter()
        state = self.state()
        if not state.pristine:
            raise RestoreRefused(f"restore from {path} refused: TransferQueue is not pristine: {state.describe()}")
        checked = time.perf_counter()
        snapshot.check_dir(path, storage_units=self._storage_units, expected=expected)
        user = snapshot.read_user_metadata(path, expected)
        if expected is not None:
            units, controller = snapshot.unit_entries(expected), snapshot.controller_entry(path, expected)
            ray.get(
                [u.__ray_call__.remote(_expect_unit_files, units) for u in self._units]
                + [self._controller.__ray_call__.remote(_expect_controller_file, controller)]
            )
        loading = time.perf_counter()
        try:
            ended = snapshot.load(self._client, path)
        except Exception as e:
            self._poisoned = f"a restore from {path} failed half-way; TransferQueue is in an unknown state"
            raise DataPlaneError(f"{self._poisoned}: {e}") from e
        self.load_timings = {
            "pristine_check": checked - started,
            "listing_check": loading - checked,
            "units": ended["units"],
            "controller": ended["controller"],
            "total": time.perf_counter() - started,
        }
        return Restored(self._ready("restored", str(path)), user)

    def close(self) -> None:
        """Shut TransferQueue down (controller and storage units) and wait until it is gone."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        tq.close()
        deadline = time.monotonic() + 60.0
        while row_client.find_controller() is not None:
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

    def _ready(self, decision: str, source: str | None) -> DataPlaneToken:
        """The decision's token: this TransferQueue's nonce (stored at start-up), handed out only here."""
        token = DataPlaneToken(self._nonce, decision, source, _mint=_MINT)
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
        controller = row_client.find_controller()
        if controller is None:
            raise DataPlaneError("no TransferQueue runs in this Ray cluster; the bootstrap client starts it")
        conf = ray.get(controller.get_config.remote())
        issued = None if conf is None else conf.get(_TOKEN_KEY)
        if issued != token.nonce:
            raise DataPlaneError(
                f"{token} was not issued by the TransferQueue running in this Ray cluster"
                + ("" if issued else " (it was not started by a trainingrun bootstrap client)")
            )
        tq.init()  # attaches: a controller exists, so this only builds the client
        self = cls(_mint=_MINT)
        self._client = tq.get_client()
        return self

    def close(self) -> None:
        """Stop using this client. Never calls `tq.close()`: from an attaching process that kills the shared TQ."""
        with self._lock:
            self._closed = True


def _active_key_count(unit: Any) -> int:
    return int(unit.storage_data.active_key_count)


def _expect_unit_files(unit: Any, entries: Mapping[str, FileEntry]) -> None:
    unit.storage_data.expected = dict(entries)


def _expect_controller_file(controller: Any, entry: FileEntry) -> None:
    controller.expected_state = entry


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
