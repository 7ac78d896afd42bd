"""The operator's /metrics (metrics.py): the exposition parsed back with prometheus_client's own parser, served over
HTTP on a free port, the series of a deleted run removed, and label sets bounded. What a pass counts is tested in
test_figures.py; the whole loop against a real Prometheus in tests/integration/test_operator_metrics.py."""

from __future__ import annotations

import datetime
import urllib.request
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainingrun_operator.core import figures, model
from trainingrun_operator.kube import metrics

T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
RUN_LABELS = {"namespace", "name"}


def status(**fields: Any) -> model.TrainingRunStatus:
    return model.TrainingRunStatus.model_validate(fields)


STARTED = status(phase="Starting", attempt={"number": 1, "start": "2025-01-01T00:00:00Z"})
CHECKPOINT = {"step": 10, "path": "/c/step_10", "attempt": 1, "time": "2025-01-01T00:00:05Z"}
RUNNING = status(
    phase="Running",
    attempt={"number": 1, "start": "2025-01-01T00:00:00Z"},
    checkpoints={"latest": CHECKPOINT},
    runtime={"attempt": 1, "step": 12, "updated": "2025-01-01T00:00:06Z", "lastCheckpoint": CHECKPOINT},
)
PREEMPTED = status(
    phase="Restarting",
    attempt={
        "number": 1,
        "start": "2025-01-01T00:00:00Z",
        "end": "2025-01-01T00:00:10Z",
        "reason": "Preempted",
        "stepsLost": 2,
    },
    checkpoints={"latest": CHECKPOINT},
    runtime={"attempt": 1, "step": 12, "updated": "2025-01-01T00:00:06Z", "lastCheckpoint": CHECKPOINT},
)


