"""Start the driver entrypoint as a child process, and kill it the way a pod dies.

    start(...) ─► python -m trainingrun_runtime … in a NEW SESSION (its own process group)
                  └─ the local Ray it starts (GCS, raylet, workers) stays in that group
    kill() ─► SIGKILL to the whole group: driver, Ray and every actor die at once, no cleanup runs

Used by the crash tests, the benchmark and anything that supervises a local run.
Waiting for a crash marker (`crashpoints`) lets a caller kill at an exact point.
Pure standard library (the child imports the heavy modules).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainingrun_runtime.driver import crashpoints

__all__ = ["DriverProcess", "start"]


@dataclasses.dataclass
class DriverProcess:
    """A running driver and where its output goes."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    marker_dir: Path

    def wait(self, timeout: float) -> int:
        """Wait for the driver to exit; on timeout kill the group and raise TimeoutError."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"driver did not exit within {timeout:g} s; log: {self.log_path}") from None

    def wait_for_marker(self, point: str, step: int, timeout: float) -> None:
        """Wait until the driver froze at crash point `point@step`; raise if it exited or took too long."""
        marker = self.marker_dir / f"crashed-at-{point}@{step}"
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"driver exited ({self.proc.returncode}) before {point}@{step}; log: {self.log_path}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{point}@{step} not reached within {timeout:g} s; log: {self.log_path}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the driver's whole process group (what a pod kill does) and reap the driver."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        wait_group_gone(self.proc.pid)

    def output(self) -> str:
        """Everything the driver wrote so far."""
        return self.log_path.read_text(errors="replace")


def wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Wait until no process of group `pgid` is left (killed children are reaped by init)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def start(
    *,
    run: str,
    attempt: int,
    root: str | os.PathLike[str],
    config: Mapping[str, Any],
    resume: str = "latest",
    reporter: str = "file",
    event_log: str | os.PathLike[str] | None = None,
    crash_at: str | None = None,
    num_cpus: int = 8,
    env: Mapping[str, str] | None = None,
    progress_period: float | None = None,
    run_uid: str | None = None,
) -> DriverProcess:
    """Launch `python -m trainingrun_runtime` for one attempt; output goes to ROOT/RUN/attempts/N/driver.log."""
    run_path = Path(root) / run
    log_path = run_path / "attempts" / str(attempt) / "driver.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "trainingrun_runtime", "--run", run, "--attempt", str(attempt), "--resume", resume,
        "--root", str(root), "--config-json", json.dumps(dict(config)), "--reporter", reporter,
        "--num-cpus", str(num_cpus),
    ]
    if event_log is not None:
        cmd += ["--event-log", str(event_log)]
    if progress_period is not None:
        cmd += ["--progress-period", str(progress_period)]
    if run_uid is not None:
        cmd += ["--run-uid", run_uid]
    child_env = {**os.environ, **(env or {})}
    child_env.pop(crashpoints.ENV, None)
    child_env.pop("RAY_ADDRESS", None)
    if crash_at:
        child_env[crashpoints.ENV] = crash_at
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
    return DriverProcess(proc=proc, log_path=log_path, marker_dir=run_path / "crash-markers")
