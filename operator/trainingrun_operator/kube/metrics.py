"""The operator's /metrics: what `figures.py` computes, served by prometheus_client on a port of its own.

    Exporter()                          a registry of its own: the series below and the process's own (process_*,
                                        python_*)
    .start("0.0.0.0:8081") -> port      prometheus_client's HTTP server (a thread) on that address; port 0: any
    .passed(namespace, name, uid, old, new, now, created)
                                        after a pass's status write (`reconciler.reconcile`)
    .reconciled(seconds)                one pass's duration (its reads, decision and writes)
    .forget(namespace, name, uid)       the run is deleted: its series go (`handlers.cleanup`)
    .stop()

The series. Labels: namespace and name of the run (the ended attempts add class); never an attempt number or a
pod name, so a run has a fixed number of series, all removed when it is deleted.

    trainingrun_phase{phase}                          1 for the run's phase, 0 for the others
    trainingrun_attempt                               the current attempt's number (0 before the first)
    trainingrun_checkpoint_step                       the newest recorded checkpoint's step       } none before
    trainingrun_checkpoint_age_seconds                its age at the scrape                       } the first
    trainingrun_driver_step                           the driver's newest reported step (status.runtime.step)
    trainingrun_goodput_ratio                         status.goodput.ratio: the share of the run's time (queues
                                                      left out) that went into training it kept
    trainingrun_elapsed_seconds_total                 seconds of the run status.goodput counted (queues left out)
    trainingrun_lost_seconds_total{cause}             seconds of them it counted lost, by cause: start, restart,
                                                      recompute, stall, checkpoint (the goodput of a window:
                                                      1 - increase(lost) / increase(elapsed))
    trainingrun_attempts_ended_total{class}           attempts ended, by class: Preempted, ApplicationFailure,
                                                      InfrastructureFailure, FailedRestore, Stalled (the failure
                                                      classes), Succeeded, Suspended, InvalidSpec
    trainingrun_steps_lost_total                      steps lost with ended attempts (counted once final)
    trainingrun_workers_lost_total                    worker pods lost (each counted once)
    trainingrun_checkpoints_recorded_total            checkpoints recorded in the status
    trainingrun_first_rayjob_duration_seconds         histogram: apply -> first RayJob
    trainingrun_restart_duration_seconds              histogram: an attempt's failure observed -> next RayJob
    trainingrun_attempt_first_report_duration_seconds histogram: attempt start -> its driver's first report
                                                      (Ray's start-up and the restore included)
    trainingrun_reconcile_duration_seconds            histogram, no labels: one reconcile pass

Each run's counters and histograms exist (at 0) from its first pass, so that `increase()` sees its first count.
The counts come from the differences between the status a pass read and the one it wrote (`figures.tally`): a
pass run again counts nothing, and an operator restart starts every counter at 0 again, as Prometheus expects.

Threads: passes run on the operator's event loop, scrapes on the server's threads. The counters and histograms
lock for themselves; the run gauges are frozen `figures.Gauges` in a dict under one lock, turned into samples at
scrape time by a collector (so a checkpoint's age is counted at the scrape).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trainingrun_operator.core import figures, model

__all__ = ["DURATION_BUCKETS", "NAMESPACE", "RECONCILE_BUCKETS", "Exporter", "parse_address"]

NAMESPACE = "trainingrun"
RUN = ("namespace", "name")
DURATION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
"""Apply -> RayJob, failure -> RayJob, start -> first report: a second (a preemption without backoff) to an hour
(a failure backoff's cap is minutes; a large model's restore, more)."""
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_TOMBSTONES = 10_000
"""Deleted runs' uids remembered, so that a pass still in flight at the deletion brings no series back."""
Key = tuple[str, str]


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def parse_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' ('0.0.0.0:8081', '[::]:8081', ':8081' for every address) -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {address!r}: expected HOST:PORT, e.g. 0.0.0.0:8081")
    return host.strip("[]") or "0.0.0.0", int(port)


