"""A pod as the pod runner plays it: the record of one pod's local Ray (`LocalPod`), and finding and signalling
every process it started.

Who uses it: `podrunner.PodRunner` (which creates and tends these records), `chaos` (kill the driver, freeze or
end a zombie) and the tests (a pod's processes, ports, logs). Standard library plus `processes.carrying`.

Every process of a pod carries POD_MARKER=<pod uid> in its environment: Ray starts its GCS, raylet and workers in
sessions of their own, so the `ray start` process group alone does not find them all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import components
import mountpoints
import raystart
from trainingrun_operator.localmode import processes

POD_MARKER = "TRUN_TESTBED_POD"


@dataclass(eq=False)
class LocalPod:
    """One pod this runner plays: its identity, its process and what it was given."""

    uid: str
    namespace: str
    name: str
    node: str
    role: str  # head | worker
    cluster: str
    container: str
    restart_policy: str
    grace_seconds: float
    directory: Path  # HOME, logs, kubeconfig
    temp_dir: Path  # Ray's --temp-dir (short)
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    process: subprocess.Popen[bytes] | None = None
    # pending -> starting (Ray launched) -> ready (Ray answers) -> exited, or backoff -> starting (a restart);
    # a failed start -> exited; any state -> killing -> killed; detached: a partitioned node's processes, left
    # running and no longer tended (killed only when the runner stops)
    state: str = "pending"
    restarts: int = 0
    exit_code: int | None = None
    started_at: str = ""
    restart_after: float = 0.0
    routes: dict[str, int] = field(default_factory=dict)  # proxy authority -> local port
    mountpoints: list[Path] = field(default_factory=list)
    # what the Ray container was started with, for its preStop hook (set at each launch)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    binds: list[mountpoints.Bind] = field(default_factory=list)
    pre_stop: list[str] | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def log_path(self) -> Path:
        return self.directory / f"ray-{self.restarts}.log"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.ports[raystart.GCS_PORT]}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[raystart.DASHBOARD_PORT]}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def job_driver_logs(self) -> dict[str, str]:
        """Ray's per-job driver logs (`job-driver-<submission id>.log`) from this head's session, by file name."""
        return job_driver_logs(self.temp_dir)

    def log_tail(self, lines: int = 30) -> str:
        return components.tail(self.log_path, lines)


def job_driver_logs(ray_temp_dir: Path) -> dict[str, str]:
    """Ray's per-job driver logs (`job-driver-<submission id>.log`) under a Ray temp dir (its sessions), by file
    name: a process head's `--temp-dir`, or a container head's /tmp/ray as seen from this machine."""
    return {
        path.name: path.read_text(errors="replace")
        for path in sorted(ray_temp_dir.glob("session_*/logs/job-driver-*.log"))
    }


def pod_processes(uid: str) -> list[int]:
    """Every process whose environment carries this pod's marker (the Ray processes a pod's `ray start` spawned)."""
    return processes.carrying(POD_MARKER, uid)


def signal_pod(uid: str, leader: subprocess.Popen[bytes] | None, sig: int) -> int:
    """Sends `sig` to every process carrying the pod's marker, and to the process group of its `ray start` while
    that leader is not yet reaped (after that its pid, hence the group id, may belong to someone else). Returns
    how many were signalled."""
    count = 0
    if leader is not None and leader.poll() is None:
        try:
            os.killpg(leader.pid, sig)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pod_processes(uid):
        try:
            os.kill(pid, sig)
            count += 1
        except ProcessLookupError:
            pass
    return count


def kill_all(uid: str, leader: subprocess.Popen[bytes] | None, timeout: float = 5.0) -> bool:
    """SIGKILLs the pod's processes until none is left (new ones may still be forking) or `timeout` passes;
    returns whether none is left."""
    deadline = time.monotonic() + timeout
    while signal_pod(uid, leader, signal.SIGKILL) or pod_processes(uid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
