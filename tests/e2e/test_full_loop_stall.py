"""The stall watchdog on the full loop (real KubeRay, real driver, our operator as its own process): the driver and
its controller actor are frozen (SIGSTOP) mid-run while the head pod and Ray stay up, as in a deadlock; with a
short `progressDeadlineSeconds` our operator ends the attempt as Stalled, deletes its RayJob (the pod runner kills
the frozen processes with the pod), attempt 2 resumes from the recorded step, and the run succeeds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

import chaos
import localpod
from support.fullloop_runs import run_directory

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = pytest.mark.e2e

DEADLINE = 20
HOLD = 4  # seconds: the moment of the freeze, not its cause (see below)


def test_a_frozen_driver_is_ended_as_stalled_and_attempt_2_resumes_from_the_recorded_step(
    loop: Loop, namespace: str
) -> None:
    # Attempt 1 holds after training step 8, past its first save (step 5), so that the freeze comes mid-run however
    # fast this machine trains. A hold sends no reports either, so it is far shorter than the deadline: without
    # the freeze the driver reports again after HOLD seconds and the attempt never stalls; only the SIGSTOP can
    # make this test pass.
    loop.bed.runner.add_env(
        {"trainingrun.dev/run": "hung", "trainingrun.dev/attempt": "1"},
        {"TRAININGRUN_CRASH_AT": f"trained@8~{HOLD}"},
    )
    run = loop.tiny_run("hung", claim="hung-checkpoints", steps=30, checkpoint={"savePeriod": 5})
    run["spec"]["restartPolicy"]["progressDeadlineSeconds"] = DEADLINE
    loop.plane.apply(loop.checkpoints_pvc("hung-checkpoints"), run, namespace=namespace)
    directory = run_directory(loop, namespace, "hung-checkpoints", "hung")
    loop.wait(lambda: (directory / "crash-markers" / "held-at-trained@8").exists(), timeout=600,
              what="attempt 1 held after step 8, past its first checkpoint")  # fmt: skip
    head = chaos.head_pod(loop.plane, namespace, "trainingrun.dev/run=hung,trainingrun.dev/attempt=1")
    frozen = chaos.freeze_driver(loop.bed.runner, namespace, head["metadata"]["name"])
    frozen_at = time.monotonic()

    status = loop.wait(
        lambda: (lambda s: s if s.get("attempts") else None)(loop.run_status(namespace, "hung")),
        timeout=DEADLINE + 120,
        what="attempt 1's end",
    )
    detected_after = time.monotonic() - frozen_at
    (ended,) = status["attempts"]
    last = status["runtime"]  # the frozen driver's last report, read with the attempt's end
    assert last["attempt"] == 1, last
    assert ended["reason"] == "Stalled", (ended, loop.diagnostics())
    assert f"its last report was step {last['step']} at " in ended["message"], (ended, last)
    assert f"(spec.restartPolicy.progressDeadlineSeconds: {DEADLINE})" in ended["message"], ended
    # Judged from the last report, which came at most a progress period (1 s) and a few polls before the freeze, or,
    # frozen within the hold, at most HOLD seconds before it.
    assert DEADLINE - HOLD - 1 <= detected_after < DEADLINE + 30, detected_after
    # The event is posted after the status patch that ends the attempt: wait for it, do not race it.
    (warning,) = loop.wait_events(namespace, "Stalled")
    assert warning["type"] == "Warning" and f"step {last['step']}" in warning["message"], warning

    final = loop.wait_phase(namespace, "hung", "Succeeded", timeout=600)
    first, second = final["attempts"]
    recorded_by_1 = max(c["step"] for c in final["checkpoints"]["history"] if c["attempt"] == 1)
    assert first["reason"] == "Stalled" and second["reason"] == "Succeeded", final["attempts"]
    assert second["resumedFrom"] == recorded_by_1, (second, final["checkpoints"])
    assert final["restarts"]["stalled"] == 1 and final["restarts"]["total"] == 1, final["restarts"]
    latest = final["checkpoints"]["latest"]
    assert (latest["step"], latest["attempt"]) == (30, 2), latest
    assert localpod.pod_processes(head["metadata"]["uid"]) == [], f"the frozen {frozen} went with their pod"
    lost = final["goodput"]["lostSeconds"]  # the last report to the detection (the end is written to the second)
    assert DEADLINE - HOLD - 2 <= lost["stall"] <= DEADLINE + 30 and lost["restart"] > 0, final["goodput"]
    print(
        f"\nFIGURES stall_deadline_s={DEADLINE} freeze_to_stalled_s={detected_after:.1f} resumed_from={recorded_by_1}"
    )
