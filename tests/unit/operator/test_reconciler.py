"""One reconcile pass against an in-memory stand-in for the API (no cluster): which calls overlap, which wait
for which, and when the next pass is due. The decision itself is tested in test_decision.py."""

from __future__ import annotations

import asyncio
import copy
import datetime
import pathlib
import time
from typing import Any

import pytest
import yaml

from trainingrun_operator import errors, metrics, patching, reconciler, wakeups
from trainingrun_runtime import timestamps

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"
NOW = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


def tiny(status: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": "tiny", "namespace": "ns", "uid": "u-1", "generation": 1, "resourceVersion": "10"}
    if status is not None:
        doc["status"] = status
    return dict(doc)


class FakeApi:
    """The Api's methods that a pass calls, over dicts; records the order of calls. `delay` slows every call."""

    def __init__(self, run: dict[str, Any], jobs: list[dict[str, Any]] | None = None, delay: float = 0.0) -> None:
        self.run, self.jobs, self.delay = run, jobs or [], delay
        self.log: list[str] = []
        self.in_flight: set[str] = set()
        self.overlapped: dict[str, set[str]] = {}
        self.events: list[tuple[str, str]] = []

    async def _call(self, what: str, result: Any = None) -> Any:
        self.log.append(f"start {what}")
        self.overlapped[what] = set(self.in_flight)
        for other in self.in_flight:
            self.overlapped[other].add(what)
        self.in_flight.add(what)
        await asyncio.sleep(self.delay)
        self.in_flight.discard(what)
        self.log.append(f"end {what}")
        return result

    async def get_trainingrun(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call("get run", copy.deepcopy(self.run))

    async def list_rayjobs(self, namespace: str, run: str) -> list[dict[str, Any]]:
        return await self._call("list rayjobs", copy.deepcopy(self.jobs))

    async def list_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
        return await self._call("list pods", [])

    async def get_node(self, name: str) -> dict[str, Any] | None:
        return await self._call(f"get node {name}")

    async def patch_trainingrun_status(self, namespace: str, name: str, patch: dict[str, Any]) -> str | None:
        await self._call("patch status")
        self.run["status"] = patching.apply(self.run.get("status") or {}, patch)
        return "11"

    async def create_service_account(self, body: dict[str, Any]) -> bool:
        return bool(await self._call("create serviceaccount", True))

    async def create_role(self, body: dict[str, Any]) -> bool:
        return bool(await self._call("create role", True))

    async def create_role_binding(self, body: dict[str, Any]) -> bool:
        return bool(await self._call("create rolebinding", True))

    async def create_rayjob(self, body: dict[str, Any]) -> bool:
        return bool(await self._call("create rayjob", True))

    async def delete_rayjob(self, namespace: str, name: str) -> bool:
        for job in self.jobs:
            if job["metadata"]["name"] == name:
                job["metadata"]["deletionTimestamp"] = (
                    "2025-01-01T00:00:00Z"  # being deleted, as KubeRay's finalizer keeps it
                )
        return bool(await self._call(f"delete rayjob {name}", True))

    async def post_event(self, run: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await self._call(f"event {reason}")
        self.events.append((reason, message))


async def test_a_pass_reads_the_run_its_rayjobs_and_its_pods_concurrently() -> None:
    api = FakeApi(tiny(), delay=0.01)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert api.overlapped["get run"] >= {"list rayjobs", "list pods"}
    assert api.log[:3] == ["start get run", "start list rayjobs", "start list pods"]


async def test_the_identity_objects_go_out_with_the_status_write_and_the_rayjob_only_after_both() -> None:
    api = FakeApi(tiny(), delay=0.01)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert api.overlapped["patch status"] >= {"create serviceaccount", "create role", "create rolebinding"}
    created = api.log.index("start create rayjob")
    for before in ("end patch status", "end create serviceaccount", "end create role", "end create rolebinding"):
        assert api.log.index(before) < created, f"{before} after the RayJob's creation: {api.log}"
    assert not api.overlapped["create rayjob"] - {"event AttemptStarted", "event CreatedRayJob"}


async def test_a_pass_notes_what_it_read_so_that_its_own_writes_wake_no_one_but_a_report_or_spec_edit_does() -> None:
    api, signals = FakeApi(tiny()), wakeups.Wakeups()
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, None, signals)  # type: ignore[arg-type]
    own_write = tiny({"phase": "Starting", "attempt": {"number": 1}})
    own_write["metadata"].update(resourceVersion="11", finalizers=["trainingrun.dev/finalizer"])
    assert not signals.is_news("ns", "tiny", own_write)
    report = copy.deepcopy(own_write)
    report["status"]["runtime"] = {"attempt": 1, "step": 10}
    edit = copy.deepcopy(own_write)
    edit["metadata"]["generation"] = 2
    deleting = copy.deepcopy(own_write)
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert signals.is_news("ns", "tiny", report) and signals.is_news("ns", "tiny", edit)
    assert signals.is_news("ns", "tiny", deleting) and signals.is_news("ns", "other", own_write)


async def test_a_progress_report_wakes_no_one_but_a_new_checkpoint_in_it_does() -> None:
    checkpoint = {"step": 10, "path": "/c/tiny/step_10", "attempt": 1, "time": "t"}
    read = tiny(
        {"phase": "Running", "runtime": {"attempt": 1, "step": 10, "updated": "t1", "lastCheckpoint": checkpoint}}
    )
    api, signals = FakeApi(read), wakeups.Wakeups()
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, None, signals)  # type: ignore[arg-type]
    progress = copy.deepcopy(read)
    progress["status"]["runtime"].update(step=13, reward=0.5, updated="t2")
    assert not signals.is_news("ns", "tiny", progress)
    saved = copy.deepcopy(progress)
    saved["status"]["runtime"]["lastCheckpoint"] = {**checkpoint, "step": 20, "path": "/c/tiny/step_20"}
    finished = copy.deepcopy(progress)
    finished["status"]["runtime"]["finished"] = True
    assert signals.is_news("ns", "tiny", saved) and signals.is_news("ns", "tiny", finished)


def running_attempt_whose_rayjob_failed() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    status = {
        "phase": "Running",
        "reason": "AttemptRunning",
        "attempt": {"number": 1, "rayJobName": "tiny-a1", "start": "2025-01-01T00:00:00Z"},
        "identity": {"serviceAccountName": "tiny-driver", "roleName": "tiny-driver", "roleBindingName": "tiny-driver"},
        "restarts": {
            "total": 0,
            "preempted": 0,
            "applicationFailure": 0,
            "infrastructureFailure": 0,
            "failedRestore": 0,
        },
    }
    job = {
        "metadata": {"name": "tiny-a1", "labels": {"trainingrun.dev/run": "tiny", "trainingrun.dev/attempt": "1"}},
        "spec": {},
        "status": {
            "jobDeploymentStatus": "Failed",
            "jobStatus": "FAILED",
            "reason": "AppFailed",
            "message": "Job entrypoint command failed with exit code 1",
        },
    }
    return tiny(status), [job]


async def test_the_next_pass_is_due_a_backoff_after_the_decision_not_after_the_passs_writes() -> None:
    run, jobs = running_attempt_whose_rayjob_failed()
    api = FakeApi(run, jobs, delay=0.1)  # each write takes 100 ms: patch, then delete, then the events
    requeue = await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "start delete rayjob tiny-a1" in api.log
    # tiny.yaml's backoff starts at 1 s; about 0.3 s of the pass went by after the decision.
    assert requeue is not None and 0.5 < requeue <= 0.8, requeue


async def test_a_zero_delay_stays_zero_however_long_the_pass_took() -> None:
    run, jobs = running_attempt_whose_rayjob_failed()
    run["spec"]["restartPolicy"]["backoff"] = {"initialSeconds": 0.05, "maxSeconds": 0.05, "factor": 1}
    started = time.monotonic()
    requeue = await reconciler.reconcile(FakeApi(run, jobs, delay=0.05), "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert time.monotonic() - started > 0.05 and requeue == 0.0


async def test_a_deleted_head_seen_as_a_disruption_target_is_preempted_even_if_the_condition_is_gone() -> None:
    """A status write after the DisruptionTarget condition (kwok's, a kubelet's) can replace the conditions before the
    pod's deletion is observed: the watch's memory of the disruption still decides."""
    from trainingrun_operator import departures, observation

    run, _jobs = running_attempt_whose_rayjob_failed()
    job = {
        "metadata": {"name": "tiny-a1", "labels": {"trainingrun.dev/run": "tiny", "trainingrun.dev/attempt": "1"}},
        "spec": {},
        "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
    }
    head = {
        "metadata": {
            "name": "tiny-a1-head",
            "deletionTimestamp": "2024-12-31T23:59:50Z",
            "labels": {"trainingrun.dev/run": "tiny", "trainingrun.dev/attempt": "1", "ray.io/node-type": "head"},
        },
        "spec": {},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    seen = copy.deepcopy(head)
    del seen["metadata"]["deletionTimestamp"]
    seen["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    memory = departures.Departures()
    memory.record("ns", "tiny", "1", observation.pod_observation(seen, None))

    class WithHead(FakeApi):
        async def list_pods(self, namespace: str, run: str) -> list[dict[str, Any]]:
            return [copy.deepcopy(head)]

    api = WithHead(run, [job])
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, memory)  # type: ignore[arg-type]
    assert "start event Preempted" in api.log, api.log


def restarting(next_attempt_in: float) -> dict[str, Any]:
    run, _ = running_attempt_whose_rayjob_failed()
    wake = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=next_attempt_in)
    run["status"].update(
        phase="Restarting",
        reason="ApplicationFailure",
        consecutiveFailures=1,
        nextAttemptTime=timestamps.rfc3339(wake),
    )
    run["status"]["attempt"].update(end="2025-01-01T00:00:01Z", reason="ApplicationFailure")
    return run


async def test_a_pass_asked_for_a_backoffs_end_reads_ahead_and_starts_the_next_attempt_when_due() -> None:
    api = FakeApi(restarting(0.15))
    started = time.monotonic()
    requeue = await reconciler.reconcile(
        api,
        "ns",
        "tiny",
        reconciler.utc_now,
        not_before=started + 0.15,  # type: ignore[arg-type]
    )
    assert "start create rayjob" in api.log and requeue is None, api.log
    assert time.monotonic() - started >= 0.14, "decided before the moment it was asked for"


async def test_a_pass_woken_long_before_it_is_due_decides_at_once() -> None:
    api = FakeApi(restarting(1.0))
    started = time.monotonic()
    requeue = await reconciler.reconcile(
        api,
        "ns",
        "tiny",
        reconciler.utc_now,
        not_before=started + 1.0,  # type: ignore[arg-type]
    )
    assert "start create rayjob" not in api.log and time.monotonic() - started < 0.1
    assert requeue is not None and 0.8 < requeue <= 1.0


async def test_a_run_that_does_not_parse_fails_once_naming_its_first_invalid_field_and_its_rayjob_goes() -> None:
    run, jobs = running_attempt_whose_rayjob_failed()
    jobs[0]["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
    run["spec"]["checkpoint"]["savePeriod"] = 0
    api = FakeApi(run, jobs)
    assert await reconciler.reconcile(api, "ns", "tiny", lambda: NOW) is None  # type: ignore[arg-type]
    problem = "spec.checkpoint.savePeriod: Input should be greater than or equal to 1"
    status = api.run["status"]
    assert (status["phase"], status["reason"], status["message"]) == ("Failed", "InvalidSpec", problem)
    assert {c["type"]: c["status"] for c in status["conditions"]}["Failed"] == "True"
    assert status["attempt"]["reason"] == "InvalidSpec" and status["attempt"]["end"] == "2025-01-01T00:00:00Z"
    assert ("InvalidSpec", problem) in api.events and "start delete rayjob tiny-a1" in api.log

    api.log.clear()
    api.events.clear()
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "end get run" in api.log, "the second pass ran"
    assert "start patch status" not in api.log and not api.events, "the same problem is written and announced once"


async def test_a_status_field_that_does_not_parse_is_named_and_left_alone() -> None:
    run = tiny({"phase": "Pending", "restarts": {"total": "many"}})
    api = FakeApi(run)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    status = api.run["status"]
    assert status["phase"] == "Failed" and status["message"].startswith("status.restarts.total: ")
    assert status["restarts"] == {"total": "many"}, "the operator's patch never names the field it cannot read"
    assert reconciler.read(api.run).status.phase == "Failed"


async def test_the_metrics_learn_the_pass_once_the_status_is_written_and_every_pass_s_duration() -> None:
    exporter = metrics.Exporter(clock=lambda: NOW)
    run, jobs = running_attempt_whose_rayjob_failed()
    api = FakeApi(run, jobs)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, metrics=exporter)  # type: ignore[arg-type]
    ended = {"namespace": "ns", "name": "tiny", "class": "ApplicationFailure"}
    assert exporter.registry.get_sample_value("trainingrun_attempts_ended_total", ended) == 1
    assert exporter.snapshot()[("ns", "tiny")].phase == "Restarting"

    class Refused(FakeApi):
        async def patch_trainingrun_status(self, namespace: str, name: str, patch: dict[str, Any]) -> str | None:
            raise errors.ApiError("patch status: 409 Conflict")

    exporter = metrics.Exporter(clock=lambda: NOW)
    run, jobs = running_attempt_whose_rayjob_failed()
    with pytest.raises(errors.ApiError):
        await reconciler.reconcile(Refused(run, jobs), "ns", "tiny", lambda: NOW, metrics=exporter)  # type: ignore[arg-type]
    assert exporter.snapshot() == {}, "nothing counted that the status does not say"
    assert exporter.registry.get_sample_value("trainingrun_reconcile_duration_seconds_count") == 1


async def test_a_run_found_gone_takes_its_series_with_it() -> None:
    exporter = metrics.Exporter(clock=lambda: NOW)
    api = FakeApi(tiny())
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, metrics=exporter)  # type: ignore[arg-type]
    assert ("ns", "tiny") in exporter.snapshot()
    api.run = None  # type: ignore[assignment]
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, metrics=exporter)  # type: ignore[arg-type]
    assert exporter.snapshot() == {}
