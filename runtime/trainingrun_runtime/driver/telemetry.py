"""The driver's own figures as Ray metrics (`ray.util.metrics`): the Ray node's metrics agent serves them for
Prometheus on Ray's metrics port (`ray start --metrics-export-port`, 8080 under KubeRay), beside Ray's own.

Recorded by the controller actor (`controller.py`, `checkpoints.py`); the restore's duration is measured on the
driver (`setup.py`) and handed to the controller with its arguments. Ray prefixes each name with `ray_` and a
counter's with `_total` too:

    ray_trainingrun_driver_step_duration_seconds               histogram: one train step (advantages, train,
                                                               weight sync)
    ray_trainingrun_driver_checkpoint_save_duration_seconds    histogram: a checkpoint from its begin to its report
    ray_trainingrun_driver_checkpoint_barrier_window_seconds   histogram: the barrier's exclusive window of a save
                                                               (rollouts paused)
    ray_trainingrun_driver_restore_duration_seconds            gauge: this attempt's restore (verification included);
                                                               absent on a fresh start
    ray_trainingrun_driver_rollouts_total                      counter: rollout groups committed (one prompt,
                                                               groupSize samples); rollouts per second is its rate()

Labels: namespace and name of the run; Ray adds its own (SessionName, WorkerId, NodeAddress...), one set per
attempt, since every attempt is a Ray cluster of its own. Ray reports a histogram's observations at their bucket's
midpoint, so a `_sum` is approximate; the buckets and `_count` are exact.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BARRIER_BUCKETS", "SAVE_BUCKETS", "STEP_BUCKETS", "DriverMetrics"]

PREFIX = "trainingrun_driver_"
TAGS = ("namespace", "name")
STEP_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
SAVE_BUCKETS = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]
BARRIER_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


class DriverMetrics:
    """The metrics of one attempt's controller. `api`: `ray.util.metrics` (a stand-in in unit tests)."""

    def __init__(self, namespace: str, run: str, api: Any = None) -> None:
        if api is None:
            from ray.util import metrics as ray_metrics

            api = ray_metrics
        tags = {"namespace": namespace, "name": run}

        def made(metric: Any) -> Any:
            metric.set_default_tags(tags)
            return metric

        self._step = made(
            api.Histogram(
                f"{PREFIX}step_duration_seconds",
                "Seconds one train step took (advantages, train, weight sync).",
                boundaries=STEP_BUCKETS,
                tag_keys=TAGS,
            )
        )
        self._save = made(
            api.Histogram(
                f"{PREFIX}checkpoint_save_duration_seconds",
                "Seconds a checkpoint took from its begin to its report in status.runtime.",
                boundaries=SAVE_BUCKETS,
                tag_keys=TAGS,
            )
        )
        self._barrier = made(
            api.Histogram(
                f"{PREFIX}checkpoint_barrier_window_seconds",
                "Seconds of a checkpoint's exclusive barrier window (rollouts paused).",
                boundaries=BARRIER_BUCKETS,
                tag_keys=TAGS,
            )
        )
        self._restore = made(
            api.Gauge(
                f"{PREFIX}restore_duration_seconds",
                "Seconds this attempt's restore took (checkpoint verification, TransferQueue, policy, rollout state).",
                tag_keys=TAGS,
            )
        )
        self._rollouts = made(
            api.Counter(
                f"{PREFIX}rollouts",
                "Rollout groups committed (one prompt, groupSize samples each).",
                tag_keys=TAGS,
            )
        )

    def step(self, seconds: float) -> None:
        self._step.observe(seconds)

    def checkpoint(self, save_seconds: float, barrier_seconds: float) -> None:
        self._save.observe(save_seconds)
        self._barrier.observe(barrier_seconds)

    def restored(self, seconds: float) -> None:
        self._restore.set(seconds)

    def rollout(self) -> None:
        self._rollouts.inc()
