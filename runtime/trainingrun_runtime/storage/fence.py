"""The run directory's owner: one writer per checkpoint directory, even when an old attempt lives on.

    <root>/<run>/owner.json      {"runUid": UID, "attempt": N, "claimed": RFC 3339, "host": ..., "pid": ...}

The operator starts attempt N+1 only after attempt N's pods are gone, but a node cut
off from the API server keeps its processes: attempt N's driver may wake up later and
save on into the same directory, where its retention could delete the step attempt
N+1 restored from, and its `begin()` would clean up N+1's unfinished `tmp_step_*`.
The operator already ignores such a zombie's reports; this file stops its writes.

    driver start  ──► claim(dir, uid, N): refuse if the file names the same run with an attempt > N, else write
    before a save's begin, before its rename, before retention ──► check(dir, uid, N): Superseded if the
                      file names another run, or the same run with an attempt > N

The run's uid (the TrainingRun's metadata.uid; the local backend makes one per run)
tells a new TrainingRun of the same name, which reuses the kept checkpoints and takes
the directory over at its attempt 1, from a zombie of the deleted one.

A superseded driver abandons the save (its own tmp_step_N only) and exits. The check
is not atomic with the rename that follows it (no portable lock works across nodes on
network storage), so the window left is the few milliseconds between the two, against
the whole lifetime of a zombie without it. Attempt numbers only grow, so an equal
number (the same attempt started again on one machine) keeps the claim.

`adopt` moves a run directory of the old layout (`<legacy root>/<run>`, before the namespace level) to its new place,
only if its owner file names this run: on a shared volume, a directory of the same name may be another namespace's.
Pure standard library.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import socket
from pathlib import Path

from trainingrun_runtime import timestamps
from trainingrun_runtime.errors import Superseded, TrainingRunError
from trainingrun_runtime.storage import files

__all__ = ["ADOPTING_SUFFIX", "OWNER_FILE", "Adoption", "Owner", "adopt", "check", "claim", "owner"]

log = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
ADOPTING_SUFFIX = ".adopting"
"""`<legacy root>/<run>.adopting`: a directory on its way into itself (`adopt`; no run name holds a dot)."""


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who owns a run directory: a run (its uid; None when the driver was given none) and its attempt."""

    run_uid: str | None
    attempt: int

    def __str__(self) -> str:
        return f"attempt {self.attempt} of run uid {self.run_uid}"


def owner(run_dir: str | os.PathLike[str]) -> Owner | None:
    """Who owns `run_dir` (None: no claim yet). A damaged owner file names itself and the fix in the error."""
    path = Path(run_dir) / OWNER_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    fix = "it names the attempt that owns the run directory; delete it only if no attempt of this run is alive"
    try:
        data = json.loads(text)
        attempt, uid = data["attempt"], data.get("runUid")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise TrainingRunError(f"{path}: not a valid owner file ({type(e).__name__}: {e}); {fix}") from None
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        raise TrainingRunError(f"{path}: attempt must be an integer >= 0, got {attempt!r}; {fix}")
    if uid is not None and not isinstance(uid, str):
        raise TrainingRunError(f"{path}: runUid must be a string, got {uid!r}; {fix}")
    return Owner(uid, attempt)


def check(run_dir: str | os.PathLike[str], run_uid: str | None, attempt: int, doing: str = "write") -> None:
    """Raise Superseded if another run, or a newer attempt of this run, owns `run_dir`."""
    current = owner(run_dir)
    if current is None:
        return
    if current.run_uid != run_uid:
        raise Superseded(
            f"{current} owns {run_dir}: a TrainingRun of the same name took the directory over (attempt {attempt} "
            f"of run uid {run_uid} was about to {doing}); this driver stops writing checkpoints"
        )
    if current.attempt > attempt:
        raise Superseded(
            f"{current} owns {run_dir} (attempt {attempt} was about to {doing}); this attempt ended and lives on "
            "only because its node lost contact: it stops writing checkpoints"
        )


