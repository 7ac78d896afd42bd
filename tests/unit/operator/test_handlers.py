"""The kopf edge (handlers.py) without a cluster: which triggers wake a run, what kopf is told to keep, and how
a run's daemon outlives a pass that fails."""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import pathlib
import time
from collections.abc import Coroutine
from typing import Any

import kopf
import pytest
import yaml

from trainingrun_operator.core import errors
from trainingrun_operator.kube import handlers, reconciler

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
    from trainingrun_operator.core import model
    from trainingrun_operator.kube import reconciler

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


# ------------------------------------------------------------------------------------------- the daemon


class Stopped:
    """kopf's `stopped` flag as a daemon sees it: false until set, and awaitable with wait()."""

    def __init__(self) -> None:
        self.flag = asyncio.Event()

    def __bool__(self) -> bool:
        return self.flag.is_set()

    def wait(self) -> Coroutine[Any, Any, bool]:
        return self.flag.wait()


class EventsApi:
    """The one Api method the daemon calls itself: post_event; every attempt lands in `posted`, in order."""

    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal = refusal
        self.posted: asyncio.Queue[tuple[str, str, str, str]] = asyncio.Queue()

    async def post_event(self, run: Any, type_: str, reason: str, message: str) -> None:
        self.posted.put_nowait((f"{run['metadata']['namespace']}/{run['metadata']['name']}", type_, reason, message))
        if self.refusal is not None:
            raise self.refusal


def failing_passes(monkeypatch: pytest.MonkeyPatch, stopped: Stopped, *failures: BaseException) -> list[float | None]:
    """reconciler.reconcile raises `failures` one pass after the other, then succeeds and stops the daemon;
    returns the `not_before` of every pass, as they happen."""
    passes: list[float | None] = []

    async def reconcile(*args: Any, not_before: float | None = None, **kwargs: Any) -> float | None:
        passes.append(not_before)
        if len(passes) <= len(failures):
            raise failures[len(passes) - 1]
        stopped.flag.set()
        return None

    monkeypatch.setattr(reconciler, "reconcile", reconcile)
    return passes


async def next_event(api: EventsApi, daemon: asyncio.Task[None]) -> tuple[str, str, str, str]:
    """The next event the daemon posts; fails at once if the daemon ended first."""
    posted = asyncio.ensure_future(api.posted.get())
    await asyncio.wait({posted, daemon}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if not posted.done():
        posted.cancel()
        pytest.fail(f"no event posted; the daemon: {daemon!r}")
    return posted.result()


def start(api: EventsApi, stopped: Stopped) -> tuple[handlers.Memo, asyncio.Task[None]]:
    memo = handlers.Memo(api=api)  # type: ignore[arg-type]
    body = kopf.Body(tiny())
    daemon = asyncio.create_task(
        handlers.supervise(name="tiny", namespace="ns", body=body, memo=memo, stopped=stopped)  # type: ignore[arg-type]
    )
    return memo, daemon


async def test_a_pass_that_raises_any_exception_is_logged_posted_as_a_warning_and_retried_with_backoff(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=handlers.__name__)
    stopped = Stopped()
    passes = failing_passes(monkeypatch, stopped, KeyError("checkpoints"), RuntimeError("boom"))
    api = EventsApi()
    memo, daemon = start(api, stopped)
    delays = []
    for expected in (KeyError, RuntimeError):
        run, type_, reason, message = await next_event(api, daemon)
        failed_at = time.monotonic()
        assert (run, type_, reason) == ("ns/tiny", "Warning", "FailedToReconcile")
        assert message.startswith(f"reconcile failed unexpectedly ({expected.__name__}: "), message
        delays.append(message.rpartition("retrying in ")[2])
        memo.wakeups.wake("ns", "tiny")  # the next pass now, rather than at the backoff's end
    await asyncio.wait_for(daemon, timeout=10)
    assert delays == ["1.0s", "2.0s"], "the capped exponential backoff of a retryable OperatorError"
    assert len(passes) == 3, "the daemon went on after both failures"
    assert passes[2] == pytest.approx(failed_at + 2.0, abs=0.5), "the retry was asked for at the backoff's end"
    logged = [r for r in caplog.records if r.name == handlers.__name__]
    assert [r.getMessage() for r in logged] == [
        "ns/tiny: reconcile failed unexpectedly, retrying in 1.0s",
        "ns/tiny: reconcile failed unexpectedly, retrying in 2.0s",
    ]
    assert [r.exc_info[0] if r.exc_info else None for r in logged] == [KeyError, RuntimeError], "with tracebacks"


@pytest.mark.parametrize("refusal", [errors.ApiError("events are forbidden", 403), RuntimeError("no client")])
async def test_a_warning_event_that_cannot_be_posted_does_not_end_the_daemon(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, refusal: Exception
) -> None:
    caplog.set_level(logging.WARNING, logger=handlers.__name__)
    stopped = Stopped()
    passes = failing_passes(monkeypatch, stopped, ValueError("bad"))
    api = EventsApi(refusal)
    memo, daemon = start(api, stopped)
    await next_event(api, daemon)
    memo.wakeups.wake("ns", "tiny")
    await asyncio.wait_for(daemon, timeout=10)
    assert len(passes) == 2, "the pass after the failure ran"
    assert f"ns/tiny: could not post event FailedToReconcile: {refusal}" in [r.getMessage() for r in caplog.records]


async def test_a_cancelled_pass_still_ends_the_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped = Stopped()
    passes = failing_passes(monkeypatch, stopped, asyncio.CancelledError())
    api = EventsApi()
    _memo, daemon = start(api, stopped)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(daemon, timeout=10)
    assert passes == [None] and api.posted.empty(), "cancelled: no retry, no event"


def test_the_backoff_after_any_number_of_failed_passes_is_capped_and_never_overflows() -> None:
    assert [handlers._backoff(n) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert handlers._backoff(10_000) == handlers.MAX_ERROR_DELAY


async def test_every_pass_gets_the_operator_s_network_policy_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainingrun_operator.core import netpolicy

    stopped, handed = Stopped(), []

    async def reconcile(*args: Any, network: Any = "missing", covered: Any = "missing", **kwargs: Any) -> float | None:
        handed.append((network, covered))
        stopped.flag.set()
        return None

    monkeypatch.setattr(reconciler, "reconcile", reconcile)
    sources = netpolicy.Sources(kuberay_namespace="ray-system")
    memo = handlers.Memo(api=EventsApi(), network=sources)  # type: ignore[arg-type]
    await handlers.supervise(name="tiny", namespace="ns", body=kopf.Body(tiny()), memo=memo, stopped=stopped)  # type: ignore[arg-type]
    assert handed == [(sources, memo.covered)] and handed[0][1] is memo.covered, "the process's own memory"
    assert handlers.Memo(api=EventsApi()).network == netpolicy.DEFAULT, "closed by default"  # type: ignore[arg-type]
