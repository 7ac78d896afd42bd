"""A spec.driver program on the full loop (real KubeRay, our operator as its own process, the pod runner playing the
kubelet): manifests/examples/plain-torch.yaml, attached through trainingrun_runtime.sdk, reporting as the head's
ServiceAccount.

- Attempt 1's head is evicted without grace a random time after its first recorded checkpoint (a spot VM gone):
  Preempted, and attempt 2 resumes from the newest recorded step.
- Attempt 2's head is evicted with its grace period (the preStop hook's notice): the program saves the step it
  reached and stops, the checkpoint is recorded with reason PreemptionNotice, stepsLost is 0, and attempt 3
  resumes from it.
- The run ends with the weights and optimizer state of the same spec run uninterrupted (`trainingrun run`),
  bit for bit; no failure budget was spent.
- Its goodput names each cost the journey caused (the first start, the restarts, the steps the kill lost trained
  again, the saves) and no other, and a real Prometheus scraping our operator reads the same figures.
- The TRL example (GRPOTrainer with the SDK's callback), evicted the same two ways, resumes the Trainer from the
  newest recorded step and from the notice's step, and finishes.
- A program that hangs (tests/integration/programs/scripted.py) is ended as Stalled, and one that then crashes
  before any progress spends the failure budget until the run fails.
"""

from __future__ import annotations

import pathlib
import random
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
import torch
import yaml

import binaries
import chaos
import ourop
from support import seeds, waiting
from support.fullloop_runs import head_name, history, run_directory
from support.prometheus import Prometheus

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "plain-torch.yaml"
TRL_EXAMPLE = REPO / "manifests" / "examples" / "trl-grpo.yaml"
SCRIPTED = REPO / "tests" / "integration" / "programs" / "scripted.py"
SEED = 28
STEPS = 20000


