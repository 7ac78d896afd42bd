"""The driver's metrics (`driver.telemetry`, through `ray.util.metrics`) reach the metrics export of Ray's node, read
with prometheus_client's parser as Prometheus would scrape it: the real driver on real local Ray with real
TransferQueue.

Attempt 1 runs to its checkpoint at step 4 and freezes there (a crash point after the report): by then it has
timed its steps, counted its rollouts, and timed the save and its barrier window. Attempt 2 resumes from step 4 and
freezes after its first step: it exported how long its restore took. Ray's node (its metrics agent) serves both
while the driver is frozen; the port is the one the driver's `ray_started` event names.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support import launcher, waiting
from trainingrun_runtime.driver import events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PROMPTS = 4
CONFIG: dict[str, Any] = {
    "trainer": {
        "steps": 8,
        "promptsPerStep": PROMPTS,
        "generationWorkers": 1,
        "seed": 3,
        "grpo": {"groupSize": 4},
        "task": {"datasetSize": 48},
    },
    "checkpoint": {"savePeriod": 4, "keepLast": 10},
}
RUN_LABELS = {"namespace": "local", "name": "m"}


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every ray_trainingrun_driver_* sample of the node's export: name -> [(labels, value)]."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return {}
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("ray_trainingrun_driver_"):
                found.setdefault(s.name, []).append((s.labels, s.value))
    return found


def total(samples: dict[str, list[tuple[dict[str, str], float]]], metric: str, **labels: str) -> float:
    return sum(v for series, v in samples.get(metric, []) if labels.items() <= series.items())


def metrics_port(log: Path) -> int:
    started = [e for e in events.read(log) if e["event"] == "ray_started"]
    assert started and started[-1].get("metrics_port"), f"no ray_started event with a metrics port in {log}"
    return int(started[-1]["metrics_port"])


def exported(port: int, metric: str, at_least: float, what: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Ray's export, once `metric` (summed over the run's series) reached `at_least` (Ray exports every few seconds)."""
    return waiting.wait(
        lambda: (lambda s: s if total(s, metric, **RUN_LABELS) >= at_least else None)(scrape(port)),
        timeout=120,
        what=what,
        diagnostics=lambda: f"exported: {sorted(scrape(port))}",
        interval=1.0,
    )


def test_the_drivers_figures_reach_rays_metrics_export(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    first_log = tmp_path / "a1.jsonl"
    proc = launcher.start(run="m", attempt=1, root=root, config=CONFIG, crash_at="reported@4", event_log=first_log)
    try:
        proc.wait_for_marker("reported", 4, timeout=600)
        port = metrics_port(first_log)
        found = exported(port, "ray_trainingrun_driver_checkpoint_save_duration_seconds_count", 1, "the step-4 save")
        steps = total(found, "ray_trainingrun_driver_step_duration_seconds_count", **RUN_LABELS)
        assert steps >= 4, found
        assert total(found, "ray_trainingrun_driver_rollouts_total", **RUN_LABELS) >= 4 * PROMPTS
        assert total(found, "ray_trainingrun_driver_checkpoint_barrier_window_seconds_count", **RUN_LABELS) == 1
        assert total(found, "ray_trainingrun_driver_checkpoint_save_duration_seconds_count", **RUN_LABELS) == 1
        buckets = [
            (float(series["le"]), v)
            for series, v in found["ray_trainingrun_driver_step_duration_seconds_bucket"]
            if RUN_LABELS.items() <= series.items()
        ]
        assert max(v for _, v in buckets) == steps and sorted(buckets) == sorted(buckets, key=lambda b: b[1])
        assert "ray_trainingrun_driver_restore_duration_seconds" not in found, "a fresh start restored nothing"
    finally:
        proc.kill()

    second_log = tmp_path / "a2.jsonl"
    proc = launcher.start(run="m", attempt=2, root=root, config=CONFIG, crash_at="trained@5", event_log=second_log)
    try:
        proc.wait_for_marker("trained", 5, timeout=600)
        port = metrics_port(second_log)
        found = exported(port, "ray_trainingrun_driver_restore_duration_seconds", 1e-9, "attempt 2's restore")
        restore_s = total(found, "ray_trainingrun_driver_restore_duration_seconds", **RUN_LABELS)
        assert 0 < restore_s < 300, restore_s
        selected = [e for e in events.read(second_log) if e["event"] == "checkpoint_selected"]
        assert selected and selected[-1]["step"] == 4
    finally:
        proc.kill()
