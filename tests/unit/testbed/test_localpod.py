"""A Ray head's driver logs read from its Ray temp dir (hack/testbed/localpod.py `job_driver_logs`), as the tests read
them from a process head's --temp-dir and from a container head's /tmp/ray on this machine. Files only."""

from __future__ import annotations

from pathlib import Path

import localpod


def test_the_driver_logs_of_every_session_are_read_by_file_name_and_nothing_else(tmp_path: Path) -> None:
    for session, name in (("session_1", "job-driver-a1.log"), ("session_2", "job-driver-a2.log")):
        logs = tmp_path / session / "logs"
        logs.mkdir(parents=True)
        (logs / name).write_text(f"{name}: step 5: reward 0.5\n")
        (logs / "raylet.out").write_text("not a driver's\n")
    (tmp_path / "session_latest").symlink_to("/tmp/ray/session_2")  # absolute inside the container: dangling here
    assert localpod.job_driver_logs(tmp_path) == {
        "job-driver-a1.log": "job-driver-a1.log: step 5: reward 0.5\n",
        "job-driver-a2.log": "job-driver-a2.log: step 5: reward 0.5\n",
    }