def program_run(name: str, claim: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["trainer"]["steps"] = STEPS
    doc["spec"]["checkpoint"]["pvc"]["claimName"] = claim
    doc["spec"]["checkpoint"]["savePeriod"] = 500
    return doc


def recorded_by(status: dict[str, Any], attempt: int) -> list[int]:
    """The steps of `attempt` that the status records now (retention takes old ones out of the history)."""
    return [c["step"] for c in history(status) if c["attempt"] == attempt]


def state(path: pathlib.Path) -> torch.Tensor:
    """Every tensor and number of a state.pt the example wrote, flattened in a fixed order."""
    saved = torch.load(path / "state.pt", weights_only=True)

    def flat(value: Any) -> list[torch.Tensor]:
        if isinstance(value, torch.Tensor):
            return [value.double().flatten()]
        if isinstance(value, dict):
            return [t for key in sorted(value, key=str) for t in flat(value[key])]
        if isinstance(value, list | tuple):
            return [t for item in value for t in flat(item)]
        return [torch.tensor([float(value)], dtype=torch.float64)] if isinstance(value, int | float) else []

    return torch.cat(flat(saved))


def test_a_program_evicted_without_and_with_grace_resumes_from_its_recorded_steps_and_ends_as_an_uninterrupted_run(
    loop: Loop, namespace: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seeds.chosen(request.node, default=SEED))
    assert isinstance(loop.operator, ourop.OperatorProcess)
    target = f"127.0.0.1:{loop.operator.metrics_port}"
    with Prometheus.start(binaries.Binaries.locate().prometheus, [target], tmp_path / "prometheus") as prom:
        prom.wait_for_target_up()
        loop.plane.apply(loop.checkpoints_pvc("pt-checkpoints"), program_run("pt", "pt-checkpoints"),
                         namespace=namespace)  # fmt: skip
        final, by_first, noticed = evicted_twice(loop, namespace, "pt", rng)
        scraped_goodput(prom, namespace, "pt", final["goodput"])

    first, second, third = final["attempts"][:3]
    assert first["reason"] == "Preempted", first
    lost = final["goodput"]["lostSeconds"]  # each cost where the journey caused it, and no other
    assert all(lost[c] > 0 for c in ("start", "restart", "checkpoint")) and lost["stall"] == 0, final["goodput"]
    # The kill came past the newest recorded step; the steps lost are those reported past it (almost always some:
    # a checkpoint's report may land between the look and the kill), trained again at attempt 1's own step time.
    assert (lost["recompute"] > 0) == (first["stepsLost"] > 0), (final["goodput"], first)
    print(f"\nFIGURES goodput={final['goodput']['ratio']} lost={lost} attempt_1_steps_lost={first['stepsLost']}")
    assert final["goodput"]["queuedSeconds"] == 0 and 0 < final["goodput"]["ratio"] < 1, final["goodput"]
    assert by_first and second["resumedFrom"] == max(by_first), (second, by_first)  # the newest recorded by then
    assert (second["reason"], second["stepsLost"], third["resumedFrom"]) == ("Preempted", 0, noticed), (
        second, third, noticed,
    )  # fmt: skip
    assert final["restarts"]["applicationFailure"] == 0 and final["restarts"]["preempted"] == 2

    # The same spec, uninterrupted, on this machine.
    reference = tmp_path / "reference.yaml"
    reference.write_text(yaml.safe_dump(program_run("pt", "unused")))
    done = subprocess.run(
        [sys.executable, "-m", "trainingrun_operator.cli", "run", str(reference), "--root", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    directory = run_directory(loop, namespace, "pt-checkpoints", "pt")
    assert torch.equal(state(directory / f"step_{STEPS}"), state(tmp_path / "local" / "pt" / f"step_{STEPS}")), (
        "the run resumed twice on the cluster ends with other weights than the uninterrupted one"
    )


def scraped_goodput(prom: Prometheus, namespace: str, name: str, goodput: dict[str, Any]) -> None:
    """Prometheus reads the run's goodput gauge and its lost seconds by cause as the final status has them."""
    run = f'namespace="{namespace}",name="{name}"'
    prom.wait_for(f"trainingrun_goodput_ratio{{{run}}}", goodput["ratio"])
    for cause, seconds in goodput["lostSeconds"].items():
        counter = f'trainingrun_lost_seconds_total{{{run},cause="{cause}"}}'
        waiting.wait(lambda c=counter, s=seconds: abs((prom.value(c) or 0.0) - s) < 0.05, timeout=30,
                     what=f"{counter} at {seconds}", diagnostics=prom.diagnostics)  # fmt: skip


def past_recorded(status: dict[str, Any], attempt: int) -> bool:
    """`attempt` reported a step past its newest recorded one."""
    runtime, recorded = status.get("runtime") or {}, recorded_by(status, attempt)
    return bool(recorded) and runtime.get("attempt") == attempt and (runtime.get("step") or 0) > max(recorded)


def evicted_twice(loop: Loop, namespace: str, name: str, rng: random.Random) -> tuple[dict[str, Any], list[int], int]:
    """Evicts attempt 1's head without grace a random moment after its first recorded checkpoint, then attempt 2's
    with grace (the notice) after its first; returns the final status, attempt 1's recorded steps as attempt 2 began,
    and the notice's step."""
    cap = loop.bed.runner.grace_cap
    loop.bed.runner.grace_cap = 60.0  # the head's 30 s grace period, for the notice
    try:
        loop.wait(lambda: recorded_by(loop.run_status(namespace, name), 1), timeout=300,
                  what=f"{name}: attempt 1's first recorded checkpoint")  # fmt: skip
        time.sleep(rng.uniform(0.0, 2.0))  # the random moment of the kill, once attempt 1 reported past a checkpoint
        loop.wait(lambda: past_recorded(loop.run_status(namespace, name), 1), timeout=60,
                  what=f"{name}: attempt 1 past its newest recorded step (the kill loses steps)")  # fmt: skip
        chaos.evict(loop.plane, namespace, head_name(loop, namespace, name, 1), grace_seconds=0)
        during = loop.wait(lambda: (lambda s: s if recorded_by(s, 2) else None)(loop.run_status(namespace, name)),
                           timeout=300, what=f"{name}: attempt 2's first recorded checkpoint")  # fmt: skip
        chaos.evict(loop.plane, namespace, head_name(loop, namespace, name, 2))  # with grace: the notice
        noticed = loop.wait(
            lambda: [c for c in history(loop.run_status(namespace, name)) if c["attempt"] == 2
                     and c.get("reason") == "PreemptionNotice"],
            timeout=120, what=f"{name}: the notice's checkpoint recorded",
        )[0]  # fmt: skip
        final = loop.wait_phase(namespace, name, "Succeeded", timeout=600)
    finally:
        loop.bed.runner.grace_cap = cap
    return final, recorded_by(during, 1), noticed["step"]


def test_the_trl_example_evicted_without_and_with_grace_resumes_the_trainer_from_its_recorded_steps(
    loop: Loop, namespace: str, request: pytest.FixtureRequest
) -> None:
    rng = random.Random(seeds.chosen(request.node, default=SEED))
    doc: dict[str, Any] = yaml.safe_load(TRL_EXAMPLE.read_text())
    doc["metadata"]["name"] = "trl"
    doc["spec"]["trainer"]["steps"] = 300
    doc["spec"]["checkpoint"].update({"savePeriod": 10, "pvc": {"claimName": "trl-checkpoints"}})
    loop.plane.apply(loop.checkpoints_pvc("trl-checkpoints"), doc, namespace=namespace)
    final, by_first, noticed = evicted_twice(loop, namespace, "trl", rng)

    first, second, third = final["attempts"][:3]
    assert first["reason"] == "Preempted" and by_first and second["resumedFrom"] == max(by_first), (first, second)
    assert (second["reason"], second["stepsLost"], third["resumedFrom"]) == ("Preempted", 0, noticed), (second, third)
    directory = run_directory(loop, namespace, "trl-checkpoints", "trl")
    trainer_state = yaml.safe_load((directory / "step_300" / "trainer_state.json").read_text())  # JSON is YAML
    assert trainer_state["global_step"] == 300
    assert final["restarts"]["applicationFailure"] == 0


def test_a_hung_program_is_stalled_and_a_crash_loop_after_it_spends_the_failure_budget(
    loop: Loop, namespace: str
) -> None:
    doc = program_run("hangs", "hangs-checkpoints")
    doc["spec"]["driver"] = {
        "entrypoint": ["python", str(SCRIPTED)],
        "env": [{"name": "SCRIPT", "value": "1:hang,2:crash,3:crash"}],
    }
    doc["spec"]["trainer"]["steps"] = 40
    doc["spec"]["checkpoint"]["savePeriod"] = 3
    doc["spec"]["restartPolicy"] = {
        "failureBudget": 3, "backoff": {"initialSeconds": 0, "maxSeconds": 1, "factor": 1},
        "progressDeadlineSeconds": 5, "startupDeadlineSeconds": 120,
    }  # fmt: skip
    loop.plane.apply(loop.checkpoints_pvc("hangs-checkpoints"), doc, namespace=namespace)
    final = loop.wait_phase(namespace, "hangs", "Failed", timeout=600)

    attempts = final["attempts"]
    assert [a["reason"] for a in attempts] == ["Stalled", "ApplicationFailure", "ApplicationFailure"], attempts
    assert [a.get("resumedFrom") for a in attempts] == [None, 3, 3]  # it hung at step 5; step 3 was recorded
    assert (final["restarts"]["stalled"], final["restarts"]["applicationFailure"]) == (1, 2)
    assert "failure budget exhausted" in final["message"]
