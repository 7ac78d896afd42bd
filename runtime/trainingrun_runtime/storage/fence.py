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
Pure standard library.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

from trainingrun_runtime import timestamps
from trainingrun_runtime.errors import Superseded, TrainingRunError
from trainingrun_runtime.storage import files

__all__ = ["OWNER_FILE", "Owner", "check", "claim", "owner"]

OWNER_FILE = "owner.json"


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
