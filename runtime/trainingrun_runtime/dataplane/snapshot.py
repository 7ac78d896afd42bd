"""TransferQueue's snapshot: written inside the barrier's window, checked before anything loads it, loaded.

    data_plane/                            (a bundle's `data_plane/`; TransferQueue 0.1.11's own layout)
      controller_state.pkl                 the controller's metadata (partitions, tags, consumption)
      metadata.json                        {"storage_saved": true, "user_metadata": {...}} (the caller's values)
      simple_storage/storage_unit_info.json, simple_storage/su_<rank>_<id>.pkl    one `column_file` per unit
      trainingrun_data_plane.json          the snapshot listing: format, TransferQueue version, unit count,
                                           every other file with its size

`write` runs the controller's and the units' checkpoint calls at once (`tq.save_checkpoint` runs them one after
the other) and returns once every file exists at its final size: the units go on writing and hashing their rows
in the background (`storage_unit`), and `PendingSnapshot.digests` waits for their checksums, so the bundle never
reads those files back. `check_dir` holds a snapshot against its listing before any loader sees it (a listing of
format 1, pickled storage units, is refused naming the fix) and reads `controller_state.pkl` through
`unpickling.ControllerUnpickler` (parse only), since TransferQueue's own load unpickles it unrestricted; `load`
is TransferQueue's load, controller and units at once. Checksums are the bundle's job (`storage.verification`).
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Final

from trainingrun_runtime.dataplane import storage_unit, unpickling
from trainingrun_runtime.errors import CheckpointCorrupt, DataPlaneError
from trainingrun_runtime.storage import checksum, files
from trainingrun_runtime.storage.manifest import FileEntry

__all__ = [
    "LISTING",
    "PendingSnapshot",
    "check_dir",
    "concurrently",
    "controller_entry",
    "load",
    "read_user_metadata",
    "unit_entries",
    "write",
]

LISTING: Final = "trainingrun_data_plane.json"
"""The snapshot listing, written into every snapshot: format, TransferQueue version, storage-unit count, every file
with its size."""
_LISTING_FORMAT: Final = 2
"""2: storage units in `column_file` format (3, or 2 without pickled rows; `column_file.read` tells them apart);
1: storage units pickled (refused, naming the fix)."""
_UNIT_DIR: Final = "simple_storage"
_UNIT_INFO: Final = f"{_UNIT_DIR}/storage_unit_info.json"
_METADATA_FILE: Final = "metadata.json"  # the names tq.save_checkpoint / tq.load_checkpoint use (0.1.11)
_CONTROLLER_FILE: Final = "controller_state.pkl"


class PendingSnapshot:
    """A snapshot whose files exist at their final sizes; the storage units are still writing and hashing theirs."""

    def __init__(self, path: Path, sizes: Mapping[str, int], unit_files: Sequence[str],
                 timings: Mapping[str, float] | None = None) -> None:  # fmt: skip
        self.path = path
        self.sizes = dict(sizes)
        """Every file but the sidecar, POSIX path relative to the snapshot directory (what the sidecar lists)."""
        self.unit_files = list(unit_files)
        self.timings = dict(timings or {})
        """Seconds: `controller` and `units` (TransferQueue's two checkpoint calls, from their common start to each
        one's end), `files` (metadata, listing), then `digest_wait` once `digests` has returned (profiling)."""
        self._digests: dict[str, str] | None = None

    def digests(self, timeout_s: float = 300.0) -> dict[str, str]:
        """{relpath: checksum} (`checksum.CURRENT`, BLAKE3) of the storage-unit files, as their units hashed them;
        waits for them.

        Raises DataPlaneError if a unit reports a failure, reports another size than the file
        has, or reports nothing within `timeout_s` (a unit that died).
        """
        if self._digests is not None:
            return dict(self._digests)
        found: dict[str, str] = {}
        started = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        pause = 0.0005
        for rel in self.unit_files:
            side = self.path / f"{rel}{storage_unit.DIGEST_SUFFIX}"
            while not side.exists():
                if time.monotonic() > deadline:
                    raise DataPlaneError(
                        f"{self.path / rel}: its storage unit reported no digest within {timeout_s:g} s"
                    )
                time.sleep(pause)  # a stat every half millisecond: a small snapshot is done in tens of them
                pause = min(pause * 2, 0.001)
            entry = json.loads(side.read_text())
            side.unlink()
            if "error" in entry:
                raise DataPlaneError(f"{self.path / rel}: its storage unit failed to hash it: {entry['error']}")
            if entry.get("size") != self.sizes.get(rel):
                raise DataPlaneError(
                    f"{self.path / rel}: {self.sizes.get(rel)} bytes on disk, "
                    f"its storage unit hashed {entry.get('size')}"
                )
            found[rel] = str(entry[checksum.CURRENT])
        self.timings["digest_wait"] = time.perf_counter() - started
        self._digests = found
        return dict(found)


def write(client: Any, directory: Path, metadata: Mapping[str, Any]) -> PendingSnapshot:
    """Snapshot TransferQueue (through its client) into `directory` (must not exist); returns once every file exists.

    `metadata` (JSON values) is stored with the snapshot and read back by `read_user_metadata`. Callers hold the
    barrier's exclusive window so no mutation runs meanwhile. The storage units go on writing and hashing their
    rows after this returns (`PendingSnapshot.digests` waits for them), so the window includes neither. Files are
    not fsynced here: the bundle commit fsyncs every file after the window closes.
    """
    path = directory.absolute()
    if path.exists():
        raise DataPlaneError(f"{path}: already exists; a snapshot is written into a new directory")
    user = json.loads(json.dumps(dict(metadata), allow_nan=False))
    path.mkdir()
    try:
        controller_s, units_s = concurrently(
            lambda: client.save_controller_checkpoint(str(path / _CONTROLLER_FILE)),
            lambda: client.save_storage_checkpoint(str(path)),
        )
        calls_done = time.perf_counter()
        (path / _METADATA_FILE).write_text(json.dumps({"storage_saved": True, "user_metadata": user}, indent=2))
        units = json.loads((path / _UNIT_INFO).read_text())
        unit_files = [f"{_UNIT_DIR}/su_{u['position']}_{u['storage_unit_id']}.pkl" for u in units]
    except Exception as e:
        shutil.rmtree(path, ignore_errors=True)
        raise DataPlaneError(f"TransferQueue snapshot into {path} failed: {e}") from e
    sizes = {
        p.relative_to(path).as_posix(): p.stat().st_size
        for p in sorted(path.rglob("*"))
        if p.is_file() and not storage_unit.is_digest_file(p.name)
    }
    listing = {
        "format": _LISTING_FORMAT,
        "transferqueue": storage_unit.PINNED_TQ_VERSION,
        "storage_units": len(units),
        "files": sizes,
    }
    (path / LISTING).write_text(json.dumps(listing, sort_keys=True, indent=1) + "\n")
    timings = {"controller": controller_s, "units": units_s, "files": time.perf_counter() - calls_done}
    return PendingSnapshot(path, sizes, unit_files, timings)


def check_dir(
    path: Path, *, storage_units: int | None = None, expected: Mapping[str, FileEntry] | None = None
) -> dict[str, Any]:
    """Check a snapshot directory against its listing before any loader reads it; returns the listing.

    Raises CheckpointCorrupt naming the file and the problem (missing, unlisted, wrong size,
    other TransferQueue version, other storage-unit count, a listing of another format, a controller state
    that references a global it never holds: `unpickling`, which reads it parse-only). With `expected` (the
    bundle manifest's entries of `data_plane/`, by path inside it), each file it reads is read from the
    descriptor its checksum was checked through (`files.open_checked`).
    """
    if not path.is_dir():
        raise CheckpointCorrupt(f"{path}: missing (no data-plane snapshot)")
    side = path / LISTING
    try:
        with _open(path, LISTING, expected) as f:
            listing = json.loads(f.read())
        found_format = listing.get("format")
        sizes = listing["files"]
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{side}: missing") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointCorrupt(f"{side}: unreadable ({e})") from None
    if found_format != _LISTING_FORMAT:
        raise CheckpointCorrupt(
            f"{side}: data-plane snapshot format {found_format!r}, this trainingrun reads format {_LISTING_FORMAT} "
            "only (format 1 pickled the storage units); restore it with the trainingrun version that wrote it, "
            "or resume from a checkpoint written by this version"
        )
    if not isinstance(sizes, dict):
        raise CheckpointCorrupt(f"{side}: unreadable (unexpected layout)")
    if listing.get("transferqueue") != storage_unit.PINNED_TQ_VERSION:
        raise CheckpointCorrupt(
            f"{side}: written by transferqueue {listing.get('transferqueue')}, "
            f"this process runs {storage_unit.PINNED_TQ_VERSION}"
        )
    if storage_units is not None and listing.get("storage_units") != storage_units:
        raise CheckpointCorrupt(
            f"{side}: snapshot has {listing.get('storage_units')} storage units, this TransferQueue {storage_units}"
        )
    files.check_listed(path, sizes, listing=LISTING, unlisted=frozenset({LISTING}))
    for required in (_METADATA_FILE, _CONTROLLER_FILE):
        if required not in sizes:
            raise CheckpointCorrupt(f"{path / required}: missing from the snapshot")
    unpickling.check_controller_state(path / _CONTROLLER_FILE, _entry(path, _CONTROLLER_FILE, expected))
    return dict(listing)


def read_user_metadata(path: Path, expected: Mapping[str, FileEntry] | None = None) -> dict[str, Any]:
    """The `metadata` the snapshot was written with; CheckpointCorrupt naming `metadata.json` if it cannot be read.
    `expected` as in `check_dir`."""
    where = path / _METADATA_FILE
    try:
        with _open(path, _METADATA_FILE, expected) as f:
            return dict(json.loads(f.read())["user_metadata"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointCorrupt(f"{where}: unreadable ({type(e).__name__}: {e})") from None


def _entry(path: Path, rel: str, expected: Mapping[str, FileEntry] | None) -> FileEntry | None:
    """`expected`'s entry of `rel` (None without `expected`); CheckpointCorrupt if `expected` lacks it."""
    if expected is None:
        return None
    if rel not in expected:
        raise CheckpointCorrupt(f"{path / rel}: not in the manifest of this checkpoint")
    return expected[rel]


def _open(path: Path, rel: str, expected: Mapping[str, FileEntry] | None) -> BinaryIO:
    entry = _entry(path, rel, expected)
    return open(path / rel, "rb") if entry is None else files.open_checked(path / rel, entry)


def unit_entries(expected: Mapping[str, FileEntry]) -> dict[str, FileEntry]:
    """`expected`'s entries of the storage units' files, by file name (what a unit's `load_checkpoint` is given)."""
    prefix = _UNIT_DIR + "/"
    return {
        rel[len(prefix) :]: e for rel, e in expected.items() if rel.startswith(prefix) and "/" not in rel[len(prefix) :]
    }


def controller_entry(path: Path, expected: Mapping[str, FileEntry]) -> FileEntry:
    """`expected`'s entry of the controller's state file; CheckpointCorrupt if it has none."""
    entry = _entry(path, _CONTROLLER_FILE, expected)
    assert entry is not None
    return entry


def load(client: Any, path: Path) -> dict[str, float]:
    """TransferQueue's load of a checked snapshot: the units and the controller at once; the seconds from their
    common start to the end of each (`units`, `controller`), for profiling."""
    units_s, controller_s = concurrently(
        lambda: client.load_storage_checkpoint(str(path)),
        lambda: client.load_controller_checkpoint(str(path / _CONTROLLER_FILE)),
    )
    return {"units": units_s, "controller": controller_s}


def concurrently(*calls: Callable[[], object]) -> list[float]:
    """Run blocking TQ calls at once (each waits on a different actor, or the same one for a different thing);
    raise the first failure, after all have ended. Returns the seconds from the start to each call's end."""
    started = time.perf_counter()

    def timed(call: Callable[[], object]) -> float:
        call()
        return time.perf_counter() - started

    with concurrent.futures.ThreadPoolExecutor(len(calls), thread_name_prefix="trainingrun-tq") as pool:
        futures = [pool.submit(timed, call) for call in calls]
        return [future.result() for future in futures]
