"""The local supervisor's reaper: a small process whose only job is to take the supervisor's attempts down with it.
Started by `local.LocalRun.supervise` (`start`), run as `python -m trainingrun_operator.localmode.reaper KEY PREFIX`.
Standard library only.

    trainingrun run ──pipe: the reaper's stdin──► reaper    reads until EOF: the supervisor is gone, by any death
                                                  │         (kill -9 included) or by its own exit
                                                  └─► SIGKILL every process whose KEY starts with PREFIX (the
                                                      supervisor's attempts), until none has been seen for a
                                                      moment, then exit

Why it is needed: the driver dies with the supervisor by itself (PR_SET_PDEATHSIG, `driver_process`), and the
local Ray it started mostly goes with it (Ray gives its GCS and raylet the same signal, and the workers leave with
their raylet), but Ray's per-node agents (the dashboard and runtime-env agents) were seen to live on for more
than 30 s after the driver's SIGKILL, in sessions of their own that no process group reaches. They carry the
attempt's marker, and so do any stragglers. The reaper runs in a session of its own, so the signals that end a
supervisor's process group (Ctrl-C, a closed terminal) do not reach it. Linux only (markers are read from /proc);
elsewhere it finds nothing to kill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from trainingrun_operator.localmode import processes

__all__ = ["Reaper", "main", "start", "sweep"]

QUIET_SECONDS = 1.0
"""A sweep ends once no marked process has been seen for this long (a dying raylet may still start a worker)."""
LIMIT_SECONDS = 60.0
"""... or after this long in all."""


def sweep(
    key: str,
    prefix: str,
    *,
    quiet: float = QUIET_SECONDS,
    limit: float = LIMIT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> list[int]:
    """SIGKILL every process whose `key` starts with `prefix`, again and again until none has been seen for
    `quiet` seconds (or `limit` passed); the pids killed."""
    killed: set[int] = set()
    started = last_seen = clock()
    while clock() - last_seen < quiet and clock() - started < limit:
        found = [pid for pid, value in processes.marked(key).items() if value.startswith(prefix)]
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if found:
            killed.update(found)
            last_seen = clock()
        sleep(0.05)
    return sorted(killed)


@dataclasses.dataclass
class Reaper:
    """The reaper process, and the write end of its stdin (held by the supervisor, never written)."""

    popen: subprocess.Popen[bytes]

    def stop(self, timeout: float = QUIET_SECONDS + 10.0) -> None:
        """The supervisor is done: close the pipe (the reaper sweeps, finds nothing left, and exits), and wait."""
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)


def start(key: str, prefix: str, log_path: pathlib.Path) -> Reaper:
    """Start the reaper of the processes whose `key` starts with `prefix`; it logs what it killed to `log_path`.

    The pipe's write end is not inheritable (PEP 446), so no driver started later holds it open."""
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "trainingrun_operator.localmode.reaper", key, prefix],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Reaper(popen)


def main(argv: list[str]) -> int:
    """Wait for EOF on stdin, then sweep (see the module docstring)."""
    key, prefix = argv
    while sys.stdin.buffer.read(4096):
        pass
    killed = sweep(key, prefix)
    if killed:
        print(f"the supervisor is gone: SIGKILL to {len(killed)} processes marked {prefix}*: {killed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
