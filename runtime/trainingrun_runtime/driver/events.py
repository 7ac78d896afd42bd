"""The event log: the order in which setup and the controller built and did things.

    driver setup:  run_dir_moved (an old-layout run directory adopted, if any), driver_started, run_dir_claimed,
                   checkpoints_set_aside (if any), checkpoint_selected, data_read (spec.trainer.data's rows and
                   fingerprint, if any), ray_started, tq_started,
                   tq_restored | tq_fresh, policy_loaded, generators_ready, actor_created
    controller:    client_connected, buffer_built, index_restored, pumps_started, step_done (per step, with
                   the mean reward), checkpoint_committed (with the seconds from the save's begin to its commit),
                   generator_lost, generator_replaced, finished

Each event is one JSON line appended (O_APPEND, one write) to a file shared by the
driver and the controller actor, with the process id and a wall-clock time. The driver
writes it beside the checkpoints (`default_path`: ROOT/RUN/attempts/N/events.jsonl) unless
told otherwise, so a person (and the goodput benchmark) can read where an attempt's
start-up time went; tests read it to check the restore-before-client ordering. Without a
path, events go only to the debug log. Pure standard library.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "default_path", "read"]

log = logging.getLogger(__name__)


def default_path(root: str | os.PathLike[str], run: str, attempt: int) -> Path:
    """`<root>/<run>/attempts/<attempt>/events.jsonl` (created): where a driver logs its events unless told."""
    path = Path(root) / run / "attempts" / str(attempt) / "events.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class EventLog:
    """Appends named events to `path` (or only logs them when `path` is None); picklable."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = None if path is None else str(path)

    def emit(self, name: str, **fields: Any) -> None:
        """Record one event now."""
        record = {"event": name, "t": time.time(), "pid": os.getpid(), **fields}
        log.debug("event %s", record)
        if self.path is None:
            return
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a log file, in the order they were written."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