def samples(exporter: metrics.Exporter) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every trainingrun_ sample: (name, labels) -> value."""
    text = generate_latest(exporter.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("trainingrun_")
    }


def value(exporter: metrics.Exporter, series: str, **labels: str) -> float | None:
    return samples(exporter).get((series, frozenset(labels.items())))


def run(namespace: str = "ns", name: str = "tiny") -> dict[str, str]:
    return {"namespace": namespace, "name": name}


def exporter_at(now: datetime.datetime) -> metrics.Exporter:
    return metrics.Exporter(clock=lambda: now)


def test_a_runs_first_pass_brings_every_series_of_the_run_at_zero() -> None:
    exporter = exporter_at(T0)
    exporter.passed("ns", "tiny", "u1", status(), STARTED, T0, "2024-12-31T23:59:59Z")
    for cls in figures.CLASSES:
        assert value(exporter, "trainingrun_attempts_ended_total", **run(), **{"class": cls}) == 0
    for name in ("steps_lost", "workers_lost", "checkpoints_recorded"):
        assert value(exporter, f"trainingrun_{name}_total", **run()) == 0
    assert value(exporter, "trainingrun_first_rayjob_duration_seconds_count", **run()) == 1
    assert value(exporter, "trainingrun_first_rayjob_duration_seconds_sum", **run()) == 1.0
    for histogram in ("restart_duration_seconds", "attempt_first_report_duration_seconds"):
        assert value(exporter, f"trainingrun_{histogram}_count", **run()) == 0
    assert value(exporter, "trainingrun_phase", **run(), phase="Starting") == 1
    assert sum(value(exporter, "trainingrun_phase", **run(), phase=p) or 0 for p in figures.PHASES) == 1
    assert value(exporter, "trainingrun_attempt", **run()) == 1
    assert value(exporter, "trainingrun_checkpoint_step", **run()) is None, "no checkpoint yet: no series"


def test_the_gauges_follow_the_passes_and_the_checkpoints_age_is_counted_at_the_scrape() -> None:
    now = [T0]
    exporter = metrics.Exporter(clock=lambda: now[0])
    exporter.passed("ns", "tiny", "u1", STARTED, RUNNING, T0)
    now[0] = T0 + datetime.timedelta(seconds=65)
    assert value(exporter, "trainingrun_checkpoint_step", **run()) == 10
    assert value(exporter, "trainingrun_checkpoint_age_seconds", **run()) == 60.0
    now[0] = T0 + datetime.timedelta(seconds=125)
    assert value(exporter, "trainingrun_checkpoint_age_seconds", **run()) == 120.0, "no pass needed"
    assert value(exporter, "trainingrun_driver_step", **run()) == 12
    assert value(exporter, "trainingrun_checkpoints_recorded_total", **run()) == 1


def test_an_ended_attempt_is_counted_by_class_and_a_pass_run_again_counts_nothing() -> None:
    exporter = exporter_at(T0)
    exporter.passed("ns", "tiny", "u1", RUNNING, PREEMPTED, T0)
    exporter.passed("ns", "tiny", "u1", PREEMPTED, PREEMPTED, T0)
    assert value(exporter, "trainingrun_attempts_ended_total", **run(), **{"class": "Preempted"}) == 1
    assert value(exporter, "trainingrun_phase", **run(), phase="Restarting") == 1


def test_a_deleted_runs_series_go_and_a_pass_still_in_flight_brings_none_back() -> None:
    exporter = exporter_at(T0)
    exporter.passed("ns", "tiny", "u1", STARTED, RUNNING, T0)
    exporter.passed("ns", "other", "u2", STARTED, RUNNING, T0)
    exporter.reconciled(0.01)
    exporter.forget("ns", "tiny", "u1")
    left = {dict(labels).get("name") for _, labels in samples(exporter)}
    assert "tiny" not in left and "other" in left
    exporter.passed("ns", "tiny", "u1", RUNNING, PREEMPTED, T0)
    assert not any(dict(labels).get("name") == "tiny" for _, labels in samples(exporter))
    exporter.passed("ns", "tiny", "u3", status(), STARTED, T0)  # a new run of the same name
    assert value(exporter, "trainingrun_attempt", **run()) == 1
    assert value(exporter, "trainingrun_reconcile_duration_seconds_count") == 1


def test_labels_are_bounded_to_the_run_the_class_the_cause_the_phase_and_the_bucket() -> None:
    exporter = exporter_at(T0)
    exporter.passed("ns", "tiny", "u1", status(), STARTED, T0, "2024-12-31T23:59:59Z")
    exporter.passed("ns", "tiny", "u1", STARTED, RUNNING, T0)
    exporter.passed("ns", "tiny", "u1", RUNNING, PREEMPTED, T0)
    exporter.reconciled(0.02)
    found = samples(exporter)
    assert {k for _, labels in found for k, _ in labels} == {"namespace", "name", "class", "cause", "phase", "le"}
    per_run = {(name, frozenset(dict(labels).keys())) for name, labels in found}
    assert all(RUN_LABELS <= keys or name.startswith("trainingrun_reconcile_") for name, keys in per_run)


def test_the_server_serves_the_registry_on_the_port_it_was_given() -> None:
    exporter = exporter_at(T0)
    exporter.passed("ns", "tiny", "u1", STARTED, RUNNING, T0)
    port = exporter.start("127.0.0.1:0")
    try:
        assert exporter.port == port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        names = {family.name for family in text_string_to_metric_families(text)}
        assert {"trainingrun_checkpoint_step", "trainingrun_attempts_ended", "process_resident_memory_bytes"} <= names
    finally:
        exporter.stop()
    assert exporter.port is None


@pytest.mark.parametrize(
    ("address", "parsed"),
    [("0.0.0.0:8081", ("0.0.0.0", 8081)), (":9000", ("0.0.0.0", 9000)), ("[::]:8081", ("::", 8081))],
)
def test_the_metrics_address_is_host_and_port(address: str, parsed: tuple[str, int]) -> None:
    assert metrics.parse_address(address) == parsed


@pytest.mark.parametrize("address", ["8081", "host:", "host:http", "host:70000"])
def test_an_address_without_a_port_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        metrics.parse_address(address)
