"""One attempt's driver as a local process: `python -m trainingrun_runtime ...` and everything it starts.

    spawn(DriverArgs(...), log_path) ─► a new session; every process it starts (Ray's GCS, raylet, workers,
                                        actors) inherits MARKER_ENV=<marker> in its environment; on Linux the
                                        driver gets SIGKILL when the thread that spawned it dies
    DriverProcess.alive()            ─► any of them still exists (the 'pods' of a local attempt)
    DriverProcess.kill(why)          ─► SIGKILL to the session and to every marked process: what a pod kill does

Ray starts its GCS, raylet and workers in sessions of their own, so the driver's process group alone does not
reach them; the marker does (`processes.carrying`). Used by the local backend (`local`, `trainingrun run`) and
by the tests and benchmarks that start a driver by hand (`tests/support/launcher.py`). Standard library only.

The driver dies with its parent (`bound_to_parent`): a few lines of Python set PR_SET_PDEATHSIG to SIGKILL, check
that the parent is still there (it may have died before the prctl), then exec the driver; the setting survives the
exec. Not `preexec_fn`, which is unsafe in a process with threads (the local supervisor's progress bar has one).
The kernel sends the signal when the *thread* that spawned the driver ends, so spawn from one that lives as long
as the driver should (the supervisor's main thread). The local Ray the driver started runs in sessions of its
own and does not all go with the driver, or not at once: the supervisor's reaper (`reaper.py`) kills every
process that carries the supervisor's markers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from trainingrun_operator.localmode import processes

__all__ = ["MARKER_ENV", "DriverArgs", "DriverProcess", "ProgramArgs", "bound_to_parent", "spawn"]

MARKER_ENV = "TRAININGRUN_LOCAL_ATTEMPT"
"""The environment variable every process of a local attempt carries, so that all of them can be found."""


@dataclasses.dataclass(frozen=True)
class DriverArgs:
    """The driver entrypoint's arguments (`python -m trainingrun_runtime --help`)."""

    run: str
    attempt: int
    root: str
    config: Mapping[str, Any]
    """The RuntimeConfig as JSON values (`{"trainer": ..., "checkpoint": ...}`)."""
    resume: str = "latest"
    fallback: str | None = None
    """Older steps, comma-separated, if `resume` fails verification."""
    manifest_blake3: str | None = None
    """STEP=HEX pairs, comma-separated: the recorded BLAKE3 of the resume and fallback steps' manifests."""
    reporter: str = "file"
    namespace: str = "local"
    run_uid: str | None = None
    event_log: str | None = None
    progress_period: float | None = None
    num_cpus: int | None = None

    def argv(self, python: str = sys.executable) -> list[str]:
        """The command line."""
        argv = [
            python, "-m", "trainingrun_runtime",
            "--run", self.run,
            "--namespace", self.namespace,
            "--attempt", str(self.attempt),
            "--resume", self.resume,
            "--root", self.root,
            "--config-json", json.dumps(dict(self.config), sort_keys=True, separators=(",", ":")),
            "--reporter", self.reporter,
        ]  # fmt: skip
        for flag, value in (("--fallback", self.fallback or None), ("--manifest-blake3", self.manifest_blake3 or None),
                            ("--run-uid", self.run_uid),
                            ("--event-log", self.event_log),
                            ("--progress-period", self.progress_period), ("--num-cpus", self.num_cpus)):  # fmt: skip
            if value is not None:
                argv += [flag, str(value)]
        return argv


@dataclasses.dataclass(frozen=True)
class ProgramArgs:
    """A spec.driver program as an attempt's driver: its command, run where the YAML file is, attached through
    `contract.ATTACH_ENV` (which `spawn` is given in `env`)."""

    run: str
    attempt: int
    root: str
    command: Sequence[str]
    cwd: str | None = None

    def argv(self, python: str = sys.executable) -> list[str]:
        """The command; a leading `python` or `python3` is this Python (the venv's, which has trainingrun)."""
        first, *rest = self.command
        return [python if first in ("python", "python3") else first, *rest]


@dataclasses.dataclass
class DriverProcess:
    """One attempt's driver and every process it started (its session, and all that carry its marker)."""

    attempt: int
    popen: subprocess.Popen[bytes]
    log_path: pathlib.Path
    marker: str
    killed_by: str = ""
    """Set when we killed it: why (the local backend's "ChaosKill" or "Stopped")."""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        """The driver's exit code, or None while it runs."""
        return self.popen.poll()

    def wait(self, timeout: float) -> int:
        """The driver's exit code once it exits; on timeout, kill everything and raise TimeoutError."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill("Timeout")
            raise TimeoutError(f"driver did not exit within {timeout:g} s; log: {self.log_path}") from None

    def alive(self) -> bool:
        """Any process of this attempt still exists."""
        self.popen.poll()  # reap the driver itself, so a dead driver is not counted as a zombie
        if processes.carrying(MARKER_ENV, self.marker):
            return True
        try:
            os.killpg(self.popen.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def kill(self, why: str) -> None:
        """SIGKILL every process of the attempt (no grace: a preempted node gives none either)."""
        self.killed_by = self.killed_by or why
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        for pid in processes.carrying(MARKER_ENV, self.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def wait_gone(self, timeout: float = 30.0) -> None:
        """Wait until the driver is reaped and no process of the attempt is left (after `kill`)."""
        self.popen.wait(timeout)
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"processes of attempt {self.attempt} still alive {timeout:g} s after the kill")
            time.sleep(0.05)

    def output(self) -> str:
        """Everything the driver wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines the driver wrote (from the last 8 KiB)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 8192))
                return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def spawn(
    args: DriverArgs | ProgramArgs,
    log_path: pathlib.Path,
    *,
    marker: str | None = None,
    env: Mapping[str, str] | None = None,
    drop_env: Sequence[str] = (),
) -> DriverProcess:
    """Start the driver in a new session, its output appended to `log_path`; every process it starts is marked.

    The driver inherits this process's environment without the names in `drop_env`, with `env` on top.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # `<run dir>#<owner>#<attempt>`, the shape of `local.marker` too; a driver started by hand is owned by no
    # supervisor (its owner is not a pid), so no re-run of `trainingrun run` takes it for an orphan.
    owner = f"by-hand-{uuid.uuid4().hex[:8]}"
    mark = marker if marker is not None else f"{args.root}/{args.run}#{owner}#{args.attempt}"
    child_env = {k: v for k, v in os.environ.items() if k not in drop_env}  # then `env` on top
    child_env.update(env or {})
    child_env[MARKER_ENV] = mark
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            bound_to_parent(args.argv()),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=child_env,
            cwd=args.cwd if isinstance(args, ProgramArgs) else None,
        )
    return DriverProcess(args.attempt, popen, log_path, mark)


_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, ctypes.c_ulong(signal.SIGKILL))  # PR_SET_PDEATHSIG, kept across exec
if os.getppid() != int(sys.argv[1]):  # the parent died before the prctl: no signal would come
    os.kill(os.getpid(), signal.SIGKILL)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def bound_to_parent(argv: Sequence[str]) -> list[str]:
    """`argv` as a command that gets SIGKILL when the calling thread (of this process) dies: PR_SET_PDEATHSIG, set
    by `python -c` before it execs `argv` (same pid, same environment). Linux only; elsewhere `argv` as it is."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
