"""The operator's /metrics read by a real Prometheus (the test bed's pinned build), through PromQL, after a preemption
journey against the real API server (the operator in-process, KubeRay played by the double; see
test_operator_double.py).

The journey: apply; attempt 1 runs, its driver reports a checkpoint at step 10, then step 13 (three steps past
it); a worker pod is evicted; the head is preempted; attempt 2 starts from step 10, runs, and reports step 11
with its checkpoint. What Prometheus must then say: one attempt ended, Preempted; three steps and one worker lost;
two checkpoints recorded; one apply -> first RayJob, one failure -> next RayJob, two start -> first report; the
gauges at attempt 2, Running, checkpoint step 11. Deleting the run removes its series.

The chart's alerts (its PrometheusRule's groups, rendered by helm) are loaded into the same Prometheus and fire for a
run that failed.
"""

from __future__ import annotations

import contextlib
import datetime
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import binaries
from support import chart, dashboards
from support.operator_double import Cluster, InProcessOperator, KubeRayDouble, eventually, phase_is, tiny_run
from support.prometheus import Prometheus
from trainingrun_runtime import timestamps

pytestmark = pytest.mark.cluster


@contextlib.contextmanager
def scraping(
    control_plane: Any, namespace: str, workdir: pathlib.Path, rules: Sequence[dict[str, Any]] = ()
) -> Iterator[tuple[InProcessOperator, Prometheus]]:
    """The operator serving /metrics on a free loopback port, and Prometheus scraping it every second."""
    prometheus = binaries.Binaries.locate().prometheus  # the control plane found it already: never a skip
    operator = InProcessOperator(control_plane.kubeconfig, namespace, metrics_address="127.0.0.1:0").start()
    try:
        assert operator.exporter.port, "the operator serves /metrics once it is ready"
        with Prometheus.start(prometheus, [f"127.0.0.1:{operator.exporter.port}"], workdir, rules) as prom:
            prom.wait_for_target_up()
            yield operator, prom
    finally:
        operator.stop()


@pytest.fixture
def scraped(
    control_plane: Any, namespace: str, tmp_path: pathlib.Path
) -> Iterator[tuple[InProcessOperator, Prometheus]]:
    with scraping(control_plane, namespace, tmp_path / "prometheus") as pair:
        yield pair


def report(cluster: Cluster, attempt: int, step: int, checkpoint: int) -> None:
    """The driver's report: `step` reached, `checkpoint` the newest saved, stamped now (by the driver's clock)."""
    now = timestamps.now()
    cluster.report(
        "tiny",
        attempt=attempt,
        step=step,
        updated=now,
        lastCheckpoint={
            "step": checkpoint,
            "path": f"/checkpoints/tiny/step_{checkpoint}",
            "attempt": attempt,
            "replayDigest": "d" * 64,
            "weightsSha256": "e" * 64,
            "time": now,
        },
    )


