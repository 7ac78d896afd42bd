"""The head's preemption notice on the full loop (real KubeRay, real driver, our operator as its own process, the pod
runner playing the kubelet's termination: preStop hook, SIGTERM, SIGKILL at the end of the grace period).

- The head evicted through the Eviction API between two periodic saves: its preStop hook asks the driver to save,
  the step it is at is recorded with reason PreemptionNotice, the attempt ends Preempted with stepsLost 0, the next
  attempt resumes from that step, and the run ends with the weights of an uninterrupted run.
A grace period too short for a save is proven in its parts, each once and cheaper: the hook is given the head's
grace period from the spec (tests/unit/operator/test_rayjob.py), a deadline too close saves nothing and leaves no
partial checkpoint (tests/integration/test_save_on_notice.py, real Ray and TransferQueue), a SIGKILL anywhere in a
save leaves the new checkpoint or the previous one (tests/integration/test_checkpointer.py), and the next attempt
resumes from the step recorded before (every resume test).

That a notice arriving while a periodic save is under way is answered by that save (one checkpoint, not two), also
when the operator had already ended the attempt, is the driver's business and is proven once, on real Ray and
TransferQueue, by tests/integration/test_save_on_notice.py; the path from the eviction to the recorded notice
checkpoint, stepsLost 0 and the resume from it, by the first test here.

The runner's cap on grace periods is raised for these tests so that the head gets the grace period its spec asks for.
The moment of each eviction is fixed with a crash point's hold (the driver stops there for some seconds): on a quiet
machine the tiny example trains a step in a fraction of a second, and a run would end before a timed eviction.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

import chaos
from support import journeys, weights
from support.fullloop_runs import head_name, history, run_directory

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py
    from support.uninterrupted import References

pytestmark = pytest.mark.e2e

NOTICE = "PreemptionNotice"


@pytest.fixture
def graceful(loop: Loop) -> Iterator[Loop]:
    """The loop, its pod runner honouring grace periods of up to 60 s (the head's default is 30 s)."""
    cap = loop.bed.runner.grace_cap
    loop.bed.runner.grace_cap = 60.0
    try:
        yield loop
    finally:
        loop.bed.runner.grace_cap = cap


def hold(loop: Loop, run: str, point: str, step: int, *, seconds: float) -> None:
    """Attempt 1 of `run` will stop for `seconds` at crash point `point@step` (it writes a marker and sleeps),
    so that a disruption lands there however fast the steps run on this machine."""
    loop.bed.runner.add_env(
        {"trainingrun.dev/run": run, "trainingrun.dev/attempt": "1"},
        {"TRAININGRUN_CRASH_AT": f"{point}@{step}~{seconds:g}"},
    )


def held(loop: Loop, namespace: str, run: str, point: str, step: int) -> None:
    """Waits until attempt 1's driver holds at `point@step` (see `hold`)."""
    directory = run_directory(loop, namespace, f"{run}-checkpoints", run)
    loop.wait(
        lambda: (directory / "crash-markers" / f"held-at-{point}@{step}").exists(),
        timeout=420,
        what=f"attempt 1 of {run} held at {point}@{step}",
    )


def notice_records(status: dict[str, Any], attempt: int) -> list[dict[str, Any]]:
    return [c for c in history(status) if c["attempt"] == attempt and c.get("reason") == NOTICE]


def test_an_evicted_head_saves_on_the_notice_loses_no_step_and_the_run_ends_as_an_uninterrupted_one(
    graceful: Loop, namespace: str, uninterrupted: References
) -> None:
    loop = graceful
    steps, save_period = 24, 10
    # Attempt 1 holds 15 s after training step 14 (a crash point's hold): the eviction lands between two periodic
    # saves however fast the steps are, and the driver sees the notice at the boundary after the hold.
    hold(loop, "gn", "trained", 14, seconds=15)
    loop.plane.apply(
        loop.checkpoints_pvc("gn-checkpoints"),
        loop.tiny_run("gn", claim="gn-checkpoints", steps=steps, checkpoint={"savePeriod": save_period}),
        namespace=namespace,
    )
    rayjob = loop.wait(
        lambda: loop.plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/gn-a1"),
        timeout=60,
        what="attempt 1's RayJob",
    )
    held(loop, namespace, "gn", "trained", 14)
    reached = 14
    chaos.evict(loop.plane, namespace, head_name(loop, namespace, "gn", 1))
    evicted = time.monotonic()
    saved = loop.wait(
        lambda: notice_records(loop.run_status(namespace, "gn"), 1),
        timeout=60,
        what="the notice's checkpoint recorded",
    )[0]
    notice_to_recorded = time.monotonic() - evicted
    final = loop.wait_phase(namespace, "gn", "Succeeded", timeout=600)
    print(
        f"\nFIGURES eviction_to_recorded_notice_checkpoint_s={notice_to_recorded:.2f} (the driver was held 15 s of it "
        f"at a crash point) notice_step={saved['step']}"
    )

    ended = final["attempts"][0]
    assert ended["reason"] == "Preempted" and ended["stepsLost"] == 0, ended
    assert saved["step"] >= reached
    assert final["attempt"]["number"] == 2 and final["attempt"]["resumedFrom"] == saved["step"], final["attempt"]
    assert f"--resume {saved['step']}" in (
        loop.plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/gn-a2") or {}
    ).get("spec", {}).get("entrypoint", "")
    assert loop.wait_events(namespace, NOTICE), "no PreemptionNotice event"
    latest = final["checkpoints"]["latest"]
    reference = uninterrupted.of_rayjob(rayjob, steps=journeys.REFERENCE_STEPS)
    assert latest["step"] == steps and latest["weightsSha256"] == reference.at(steps)
    assert saved["weightsSha256"] == reference.at(saved["step"]), "the notice's checkpoint holds its step's weights"
    weights.assert_moved(weights.recorded(final))  # the notice's checkpoint among them
    lost = final["goodput"]["lostSeconds"]  # the notice saved every step: the restart is all the eviction cost
    assert lost["restart"] > 0 and lost["recompute"] == 0 and lost["stall"] == 0, final["goodput"]
    assert 0 < final["goodput"]["ratio"] < 1, final["goodput"]
