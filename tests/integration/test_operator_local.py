"""The local backend (local.py) with the real driver: `trainingrun run` on the shipped tiny example with --chaos
(`python -m trainingrun_runtime`: real Ray, TransferQueue, torch; no cluster, hence `integration`, not `e2e`).
The driver is killed at random; the run must resume from its recorded checkpoints and finish, and its status
file must show every attempt and checkpoint."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "tiny.yaml"


def trainingrun(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "trainingrun_operator.cli", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "120"}
    )


@pytest.mark.timeout(1500)
def test_trainingrun_run_with_chaos_resumes_from_recorded_checkpoints_and_finishes(tmp_path: pathlib.Path) -> None:
    result = trainingrun("run", str(EXAMPLE), "--root", str(tmp_path), "--chaos", "--chaos-seed", "3", timeout=1400)
    assert result.returncode == 0, result.stderr[-4000:]

    steps = yaml.safe_load(EXAMPLE.read_text())["spec"]["trainer"]["steps"]
    status = json.loads((tmp_path / "tiny" / "status.json").read_text())
    assert status["phase"] == "Succeeded"
    attempts = status["attempts"]
    assert len(attempts) >= 2, "--chaos killed at least one attempt"
    assert [a["reason"] for a in attempts[:-1]] == ["Preempted"] * (len(attempts) - 1)
    assert attempts[-1]["reason"] == "Succeeded"
    assert status["restarts"]["preempted"] == len(attempts) - 1
    assert status["restarts"]["applicationFailure"] == 0

    recorded = {c["step"] for c in status["checkpoints"]["history"]}
    for attempt in attempts[1:]:
        assert attempt["resumedFrom"] in recorded, f"attempt {attempt['number']} resumed from a recorded checkpoint"
    assert status["checkpoints"]["latest"]["step"] == steps
    assert status["checkpoints"]["latest"]["attempt"] == attempts[-1]["number"]
    assert (tmp_path / "tiny" / f"step_{steps}" / "manifest.json").is_file()
    assert (tmp_path / "tiny" / "reward.png").stat().st_size > 0
    events = [json.loads(line)["reason"] for line in (tmp_path / "tiny" / "events.jsonl").read_text().splitlines()]
    assert "ChaosKill" in events and "Succeeded" in events

    again = trainingrun("run", str(EXAMPLE), "--root", str(tmp_path), timeout=120)
    assert again.returncode == 0 and "already succeeded" in again.stderr