def claim(run_dir: str | os.PathLike[str], run_uid: str | None, attempt: int) -> None:
    """Make (`run_uid`, `attempt`) the owner of `run_dir` (created if missing).

    Superseded if a newer attempt of the same run owns it already; another run's claim is
    taken over (that TrainingRun was deleted and a new one of the same name reuses its checkpoints).
    """
    directory = Path(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    current = owner(directory)
    if current is not None and current.run_uid == run_uid:
        check(directory, run_uid, attempt, "start")
    record = {
        "runUid": run_uid,
        "attempt": attempt,
        "claimed": timestamps.now(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    files.replace_synced(directory / OWNER_FILE, json.dumps(record).encode())


class Adoption(enum.Enum):
    """What `adopt` did with a run directory of the old layout."""

    MOVED = "moved"
    """It named this run as its owner: it is the run directory now."""
    NOTHING = "nothing"
    """No old directory, or the new one exists already: nothing to adopt."""
    OTHER_OWNER = "other_owner"
    """Another run (maybe of another namespace) owns it: left alone."""
    NO_OWNER = "no_owner"
    """No owner file says whose it is (or the driver has no uid to compare): left alone."""
    UNREADABLE_OWNER = "unreadable_owner"
    """Its owner file is damaged: left alone."""
    HOLDS_RUNS = "holds_runs"
    """Run directories of the new layout live inside it (a namespace of its name): moving it would take them."""


def adopt(legacy: Path, new: Path, run_uid: str | None) -> Adoption:
    """Move the old layout's run directory `legacy` to `new` if `legacy` is this run's (`run_uid`).

    Only when `new` does not exist. A directory left alone is named in a warning, with why and the fix. When `new`
    lies inside `legacy` (a run named as its namespace), `legacy` goes aside to `<legacy>.adopting` first; a start
    after a crash between the two renames finds it there.
    """
    if new.exists():
        return Adoption.NOTHING
    aside = legacy.with_name(legacy.name + ADOPTING_SUFFIX)
    source = aside if aside.is_dir() else legacy
    if not source.is_dir():
        return Adoption.NOTHING
    outcome = _whose(source, new, run_uid)
    if outcome is not Adoption.MOVED:
        return outcome
    if source == legacy and new.is_relative_to(legacy):
        os.rename(legacy, aside)
        files.fsync_dir(legacy.parent)
        source = aside
    created = not new.parent.exists()
    new.parent.mkdir(parents=True, exist_ok=True)
    if created:
        files.fsync_dir(new.parent.parent)
    os.rename(source, new)
    files.fsync_dir(new.parent)
    files.fsync_dir(source.parent)
    log.info("moved the run directory %s of the old layout to %s", source, new)
    return Adoption.MOVED


def _whose(source: Path, new: Path, run_uid: str | None) -> Adoption:
    """MOVED if `source` is this run's to move to `new`, else why not (warned, naming the directory and the fix)."""
    fix = f"move it to {new} by hand if it is this run's"
    try:
        current = owner(source)
    except TrainingRunError as e:
        log.warning("left %s of the old layout alone: %s; %s", source, e, fix)
        return Adoption.UNREADABLE_OWNER
    if current is None or run_uid is None:
        why = "it has no owner file" if current is None else "this driver was given no --run-uid to compare"
        log.warning("left the directory %s of the old layout alone: %s; %s", source, why, fix)
        return Adoption.NO_OWNER
    if current.run_uid != run_uid:
        log.warning(
            "left the directory %s of the old layout alone: %s owns it, not run uid %s (another run of this name, "
            "maybe in another namespace); %s",
            source,
            current,
            run_uid,
            fix,
        )
        return Adoption.OTHER_OWNER
    nested = sorted(e.name for e in os.scandir(source) if e.is_dir() and (Path(e.path) / OWNER_FILE).exists())
    if nested:
        log.warning(
            "left the directory %s of the old layout alone: the run directories %s of a namespace of the same name "
            "live in it; move this run's own files to %s by hand if they are this run's",
            source,
            nested,
            new,
        )
        return Adoption.HOLDS_RUNS
    return Adoption.MOVED