def test_prometheus_sees_a_preemption_journey_in_the_counters_histograms_and_gauges(
    cluster: Cluster, kuberay: KubeRayDouble, scraped: tuple[InProcessOperator, Prometheus], namespace: str
) -> None:
    _operator, prom = scraped
    run = f'namespace="{namespace}",name="tiny"'
    spec = tiny_run()
    spec["spec"]["ray"]["workers"] = [{"name": "gen", "replicas": 2}]
    cluster.apply_run(spec)
    kuberay.start("tiny-a1")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="attempt 1 Running")
    prom.wait_for(f'trainingrun_phase{{{run},phase="Running"}}', 1.0)
    # Every series of the run exists at 0 before its first count: increase() below sees the count come.
    prom.wait_for(f'trainingrun_attempts_ended_total{{{run},class="Preempted"}}', 0.0)

    report(cluster, attempt=1, step=10, checkpoint=10)
    eventually(lambda: (cluster.status("tiny").get("checkpoints") or {}).get("latest"), what="checkpoint 10 recorded")
    report(cluster, attempt=1, step=13, checkpoint=10)
    eventually(lambda: cluster.status("tiny").get("progress", "").startswith("13/"), what="step 13 seen")
    lost = kuberay.worker("tiny-a1", "gen", 0)
    kuberay.evict(lost)
    eventually(lambda: cluster.status("tiny")["attempt"].get("workersLost") == 1, what="a worker lost")
    prom.wait_for(f"trainingrun_workers_lost_total{{{run}}}", 1.0)
    prom.wait_for(f"trainingrun_driver_step{{{run}}}", 13.0)

    kuberay.preempt_head("tiny-a1")
    eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2")
    kuberay.start("tiny-a2")
    eventually(lambda: phase_is(cluster, "tiny", "Running"), what="attempt 2 Running")
    report(cluster, attempt=2, step=11, checkpoint=11)
    eventually(lambda: cluster.status("tiny")["checkpoints"]["latest"]["step"] == 11, what="checkpoint 11 recorded")
    status = cluster.status("tiny")
    assert status["attempts"][0]["reason"] == "Preempted" and status["attempts"][0]["stepsLost"] == 3

    # The counters: what happened, each once.
    prom.wait_for(f"trainingrun_checkpoints_recorded_total{{{run}}}", 2.0)
    assert prom.value(f'trainingrun_attempts_ended_total{{{run},class="Preempted"}}') == 1.0
    assert prom.value(f"sum(trainingrun_attempts_ended_total{{{run}}})") == 1.0, "no other attempt ended"
    assert prom.value(f"trainingrun_steps_lost_total{{{run}}}") == 3.0
    assert prom.value(f"trainingrun_workers_lost_total{{{run}}}") == 1.0
    ended = prom.value(f'increase(trainingrun_attempts_ended_total{{{run},class="Preempted"}}[5m])')
    assert ended is not None and ended >= 1.0, ended

    # The histograms: one apply -> first RayJob, one failure -> next RayJob, two starts -> first report.
    apply_to_rayjob = f"trainingrun_first_rayjob_duration_seconds_count{{{run}}}"
    assert prom.value(apply_to_rayjob) == 1.0
    assert prom.value(f"trainingrun_restart_duration_seconds_count{{{run}}}") == 1.0
    prom.wait_for(f"trainingrun_attempt_first_report_duration_seconds_count{{{run}}}", 2.0)
    # The preemption restarts without backoff: well under 30 s, so in the 30 s bucket.
    assert prom.value(f'trainingrun_restart_duration_seconds_bucket{{{run},le="30.0"}}') == 1.0
    for histogram in ("first_rayjob", "restart", "attempt_first_report"):
        total = prom.value(f"trainingrun_{histogram}_duration_seconds_sum{{{run}}}")
        assert total is not None and 0 < total < 60, (histogram, total)
    quantile = prom.value(
        f"histogram_quantile(0.9, sum by (le) (trainingrun_restart_duration_seconds_bucket{{{run}}}))"
    )
    assert quantile is not None and 0 < quantile <= 30, quantile
    passes = prom.value("trainingrun_reconcile_duration_seconds_count")
    assert passes is not None and passes >= 5, passes

    # The gauges: attempt 2, Running, its checkpoint; the phase series say one phase.
    assert prom.value(f"trainingrun_attempt{{{run}}}") == 2.0
    assert prom.value(f"sum(trainingrun_phase{{{run}}})") == 1.0
    assert prom.value(f'trainingrun_phase{{{run},phase="Running"}}') == 1.0
    prom.wait_for(f"trainingrun_checkpoint_step{{{run}}}", 11.0)
    prom.wait_for(f"trainingrun_driver_step{{{run}}}", 11.0)
    age = prom.value(f"trainingrun_checkpoint_age_seconds{{{run}}}")
    assert age is not None and 0 <= age < 60, age
    labels = {key for series, _ in prom.query(f'{{__name__=~"trainingrun_.+",{run}}}') for key in series}
    assert labels == {"__name__", "namespace", "name", "class", "cause", "phase", "le", "instance", "job"}, labels

    # Goodput: status.goodput as the gauge, the counters adding up to its seconds, every cause from the first pass.
    for cause in ("start", "restart", "recompute", "stall", "checkpoint"):
        assert prom.value(f'trainingrun_lost_seconds_total{{{run},cause="{cause}"}}') is not None, cause
    goodput = cluster.status("tiny")["goodput"]
    prom.wait_for(f"trainingrun_goodput_ratio{{{run}}}", goodput["ratio"])
    elapsed, lost = goodput["elapsedSeconds"], sum(goodput["lostSeconds"].values())
    counted = f"trainingrun_elapsed_seconds_total{{{run}}}"
    eventually(lambda: abs((prom.value(counted) or 0.0) - elapsed) < 0.05, what=f"{counted} at {elapsed}")
    counted_lost = f"sum(trainingrun_lost_seconds_total{{{run}}})"
    eventually(lambda: abs((prom.value(counted_lost) or 0.0) - lost) < 0.05, what=f"{counted_lost} at {lost}")

    # Every operator panel of the chart's dashboard is valid PromQL, with data now (the driver's panels need Ray).
    for title, expr in dashboards.expressions():
        if title.startswith("variable ") or any(n.startswith("ray_") for n in dashboards.metric_names(expr)):
            continue
        found = prom.query(dashboards.instantiate(expr, namespace, interval="5m"))
        assert found or title == "Runs not Running", f"dashboard panel {title!r}: no data for {expr}"

    # A deleted run's series go: the next scrape no longer has them, and Prometheus marks them stale.
    cluster.custom.delete_namespaced_custom_object("trainingrun.dev", "v1alpha1", namespace, "trainingruns", "tiny")
    eventually(lambda: not cluster.rayjobs(), what="RayJobs removed on deletion")
    eventually(
        lambda: not prom.query(f'{{__name__=~"trainingrun_.+",{run}}}'),
        timeout=30,
        what="the deleted run's series gone from Prometheus",
    )
    assert prom.value("trainingrun_reconcile_duration_seconds_count"), "the operator's own series stay"


