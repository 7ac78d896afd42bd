"""The chart's Grafana dashboard (charts/trainingrun/dashboards/trainingrun.json): every PromQL expression reads only
series that exist — the operator's (metrics.py) or the driver's through Ray (driver/telemetry.py) — and the panels
an on-call engineer looks at first are there. tests/integration/test_operator_metrics.py runs each operator panel's
expression against a real Prometheus."""

from __future__ import annotations

import datetime
from types import SimpleNamespace
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from support import dashboards
from trainingrun_operator.core import model
from trainingrun_operator.kube import metrics
from trainingrun_runtime.driver import telemetry

T0 = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


def operator_series() -> set[str]:
    """Every trainingrun_ sample name the operator's /metrics shows for a run with a checkpoint and a report."""
    checkpoint = {"step": 10, "path": "/c/step_10", "attempt": 1, "time": "2025-01-01T00:00:05Z"}
    status = model.TrainingRunStatus.model_validate(
        {
            "phase": "Running",
            "attempt": {"number": 1, "start": "2025-01-01T00:00:00Z"},
            "checkpoints": {"latest": checkpoint},
            "runtime": {"attempt": 1, "step": 12, "lastCheckpoint": checkpoint},
            "goodput": {"ratio": 0.9},
        }
    )
    exporter = metrics.Exporter(clock=lambda: T0)
    exporter.passed("ns", "tiny", "u1", model.TrainingRunStatus(), status, T0)
    exporter.reconciled(0.01)
    text = generate_latest(exporter.registry).decode()
    return {
        s.name for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith("trainingrun_")
    }


def driver_series() -> set[str]:
    """The driver's metrics as Ray's export names them: `ray_` in front, a counter's `_total` behind."""
    made: list[tuple[str, str]] = []

    def factory(kind: str) -> Any:
        def make(name: str, *args: Any, **kwargs: Any) -> Any:
            made.append((kind, name))
            return SimpleNamespace(set_default_tags=lambda tags: None)

        return make

    telemetry.DriverMetrics(
        "ns", "tiny", api=SimpleNamespace(**{k: factory(k) for k in ("Histogram", "Gauge", "Counter")})
    )
    suffixes = {"Histogram": ("_bucket", "_count", "_sum"), "Gauge": ("",), "Counter": ("_total",)}
    return {f"ray_{name}{suffix}" for kind, name in made for suffix in suffixes[kind]}


def test_every_expression_reads_only_series_the_operator_or_the_driver_exports() -> None:
    exported = operator_series() | driver_series()
    found = dashboards.expressions()
    assert len(found) > 10
    for title, expr in found:
        names = dashboards.metric_names(expr)
        assert names, (title, expr)
        assert names <= exported, f"{title}: {sorted(names - exported)} not exported ({expr})"


def test_the_first_questions_have_panels() -> None:
    reads = {title: set().union(*(dashboards.metric_names(e) for t, e in dashboards.expressions() if t == title))
             for title, _ in dashboards.expressions()}  # fmt: skip
    assert "trainingrun_phase" in reads["Runs by phase"]
    assert "trainingrun_checkpoint_age_seconds" in reads["Newest checkpoint's age"]
    assert "trainingrun_steps_lost_total" in reads["Steps lost"]
    assert "trainingrun_attempts_ended_total" in reads["Attempts ended by class"]
    assert reads["Goodput"] == {
        "trainingrun_goodput_ratio",
        "trainingrun_lost_seconds_total",
        "trainingrun_elapsed_seconds_total",
    }
    assert reads["Time lost by cause"] == {"trainingrun_lost_seconds_total"}
    resume = {title for title, names in reads.items() if title.startswith("Time to resume")}
    assert {n for t in resume for n in reads[t]} == {
        "trainingrun_restart_duration_seconds_bucket",
        "trainingrun_attempt_first_report_duration_seconds_bucket",
    }


def test_every_panel_uses_the_datasource_variable_and_fits_the_grid() -> None:
    dashboard = dashboards.load()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboards.panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert all(t["refId"] and t["expr"] for t in panel["targets"]), panel["title"]
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "namespace"}


def test_the_metric_names_of_an_expression() -> None:
    assert dashboards.metric_names(
        'histogram_quantile(0.9, sum by (le) (rate(x_bucket{namespace=~"$namespace",a="sum"}[$__rate_interval])))'
    ) == {"x_bucket"}
    assert dashboards.metric_names("label_values(trainingrun_phase, namespace)") == {"trainingrun_phase"}
    assert dashboards.metric_names('a{phase!="Running"} == 1 and on (name) b offset 5m') == {"a", "b"}
