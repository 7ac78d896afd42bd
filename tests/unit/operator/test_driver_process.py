"""A local attempt's driver process: its command line, and a kill that reaches every process it started."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from support import waiting
from trainingrun_operator.localmode import driver_process, processes


def test_the_command_line_carries_every_argument_the_entrypoint_takes() -> None:
    args = driver_process.DriverArgs(
        run="r",
        attempt=3,
        root="/c",
        config={"trainer": {}},
        resume="20",
        fallback="10",
        manifest_blake3=f"10={'a' * 64},20={'b' * 64}",
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
        "--fallback": "10",
        "--manifest-blake3": f"10={'a' * 64},20={'b' * 64}",
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


def test_a_driver_bound_to_its_parent_dies_when_the_parent_is_killed(tmp_path: pathlib.Path) -> None:
    marker = f"bound-{os.getpid()}-{time.monotonic_ns()}"
    # The "supervisor" starts its "driver" bound to itself, in a session of its own, and is then SIGKILLed.
    supervisor = (
        "import os, subprocess, sys, time\n"
        "from trainingrun_operator.localmode import driver_process\n"
        "argv = driver_process.bound_to_parent([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "child = subprocess.Popen(argv, start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, driver_process.MARKER_ENV: marker}
    parent = subprocess.Popen([sys.executable, "-c", supervisor], stdout=subprocess.PIPE, env=env)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    waiting.wait(
        lambda: (
            pathlib.Path(f"/proc/{child}/cmdline").read_bytes()
            == f"{sys.executable}\0-c\0import time; time.sleep(60)\0".encode()
        ),
        timeout=10,
        what="the driver exec'd under its own pid",
        interval=0.05,
    )
    assert processes.carrying(driver_process.MARKER_ENV, marker) == sorted([parent.pid, child])
    parent.kill()
    parent.wait(10)
    waiting.wait(
        lambda: processes.carrying(driver_process.MARKER_ENV, marker) == [],
        timeout=10,
        what="the driver gone with its parent",
        interval=0.05,
    )


def test_a_driver_whose_parent_died_before_the_binding_kills_itself() -> None:
    argv = driver_process.bound_to_parent([sys.executable, "-c", "print('trained on')"])
    parent_arg = argv.index(str(os.getpid()))
    argv[parent_arg] = "1"  # as if this process had died and the child had been handed to init before the prctl
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == -9 and "trained on" not in done.stdout
