"""A component of the test bed: one process in its own process group, on a free loopback port, logging to a file,
that dies with its parent and is stopped at interpreter exit.

Who uses it: `controlplane.ControlPlane` (spawns etcd, the API server, the controllers and kwok as `Process`es;
`stop_on_exit`), `kuberay` and the chaos controls (a `Process` to stop or kill), `podrunner` (ports and
`die_with_parent` for the Ray pods it starts), `localpod` and the tests (`tail` of a log, `free_port`).

How nothing outlives a test process:
    stopped on purpose     Process.stop(): SIGTERM to the group, SIGKILL after `timeout`
    interpreter exit       atexit, and SIGTERM/SIGHUP where nobody else handles them (`stop_on_exit`)
    parent killed outright PR_SET_PDEATHSIG (`die_with_parent`), set in the child before it runs the binary

Standard library only.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import random
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


def free_port() -> int:
    """A free loopback port from the kernel's ephemeral range (outside Ray's worker range 10002-19999)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RAY_WORKER_PORTS_END = 20000
"""Ray's default worker ports are 10002-19999; the ports the pod runner gives its Ray pods start above them."""


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range (what a bind to port 0, or an outgoing connection, is given)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def bindable(port: int) -> bool:
    """Whether a listening socket can take 127.0.0.1:`port` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pod_ports(count: int, *, ephemeral: tuple[int, int] | None = None) -> list[int]:
    """`count` distinct free loopback ports for one Ray pod, between Ray's worker ports and the kernel's ephemeral
    range. A port from `free_port` can be handed out again by the kernel between its choice and Ray's bind (Ray's
    own processes bind port 0 and connect out by the dozen while a pod starts: a head then failed to bind its client
    port, and kept failing on every restart); the kernel never hands out a port below its ephemeral range. Falls back
    to `free_port` when that range starts too low to leave room."""
    low = RAY_WORKER_PORTS_END
    high = (ephemeral or ephemeral_range())[0]
    if high - low < 1000:
        return [free_port() for _ in range(count)]
    chosen: list[int] = []
    for _ in range(100 * count):
        port = random.randrange(low, high)
        if port not in chosen and bindable(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"no {count} free loopback ports in {low}-{high - 1}")


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A preexec_fn that sets PR_SET_PDEATHSIG(`sig`), so no child outlives a test process killed outright.
    SIGKILL for the components (a kube-apiserver whose etcd is gone hangs in its graceful shutdown); the pod
    runner's Ray pods get SIGTERM."""

    def preexec() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)
        except OSError:
            pass

    return preexec


def tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a log file, or "(no log)"."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Process:
    """One component, running in its own process group, logging to a file in the run directory."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    stopped: bool = False  # stopped on purpose (a test killing a node's kwok), so not a crash

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        return tail(self.log_path, lines)

    def stop(self, timeout: float = 10.0) -> None:
        self.stopped = True
        if self.popen.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


class OneProcess:
    """A controller of the bed that runs as one `Process` once started (KubeRay's operator, Kueue)."""

    process: Process | None

    def stop(self) -> None:
        """Stops the process (what it made stays in the API server; nothing acts on it any more)."""
        if self.process is not None:
            self.process.stop()

    def log_tail(self, lines: int = 15) -> str:
        """The end of its log, each line cut to 400 characters (controllers log long JSON lines)."""
        if self.process is None:
            return "(not started)"
        return "\n".join(line[:400] for line in self.process.log_tail(lines).splitlines())


class Stoppable(Protocol):
    """What the exit handlers stop: an owner of components (a `ControlPlane`), hashable by identity."""

    def stop(self) -> None: ...


_LIVE: set[Stoppable] = set()
_handlers_installed = False


def stop_on_exit(owner: Stoppable) -> None:
    """Stops `owner` at interpreter exit, or on SIGTERM/SIGHUP, unless `forget(owner)` came first."""
    _install_exit_handlers()
    _LIVE.add(owner)


def forget(owner: Stoppable) -> None:
    """`owner` stopped by itself: the exit handlers leave it alone."""
    _LIVE.discard(owner)


def _stop_live() -> None:
    for owner in list(_LIVE):
        owner.stop()


def _on_fatal_signal(signum: int, _frame: object) -> None:
    _stop_live()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_exit_handlers() -> None:
    """atexit always; SIGTERM/SIGHUP only where nobody else handles them. SIGINT stays Python's
    KeyboardInterrupt, which unwinds through fixtures and context managers to `stop()`."""
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_stop_live)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_fatal_signal)
