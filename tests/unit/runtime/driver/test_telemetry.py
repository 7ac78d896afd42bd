"""The driver's metrics (telemetry.py) against a stand-in for `ray.util.metrics`: the names, the run's labels, the
buckets, and what each call records. That they reach Ray's metrics export is tests/integration/test_driver_metrics.py.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from trainingrun_runtime.driver import telemetry


class Recorded:
    """One metric as `ray.util.metrics` would make it, remembering what it was told."""

    def __init__(self, kind: str, name: str, description: str = "", boundaries: Any = None, tag_keys: Any = ()) -> None:
        self.kind, self.name, self.description = kind, name, description
        self.boundaries, self.tag_keys = boundaries, tag_keys
        self.tags: dict[str, str] = {}
        self.values: list[float] = []

    def set_default_tags(self, tags: dict[str, str]) -> None:
        self.tags = dict(tags)

    def observe(self, value: float) -> None:
        self.values.append(value)

    def set(self, value: float) -> None:
        self.values.append(value)

    def inc(self, value: float = 1.0) -> None:
        self.values.append(value)


def fake_api() -> tuple[Any, dict[str, Recorded]]:
    made: dict[str, Recorded] = {}

    def factory(kind: str) -> Any:
        def make(name: str, description: str = "", **kwargs: Any) -> Recorded:
            made[name] = Recorded(kind, name, description, **kwargs)
            return made[name]

        return make

    return SimpleNamespace(Histogram=factory("histogram"), Gauge=factory("gauge"), Counter=factory("counter")), made


def test_the_driver_exports_its_five_figures_labelled_with_the_run() -> None:
    api, made = fake_api()
    telemetry.DriverMetrics("team-a", "tiny", api=api)
    assert {name: m.kind for name, m in made.items()} == {
        "trainingrun_driver_step_duration_seconds": "histogram",
        "trainingrun_driver_checkpoint_save_duration_seconds": "histogram",
        "trainingrun_driver_checkpoint_barrier_window_seconds": "histogram",
        "trainingrun_driver_restore_duration_seconds": "gauge",
        "trainingrun_driver_rollouts": "counter",
    }
    for m in made.values():
        assert re.fullmatch(r"[a-z_]+", m.name) and m.description
        assert m.tag_keys == ("namespace", "name") and m.tags == {"namespace": "team-a", "name": "tiny"}
        if m.kind == "histogram":
            assert m.boundaries == sorted(m.boundaries) and len(set(m.boundaries)) == len(m.boundaries)


def test_each_call_records_its_figure() -> None:
    api, made = fake_api()
    metrics = telemetry.DriverMetrics("ns", "tiny", api=api)
    metrics.step(0.8)
    metrics.step(1.2)
    metrics.checkpoint(save_seconds=2.5, barrier_seconds=0.02)
    metrics.restored(7.0)
    metrics.rollout()
    metrics.rollout()
    assert made["trainingrun_driver_step_duration_seconds"].values == [0.8, 1.2]
    assert made["trainingrun_driver_checkpoint_save_duration_seconds"].values == [2.5]
    assert made["trainingrun_driver_checkpoint_barrier_window_seconds"].values == [0.02]
    assert made["trainingrun_driver_restore_duration_seconds"].values == [7.0]
    assert made["trainingrun_driver_rollouts"].values == [1.0, 1.0]


def test_without_a_ray_worker_the_metrics_record_nothing_and_raise_nothing() -> None:
    """ray.util.metrics outside a Ray worker is a no-op: a controller run without Ray (a unit test) is unaffected."""
    metrics = telemetry.DriverMetrics("ns", "tiny")
    metrics.step(0.1)
    metrics.checkpoint(1.0, 0.01)
    metrics.restored(1.0)
    metrics.rollout()
