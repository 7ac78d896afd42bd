"""Start the driver entrypoint by hand for a test or a benchmark, kill it the way a pod dies, stop it at a crash point.

    proc = start(run=..., attempt=1, root=..., config={...}, crash_at="data_plane_saved@4")
    proc.wait_for_marker("data_plane_saved", 4, timeout=300)   # frozen exactly there (`driver.crashpoints`)
    proc.kill()                                               # SIGKILL to the driver, its Ray and every actor

A thin layer over the local backend's `trainingrun_operator.localmode.driver_process` (the same command line, the same
marker that reaches every process the driver starts); it adds the crash points and a log per attempt. Output
goes to ROOT/RUN/attempts/N/driver.log.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainingrun_operator.localmode import driver_process
from trainingrun_runtime.driver import crashpoints

__all__ = ["Driver", "start"]


class Driver(driver_process.DriverProcess):
    """A driver started by `start`: a local attempt's process, plus its crash-marker directory."""

    marker_dir: Path

    def wait_for_marker(self, point: str, step: int, timeout: float, *, held: bool = False) -> None:
        """Wait until the driver froze (or, `held`, is holding: `point@step~seconds`) at crash point `point@step`.

        Raises if the driver exited first or took longer than `timeout`."""
        marker = self.marker_dir / f"{'held' if held else 'crashed'}-at-{point}@{step}"
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if self.exit_code() is not None:
                raise RuntimeError(f"driver exited ({self.exit_code()}) before {point}@{step}; log: {self.log_path}")
            if time.monotonic() > deadline:
                self.kill("Timeout")
                raise TimeoutError(f"{point}@{step} not reached within {timeout:g} s; log: {self.log_path}")
            time.sleep(0.05)

    def kill(self, why: str = "Killed") -> None:
        """SIGKILL every process of the attempt and wait until none is left (what a pod kill does)."""
        super().kill(why)
        self.wait_gone()


def start(
    *,
    run: str,
    attempt: int,
    root: str | os.PathLike[str],
    config: Mapping[str, Any],
    resume: str = "latest",
    fallback: str | None = None,
    manifest_blake3: str | None = None,
    reporter: str = "file",
    event_log: str | os.PathLike[str] | None = None,
    crash_at: str | None = None,
    num_cpus: int = 8,
    env: Mapping[str, str] | None = None,
    progress_period: float | None = None,
    run_uid: str | None = None,
) -> Driver:
    """Launch `python -m trainingrun_runtime` for one attempt on a local Ray of its own."""
    args = driver_process.DriverArgs(
        run=run, attempt=attempt, root=str(root), config=config, resume=resume, fallback=fallback,
        manifest_blake3=manifest_blake3, reporter=reporter,
        run_uid=run_uid, event_log=None if event_log is None else str(event_log), progress_period=progress_period,
        num_cpus=num_cpus,
    )  # fmt: skip
    run_path = Path(root) / run
    extra = {**(env or {}), **({crashpoints.ENV: crash_at} if crash_at else {})}
    proc = driver_process.spawn(
        args, run_path / "attempts" / str(attempt) / "driver.log", env=extra, drop_env=(crashpoints.ENV, "RAY_ADDRESS")
    )  # a local Ray of its own
    driver = Driver(proc.attempt, proc.popen, proc.log_path, proc.marker)
    driver.marker_dir = run_path / "crash-markers"
    return driver
