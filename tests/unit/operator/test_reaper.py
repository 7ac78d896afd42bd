"""The local supervisor's reaper: when the supervisor dies (even by SIGKILL), every process carrying one of its
markers is killed, in whatever session it runs; processes of other supervisors are left alone. Stand-in processes
(`python -c`), no Ray: what is under test is the reaper's reach and timing."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from support import waiting
from trainingrun_operator.localmode import driver_process, processes, reaper

KEY = driver_process.MARKER_ENV

SUPERVISOR = """\
import os, pathlib, subprocess, sys, time
from trainingrun_operator.localmode import reaper
key, prefix, log = sys.argv[1:]
guard = reaper.start(key, prefix, pathlib.Path(log))
for attempt in (1, 2):  # e.g. a driver and a Ray agent it left, each in a session of its own
    env = {**os.environ, key: f"{prefix}{attempt}"}
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True)
print(guard.popen.pid, flush=True)
time.sleep(120)
"""


def marked_with(prefix: str) -> list[int]:
    return sorted(pid for pid, value in processes.marked(KEY).items() if value.startswith(prefix))


def test_when_the_supervisor_is_sigkilled_its_reaper_kills_every_marked_process(tmp_path: pathlib.Path) -> None:
    prefix = f"{tmp_path}#{time.monotonic_ns()}#"
    bystander_marker = f"{tmp_path}#other#1"
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, KEY: bystander_marker}
    )
    log = tmp_path / "reaper.log"
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, KEY, prefix, str(log)], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert supervisor.stdout is not None
        reaper_pid = int(supervisor.stdout.readline())
        waiting.wait(lambda: len(marked_with(prefix)) == 2, timeout=20, what="two marked processes", interval=0.05)
        supervisor.kill()
        supervisor.wait(10)
        killed_at = time.monotonic()
        waiting.wait(lambda: marked_with(prefix) == [], timeout=10, what="no marked process left", interval=0.05)
        assert time.monotonic() - killed_at < 5
        waiting.wait(lambda: not _alive(reaper_pid), timeout=10, what="the reaper's own exit", interval=0.05)
        assert "SIGKILL to 2 processes" in log.read_text()
        assert processes.carrying(KEY, bystander_marker) == [bystander.pid], "another supervisor's process stays"
    finally:
        for pid in marked_with(prefix):
            os.kill(pid, 9)
        bystander.kill()
        bystander.wait(10)


def test_a_supervisor_that_stops_by_itself_leaves_its_reaper_nothing_to_do(tmp_path: pathlib.Path) -> None:
    guard = reaper.start(KEY, f"{tmp_path}#{os.getpid()}#", tmp_path / "reaper.log")
    guard.stop()
    assert guard.popen.returncode == 0
    assert (tmp_path / "reaper.log").read_text() == ""


def test_a_sweep_keeps_killing_until_none_has_been_seen_for_a_while(tmp_path: pathlib.Path) -> None:
    prefix = f"{tmp_path}#{time.monotonic_ns()}#"
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, KEY: prefix})
    started = time.monotonic()
    assert reaper.sweep(KEY, prefix, quiet=0.3) == [late.pid]
    assert late.wait(10) == -9
    assert time.monotonic() - started >= 0.3


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = pathlib.Path(f"/proc/{pid}/stat").read_text().split(") ")[-1]
    return not status.startswith("Z")
