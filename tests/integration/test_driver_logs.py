"""The driver's log as a person reads it (`driver.logformat`): a short run of the real driver on real local Ray.

Every line is one event without Ray's context suffix (`job_id=… worker_id=… node_id=… actor_id=… task_id=…`),
the driver's own lines and those its controller actor's process forwards alike, each logged once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from support import launcher

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RUN = "logs"
CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": 4,
        "promptsPerStep": 4,
        "generationWorkers": 1,
        "logEvery": 2,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 64},
    },
    "checkpoint": {"savePeriod": 4, "keepLast": 1},
}
RAY_CONTEXT = re.compile(r"\b(job_id|worker_id|node_id|actor_id|task_id|timestamp_ns)=")
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
CONTROLLER_STEP = re.compile(
    rf"\(SingleController pid=\d+\) {STAMP} INFO trainingrun_runtime\.driver\.controller: "
    r"step 2: reward -?[0-9.]+ loss -?[0-9.]+ clip [0-9.]+"
)
DRIVER_FINISHED = re.compile(
    rf"{STAMP} INFO trainingrun_runtime\.driver\.entrypoint: "
    rf"run {RUN} finished at step 4, weights_sha256 [0-9a-f]{{64}}"
)


def test_every_line_of_the_driver_log_is_one_event_without_rays_context_suffix(tmp_path: Path) -> None:
    proc = launcher.start(run=RUN, attempt=1, root=tmp_path, config=CONFIG, num_cpus=4)
    assert proc.wait(500) == 0, proc.output()[-3000:]
    lines = Path(proc.log_path).read_text().splitlines()

    assert [line for line in lines if RAY_CONTEXT.search(line)] == []
    # The suffix-free lines are the events themselves: a line the controller actor's process logged, forwarded
    # with Ray's plain `(ActorName pid=N)` prefix, and the driver's own last line, once (not once per handler).
    assert [line for line in lines if CONTROLLER_STEP.fullmatch(line)] != [], "\n".join(lines)
    assert len([line for line in lines if DRIVER_FINISHED.fullmatch(line)]) == 1, "\n".join(lines)
