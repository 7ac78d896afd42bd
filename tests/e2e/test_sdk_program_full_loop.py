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

import chaos
from support import seeds
from support.fullloop_runs import head_name, history, run_directory

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = pytest.mark.e2e

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "plain-torch.yaml"
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
    cap = loop.bed.runner.grace_cap
    loop.bed.runner.grace_cap = 60.0  # the head's 30 s grace period, for the notice
    try:
        loop.plane.apply(loop.checkpoints_pvc("pt-checkpoints"), program_run("pt", "pt-checkpoints"),
                         namespace=namespace)  # fmt: skip
        loop.wait(lambda: recorded_by(loop.run_status(namespace, "pt"), 1), timeout=300,
                  what="attempt 1's first recorded checkpoint")  # fmt: skip
        time.sleep(rng.uniform(0.0, 2.0))  # the random moment of the kill
        chaos.evict(loop.plane, namespace, head_name(loop, namespace, "pt", 1), grace_seconds=0)

        during = loop.wait(lambda: (lambda s: s if recorded_by(s, 2) else None)(loop.run_status(namespace, "pt")),
                           timeout=300, what="attempt 2's first recorded checkpoint")  # fmt: skip
        by_first = recorded_by(during, 1)
        chaos.evict(loop.plane, namespace, head_name(loop, namespace, "pt", 2))  # with grace: the notice
        noticed = loop.wait(
            lambda: [c for c in history(loop.run_status(namespace, "pt")) if c["attempt"] == 2
                     and c.get("reason") == "PreemptionNotice"],
            timeout=120, what="the notice's checkpoint recorded",
        )[0]  # fmt: skip
        final = loop.wait_phase(namespace, "pt", "Succeeded", timeout=600)
    finally:
        loop.bed.runner.grace_cap = cap

    first, second, third = final["attempts"][:3]
    assert first["reason"] == "Preempted", first
    assert by_first and second["resumedFrom"] == max(by_first), (second, by_first)  # the newest recorded by then
    assert (second["reason"], second["stepsLost"], third["resumedFrom"]) == ("Preempted", 0, noticed["step"]), (
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
