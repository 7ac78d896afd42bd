"""Progress reports on a real local Ray: a killed attempt's status.runtime shows the step it reached.

The operator derives an attempt's `stepsLost` from `status.runtime.step` (the newest finished step) minus the
newest recorded checkpoint, so the driver must report steps between checkpoints, not only at saves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support import launcher, waiting

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": 8,
        "promptsPerStep": 4,
        "generationWorkers": 1,
        "logEvery": 1,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 64},
    },
    "checkpoint": {"savePeriod": 4, "keepLast": 5},
}


def test_an_attempt_killed_between_checkpoints_has_reported_the_step_it_reached(tmp_path: Path) -> None:
    # Frozen in step 7's optimizer step: steps 5 and 6 finished after the checkpoint of step 4.
    proc = launcher.start(
        run="progress", attempt=1, root=tmp_path, config=CONFIG, crash_at="trained@7", progress_period=0
    )
    try:
        proc.wait_for_marker("trained", 7, timeout=500)
        path = tmp_path / "progress" / "attempts" / "1" / "runtime.json"
        status = waiting.wait(
            lambda: st if (st := json.loads(path.read_text()))["step"] >= 6 else None,
            timeout=30,
            what="status.runtime at step 6",
            diagnostics=path.read_text,
        )
    finally:
        proc.kill()
    assert status["attempt"] == 1 and status["finished"] is False
    assert status["step"] == 6, status
    assert status["lastCheckpoint"]["step"] == 4  # two steps would be lost
    assert (tmp_path / "progress" / "step_4" / "manifest.json").exists()
    assert not (tmp_path / "progress" / "step_8").exists()
