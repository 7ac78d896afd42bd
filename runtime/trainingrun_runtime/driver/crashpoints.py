"""Crash points: freeze the process at a named place so a test can SIGKILL it exactly there.

    TRAININGRUN_CRASH_AT="<point>@<step>[~<seconds>][,...]"      e.g. "data_plane_saved@4", "trained@5~4"

Points (in the order a step passes them): `trained` (after the optimizer step, before
the consumed rows are cleared), then in a save `begun`, and at once (the two run side
by side, so either may come first) `policy_saved` (every rank's state copied, its write
begun) and `data_plane_saved` (the barrier window closed, TransferQueue's snapshot
written) with `index_file_written` after it, then `policy_written` (every rank's shard written, in the background
while the next steps train), the bundle's commit stages (`files_synced`, `manifest_written`,
`old_moved`, `renamed`, `parent_synced`, `old_removed`) and `reported`; in each trainer
rank's process, `rank<r>_saved` (rank r wrote its shard of the policy and has not told
the controller yet: killing that process is a rank lost mid-save). The step of a
save's points is the checkpoint's step. On reaching an armed point the process writes
`<marker_dir>/crashed-at-<point>@<step>` and blocks forever; the test waits for that
file and kills the whole process group, which is what a pod kill does. A point armed
with `~<seconds>` holds instead: it writes `<marker_dir>/held-at-<point>@<step>`, sleeps
that long (the whole process stalls, as in a slow step or save) and goes on, so that a
test can act at that moment (a preemption notice during a save). Unarmed
points cost one dict lookup. The spec is read on the driver and handed to the
controller, so it does not depend on environment propagation. Pure standard library.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

__all__ = ["ENV", "CrashPoints"]

ENV = "TRAININGRUN_CRASH_AT"

log = logging.getLogger(__name__)


class CrashPoints:
    """The armed (point, step) pairs and where to drop the marker."""

    def __init__(self, spec: str | None, marker_dir: str | os.PathLike[str]) -> None:
        self.armed: dict[tuple[str, int], float | None] = {}
        """(point, step) -> seconds to hold there, or None to freeze until killed."""
        self.marker_dir = str(marker_dir)
        for item in (spec or "").split(","):
            if item.strip():
                point, _, rest = item.strip().partition("@")
                step, _, hold = rest.partition("~")
                self.armed[(point, int(step))] = float(hold) if hold else None

    @classmethod
    def from_env(cls, marker_dir: str | os.PathLike[str]) -> CrashPoints:
        """Armed from `TRAININGRUN_CRASH_AT` (unset: nothing armed)."""
        return cls(os.environ.get(ENV), marker_dir)

    def reach(self, point: str, step: int) -> None:
        """Freeze here if (point, step) is armed."""
        if (point, step) not in self.armed:
            return
        hold = self.armed[(point, step)]
        marker = Path(self.marker_dir) / f"{'crashed' if hold is None else 'held'}-at-{point}@{step}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(os.getpid()))
        if hold is not None:
            log.warning("crash point %s@%d reached: holding for %g s", point, step, hold)
            time.sleep(hold)
            return
        log.warning("crash point %s@%d reached: freezing until killed", point, step)
        while True:
            time.sleep(3600)
