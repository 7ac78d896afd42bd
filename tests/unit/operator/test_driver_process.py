"""A local attempt's driver process: its command line, and a kill that reaches every process it started."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from support import waiting
from trainingrun_operator import driver_process, processes


def test_the_command_line_carries_every_argument_the_entrypoint_takes() -> None:
    args = driver_process.DriverArgs(
        run="r",
        attempt=3,
        root="/c",
        config={"trainer": {}},
        resume="20",
        run_uid="u",
        event_log="/e.jsonl",
        progress_period=0.5,
        num_cpus=6,
    )
    argv = args.argv("py")
    assert argv[:3] == ["py", "-m", "trainingrun_runtime"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert flags == {
        "--run": "r",
        "--namespace": "local",
        "--attempt": "3",
        "--resume": "20",
        "--root": "/c",
        "--config-json": '{"trainer":{}}',
        "--reporter": "file",
        "--run-uid": "u",
        "--event-log": "/e.jsonl",
        "--progress-period": "0.5",
        "--num-cpus": "6",
    }
    assert "--run-uid" not in driver_process.DriverArgs(run="r", attempt=1, root="/c", config={}).argv()


def test_killing_an_attempt_kills_every_process_carrying_its_marker_even_in_another_session(
    tmp_path: pathlib.Path,
) -> None:
    marker = f"test-{os.getpid()}-{time.monotonic_ns()}"
    # The "driver" starts a grandchild in a new session, as Ray does with its raylet and workers.
    code = (
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True);"
        "time.sleep(60)"
    )
    log = tmp_path / "driver.log"
    env = {**os.environ, driver_process.MARKER_ENV: marker}
    with open(log, "ab") as out:
        popen = subprocess.Popen([sys.executable, "-c", code], stdout=out, start_new_session=True, env=env)
    proc = driver_process.DriverProcess(1, popen, log, marker)
    waiting.wait(
        lambda: len(processes.carrying(driver_process.MARKER_ENV, marker)) == 2,
        timeout=10,
        what="the driver and its grandchild",
        interval=0.05,
    )
    assert proc.alive()
    proc.kill("ChaosKill")
    proc.wait_gone(timeout=10)
    assert not proc.alive()
    assert processes.carrying(driver_process.MARKER_ENV, marker) == []
    assert proc.killed_by == "ChaosKill"
