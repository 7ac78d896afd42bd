"""The kopf edge (handlers.py) without a cluster: which triggers wake a run, and what kopf is told to keep."""

from __future__ import annotations

import copy
import inspect
import pathlib
from typing import Any

import pytest
import yaml

from trainingrun_operator import handlers

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"


def tiny(status: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": "tiny", "namespace": "ns", "uid": "u-1", "generation": 1, "resourceVersion": "10"}
    if status is not None:
        doc["status"] = status
    return dict(doc)


async def test_watch_handlers_are_coroutines_and_a_runs_event_wakes_it_only_with_news() -> None:
    # kopf runs plain functions in threads; asyncio.Event must be set on the loop.
    for handler in (handlers.run_changed, handlers.rayjob_changed, handlers.pod_changed, handlers.node_changed):
        assert inspect.iscoroutinefunction(handler), handler.__name__
    memo = handlers.Memo(api=None)  # type: ignore[arg-type]
    event = memo.wakeups.event("ns", "tiny")
    await handlers.run_changed(name="tiny", namespace="ns", body=tiny(), memo=memo)
    assert event.is_set(), "a run no pass has read yet was not woken"
    event.clear()
    memo.wakeups.saw("ns", "tiny", tiny())
    await handlers.run_changed(name="tiny", namespace="ns", body=tiny({"phase": "Running"}), memo=memo)
    assert not event.is_set(), "the operator's own status write woke the run"
    await handlers.run_changed(
        name="tiny", namespace="ns", body=tiny({"runtime": {"attempt": 1, "step": 5}}), memo=memo
    )
    assert event.is_set(), "the driver's report did not wake the run"


def test_kopf_keeps_no_copy_of_the_spec_on_the_run() -> None:
    """kopf's default diffbase storage would patch every new run once more, writing its spec into an annotation."""
    import kopf

    settings = kopf.OperatorSettings()
    handlers.configure(settings=settings)
    storage = settings.persistence.diffbase_storage
    body = kopf.Body(tiny())
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    assert storage.fetch(body=body) is None and not patch
    assert storage.build(body=body) == {}, "no deep copy of every watched object on every event"


async def test_a_deleted_runs_series_go_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainingrun_operator import model, reconciler

    async def finalize(api: Any, namespace: str, name: str) -> list[str]:
        return []

    monkeypatch.setattr(reconciler, "finalize", finalize)
    memo = handlers.Memo(api=None)  # type: ignore[arg-type]
    started = model.TrainingRunStatus.model_validate({"phase": "Starting", "attempt": {"number": 1}})
    memo.metrics.passed("ns", "tiny", "u-1", model.TrainingRunStatus(), started, reconciler.utc_now())
    assert ("ns", "tiny") in memo.metrics.snapshot()
    await handlers.cleanup(name="tiny", namespace="ns", uid="u-1", memo=memo)
    assert memo.metrics.snapshot() == {}
    assert memo.metrics.registry.get_sample_value("trainingrun_attempt", {"namespace": "ns", "name": "tiny"}) is None


def test_a_metrics_port_that_cannot_be_had_stops_the_operator_at_start_up() -> None:
    """kopf retries a startup handler's ordinary error forever: the operator would hang, never reconciling."""
    import socket

    import kopf

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        memo = handlers.Memo(api=None, metrics_address=address)  # type: ignore[arg-type]
        with pytest.raises(kopf.PermanentError, match=f"cannot serve /metrics on {address}"):
            handlers.serve_metrics(memo=memo)