class _RunGauges(Collector):
    """The run gauges, made at scrape time from the Exporter's `figures.Gauges`."""

    def __init__(self, exporter: Exporter) -> None:
        self.exporter = exporter

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        return self._families(self.exporter.snapshot())

    def _families(self, runs: dict[Key, figures.Gauges]) -> Iterator[Metric]:
        now = self.exporter.clock()
        phase = GaugeMetricFamily(
            f"{NAMESPACE}_phase", "1 for the run's phase (status.phase), 0 for the others.", labels=[*RUN, "phase"]
        )
        attempt = GaugeMetricFamily(
            f"{NAMESPACE}_attempt", "The current attempt's number (0 before the first).", labels=RUN
        )
        step = GaugeMetricFamily(f"{NAMESPACE}_checkpoint_step", "The newest recorded checkpoint's step.", labels=RUN)
        age = GaugeMetricFamily(
            f"{NAMESPACE}_checkpoint_age_seconds",
            "Seconds since the newest recorded checkpoint was written (its manifest's time).",
            labels=RUN,
        )
        driver = GaugeMetricFamily(
            f"{NAMESPACE}_driver_step", "The driver's newest reported step (status.runtime.step).", labels=RUN
        )
        ratio = GaugeMetricFamily(
            f"{NAMESPACE}_goodput_ratio",
            "The share of the run's time (queues left out) that went into training it kept (status.goodput.ratio).",
            labels=RUN,
        )
        for (namespace, name), run in sorted(runs.items()):
            for value in figures.PHASES:
                phase.add_metric([namespace, name, value], 1.0 if run.phase == value else 0.0)
            attempt.add_metric([namespace, name], run.attempt)
            if run.checkpoint_step is not None:
                step.add_metric([namespace, name], run.checkpoint_step)
            if run.checkpoint_time is not None:
                age.add_metric([namespace, name], max(0.0, (now - run.checkpoint_time).total_seconds()))
            if run.driver_step is not None:
                driver.add_metric([namespace, name], run.driver_step)
            if run.goodput_ratio is not None:
                ratio.add_metric([namespace, name], run.goodput_ratio)
        yield from (phase, attempt, step, age, driver, ratio)