def test_the_first_rayjob_comes_within_seconds_of_the_apply(
    cluster: Cluster, scraped: tuple[InProcessOperator, Prometheus], namespace: str
) -> None:
    """The apply -> first RayJob histogram against the API server's own times: the run's creationTimestamp and the
    RayJob's (both to the second)."""
    _operator, prom = scraped
    created = cluster.apply_run(tiny_run())["metadata"]["creationTimestamp"]
    job = eventually(lambda: cluster.rayjob("tiny-a1"), what="RayJob tiny-a1")
    run = f'namespace="{namespace}",name="tiny"'
    prom.wait_for(f"trainingrun_first_rayjob_duration_seconds_count{{{run}}}", 1.0)
    measured = prom.value(f"trainingrun_first_rayjob_duration_seconds_sum{{{run}}}")
    by_server = timestamps.parse(job["metadata"]["creationTimestamp"]) - timestamps.parse(created)
    assert measured is not None
    assert abs(measured - by_server.total_seconds()) <= 1.0 + 0.5, (measured, by_server)
    assert datetime.timedelta(seconds=measured) < datetime.timedelta(seconds=30)


def test_the_charts_alerts_load_into_prometheus_and_fire_for_a_run_that_failed(
    control_plane: Any, cluster: Cluster, kuberay: KubeRayDouble, namespace: str, tmp_path: pathlib.Path
) -> None:
    """The chart's PrometheusRule (metrics.prometheusRule.enabled), its groups loaded as they are: every rule
    evaluates without error, and a run whose three attempts fail raises TrainingRunFailed and
    TrainingRunAttemptsFailing for that run, with the summaries filled in."""
    rendered = chart.render(control_plane, "alerts", namespace, "--set", "metrics.prometheusRule.enabled=true")
    groups = chart.by_kind(rendered)["PrometheusRule"]["spec"]["groups"]
    with scraping(control_plane, namespace, tmp_path / "prometheus", groups) as (_operator, prom):
        cluster.apply_run(tiny_run())
        for n in (1, 2, 3):
            kuberay.start(f"tiny-a{n}")
            eventually(lambda: phase_is(cluster, "tiny", "Running"), what=f"attempt {n} Running")
            if n == 1:  # a checkpoint: the age series exists from then on
                report(cluster, attempt=1, step=10, checkpoint=10)
                eventually(lambda: (cluster.status("tiny").get("checkpoints") or {}).get("latest"), what="step 10")
            kuberay.fail(f"tiny-a{n}", exit_code=1)
        eventually(lambda: phase_is(cluster, "tiny", "Failed"), what="phase Failed")

        def firing() -> dict[str, dict[str, Any]] | None:
            found = {
                a["labels"]["alertname"]: a
                for a in prom.alerts()
                if a["state"] == "firing" and a["labels"].get("namespace") == namespace
            }
            return found if {"TrainingRunFailed", "TrainingRunAttemptsFailing"} <= found.keys() else None

        alerts = eventually(firing, timeout=60, what=f"the alerts firing\n{prom.diagnostics()}")
        assert alerts["TrainingRunFailed"]["labels"]["severity"] == "critical"
        assert alerts["TrainingRunFailed"]["annotations"]["summary"] == f"TrainingRun {namespace}/tiny failed"
        assert alerts["TrainingRunAttemptsFailing"]["labels"]["class"] == "ApplicationFailure"
        assert "TrainingRunNotRunning" not in alerts and "TrainingRunCheckpointStale" not in alerts
        rules = prom.rules()
        assert len(rules) == 7 and {r["health"] for r in rules} == {"ok"}, rules
        for rule in rules:  # a misspelt series would evaluate "ok" to nothing, for ever
            for name in dashboards.metric_names(rule["query"]):
                assert prom.query(f'{name}{{namespace="{namespace}"}}'), f"{rule['name']}: no series {name}"
