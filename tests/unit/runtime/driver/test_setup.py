"""Setup's set-aside of steps above a pinned resume point (no Ray: the step before Ray starts)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from support.bundles import save_as
from trainingrun_runtime import config
from trainingrun_runtime.driver import setup
from trainingrun_runtime.sdk import reporting

RUN = "demo"


def options(root: Path, resume: str) -> setup.DriverOptions:
    return setup.DriverOptions(
        run=RUN, namespace="ns", attempt=2, resume=resume, root=str(root), config=config.RuntimeConfig(),
        reporter="file",
    )  # fmt: skip


def test_a_bare_driver_sets_nothing_aside_and_a_supervised_one_what_its_status_does_not_record(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        save_as(tmp_path, RUN, step, attempt=1, run_uid="uid-1")
    reporter = reporting.FileReporter(tmp_path, RUN, 2)
    assert setup._set_aside_orphans(options(tmp_path, "2"), reporter) == []  # no status.json: no supervisor
    status = {"checkpoints": {"latest": {"step": 4}, "history": [{"step": 2}, {"step": 4}]}}
    (tmp_path / RUN / "status.json").write_text(json.dumps(status))
    assert setup._set_aside_orphans(options(tmp_path, "latest"), reporter) == []  # nothing is pinned
    assert setup._set_aside_orphans(options(tmp_path, "2"), reporter) == [6]
    assert sorted(os.listdir(tmp_path / RUN)) == ["orphan_step_6", "status.json", "step_2", "step_4"]