class Exporter:
    """The operator's metrics (see the module docstring); one per operator process."""

    def __init__(self, clock: Callable[[], datetime.datetime] = _utc_now) -> None:
        self.clock = clock
        self.registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self._lock = threading.Lock()
        self._runs: dict[Key, figures.Gauges] = {}
        self._memory: dict[Key, figures.Memory] = {}
        self._gone: dict[str, None] = {}  # uids of deleted runs, oldest first
        self.server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        reg = self.registry
        self.attempts_ended = Counter(
            "attempts_ended",
            "Attempts ended, by class (the failure classes, Succeeded, Suspended, InvalidSpec).",
            [*RUN, "class"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.steps_lost = Counter(
            "steps_lost",
            "Steps lost with ended attempts (reached, minus the checkpoint resumed from), counted once final.",
            RUN,
            namespace=NAMESPACE,
            registry=reg,
        )
        self.workers_lost = Counter(
            "workers_lost", "Worker pods lost (each counted once).", RUN, namespace=NAMESPACE, registry=reg
        )
        self.checkpoints_recorded = Counter(
            "checkpoints_recorded", "Checkpoints recorded in the status.", RUN, namespace=NAMESPACE, registry=reg
        )
        self.elapsed_seconds = Counter(
            "elapsed_seconds",
            "Seconds of the run status.goodput counted (queues and suspensions left out).",
            RUN,
            namespace=NAMESPACE,
            registry=reg,
        )
        self.lost_seconds = Counter(
            "lost_seconds",
            "Seconds status.goodput counted lost, by cause (start, restart, recompute, stall, checkpoint).",
            [*RUN, "cause"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.first_rayjob = Histogram(
            "first_rayjob_duration_seconds",
            "Seconds from the run's creation (the apply) to its first RayJob.",
            RUN,
            namespace=NAMESPACE,
            registry=reg,
            buckets=DURATION_BUCKETS,
        )
        self.restart = Histogram(
            "restart_duration_seconds",
            "Seconds from an attempt's failure observed to the next attempt's RayJob (the backoff included).",
            RUN,
            namespace=NAMESPACE,
            registry=reg,
            buckets=DURATION_BUCKETS,
        )
        self.first_report = Histogram(
            "attempt_first_report_duration_seconds",
            "Seconds from an attempt's start to its driver's first report (Ray's start-up and the restore included).",
            RUN,
            namespace=NAMESPACE,
            registry=reg,
            buckets=DURATION_BUCKETS,
        )
        self.reconcile = Histogram(
            "reconcile_duration_seconds",
            "Seconds one reconcile pass took (reads, decision, writes).",
            namespace=NAMESPACE,
            registry=reg,
            buckets=RECONCILE_BUCKETS,
        )
        self.registry.register(_RunGauges(self))
        self._per_run = (self.steps_lost, self.workers_lost, self.checkpoints_recorded, self.elapsed_seconds)
        self._histograms = (self.first_rayjob, self.restart, self.first_report)

    # -- the server

    def start(self, address: str) -> int:
        """Serve the registry on `address` (HOST:PORT) from a thread; returns the port (useful with port 0)."""
        host, port = parse_address(address)
        self.server, self._thread = start_http_server(port, host, registry=self.registry)
        return int(self.server.server_port)

    @property
    def port(self) -> int | None:
        return int(self.server.server_port) if self.server is not None else None

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self.server = self._thread = None

    # -- what the operator reports

    def passed(
        self,
        namespace: str,
        name: str,
        uid: str | None,
        old: model.TrainingRunStatus,
        new: model.TrainingRunStatus,
        now: datetime.datetime,
        created: str | None = None,
    ) -> None:
        """A pass read `old` and wrote `new` at `now` (see `figures.tally`)."""
        key = (namespace, name)
        with self._lock:
            if uid is not None and uid in self._gone:
                return  # deleted meanwhile (a pass in flight at the deletion)
            first = key not in self._runs
            self._runs[key] = figures.gauges(new)
            memory, tally = figures.tally(self._memory.get(key, figures.Memory()), old, new, now, created)
            self._memory[key] = memory
        if first:
            self._zero(namespace, name)
        if tally.ended is not None:
            self.attempts_ended.labels(namespace, name, tally.ended).inc()
        for counter, value in (
            (self.steps_lost, tally.steps_lost),
            (self.workers_lost, tally.workers_lost),
            (self.checkpoints_recorded, tally.checkpoints_recorded),
            (self.elapsed_seconds, tally.elapsed_seconds),
        ):
            if value:
                counter.labels(namespace, name).inc(value)
        for cause, lost in tally.lost_seconds:
            self.lost_seconds.labels(namespace, name, cause).inc(lost)
        for histogram, seconds in (
            (self.first_rayjob, tally.first_rayjob_seconds),
            (self.restart, tally.restart_seconds),
            (self.first_report, tally.first_report_seconds),
        ):
            if seconds is not None:
                histogram.labels(namespace, name).observe(seconds)

    def _zero(self, namespace: str, name: str) -> None:
        """Every series of a run from its first pass, at 0."""
        for cls in figures.CLASSES:
            self.attempts_ended.labels(namespace, name, cls)
        for cause in figures.LOST_CAUSES:
            self.lost_seconds.labels(namespace, name, cause)
        for metric in (*self._per_run, *self._histograms):
            metric.labels(namespace, name)

    def reconciled(self, seconds: float) -> None:
        self.reconcile.observe(seconds)

    def forget(self, namespace: str, name: str, uid: str | None = None) -> None:
        """The run is deleted: remove its series (and ignore a pass of it still in flight)."""
        key = (namespace, name)
        with self._lock:
            if uid is not None:
                self._gone[uid] = None
                while len(self._gone) > MAX_TOMBSTONES:
                    del self._gone[next(iter(self._gone))]
            known = self._runs.pop(key, None) is not None
            self._memory.pop(key, None)
        if not known:
            return
        for metric in (self.attempts_ended, self.lost_seconds, *self._per_run, *self._histograms):
            metric.remove_by_labels({"namespace": namespace, "name": name})

    def snapshot(self) -> dict[Key, figures.Gauges]:
        with self._lock:
            return dict(self._runs)
