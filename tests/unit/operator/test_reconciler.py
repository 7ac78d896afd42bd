"""One reconcile pass against an in-memory stand-in for the API (no cluster): which calls overlap, which wait
for which, when the next pass is due, and what of the objects with the run's label the pass takes for the run's.
The decision itself is tested in test_decision_*.py; the ownership rules alone in test_ownership.py."""

from __future__ import annotations

import asyncio
import copy
import datetime
import pathlib
import time
from typing import Any

import pytest
import yaml

from trainingrun_operator.core import allowance, errors, patching
from trainingrun_operator.kube import metrics, reconciler, wakeups
from trainingrun_runtime import timestamps

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"
NOW = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)


def tiny(status: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": "tiny", "namespace": "ns", "uid": "u-1", "generation": 1, "resourceVersion": "10"}
    if status is not None:
        doc["status"] = status
    return dict(doc)


OWNER = {
    "apiVersion": "trainingrun.dev/v1alpha1",
    "kind": "TrainingRun",
    "name": "tiny",
    "uid": "u-1",
    "controller": True,
    "blockOwnerDeletion": True,
}
"""The owner reference of what the operator creates for `tiny()`."""
CLUSTER = "tiny-a1-x7k2p"
"""The RayCluster KubeRay made for RayJob tiny-a1 (`rayJob.status.rayClusterName`)."""


def rayjob(name: str = "tiny-a1", attempt: int = 1, owned: bool = True, **status: Any) -> dict[str, Any]:
    """A RayJob with the run's labels; `owned`: the TrainingRun's owner reference, as the operator creates it."""
    meta: dict[str, Any] = {
        "name": name,
        "uid": f"uid-{name}",
        "labels": {"trainingrun.dev/run": "tiny", "trainingrun.dev/attempt": str(attempt)},
    }
    if owned:
        meta["ownerReferences"] = [OWNER]
    return {"metadata": meta, "spec": {}, "status": {"rayClusterName": CLUSTER, **status}}


def pod(name: str, node_type: str, attempt: int = 1, owner: str | None = CLUSTER, **status: Any) -> dict[str, Any]:
    """A pod with the run's labels; `owner`: the RayCluster that controls it, as KubeRay's pods have (None: none)."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": {
            "trainingrun.dev/run": "tiny",
            "trainingrun.dev/attempt": str(attempt),
            "ray.io/node-type": node_type,
        },
    }
    if owner is not None:
        ref = {
            "apiVersion": "ray.io/v1",
            "kind": "RayCluster",
            "name": owner,
            "uid": f"uid-{owner}",
            "controller": True,
        }
        meta["ownerReferences"] = [ref]
    return {"metadata": meta, "spec": {}, "status": {"phase": "Running", **status}}


class FakeApi:
    """The Api's methods that a pass calls, over dicts; records the order of calls. `delay` slows every call.

    `objects`: what exists already, by (kind, name); a create of one of them is a 409 (False), and the get after it
    reads it. A create adds what it created there. `pods`: what list_pods returns.
    """

    def __init__(self, run: dict[str, Any], jobs: list[dict[str, Any]] | None = None, delay: float = 0.0) -> None:
        self.run, self.jobs, self.delay = run, jobs or [], delay
        self.pods: list[dict[str, Any]] = []
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.log: list[str] = []
        self.in_flight: set[str] = set()
        self.overlapped: dict[str, set[str]] = {}
        self.events: list[tuple[str, str]] = []
        self.patches: list[dict[str, Any]] = []

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
        return await self._call("list pods", copy.deepcopy(self.pods))

    async def get_node(self, name: str) -> dict[str, Any] | None:
        return await self._call(f"get node {name}")

    async def patch_trainingrun_status(self, namespace: str, name: str, patch: dict[str, Any]) -> str | None:
        await self._call("patch status")
        self.patches.append(patch)
        self.run["status"] = patching.apply(self.run.get("status") or {}, patch)
        return "11"

    async def _create(self, what: str, body: dict[str, Any]) -> bool:
        key = (body["kind"], body["metadata"]["name"])
        created = key not in self.objects
        if created:
            self.objects[key] = copy.deepcopy(body)
        return bool(await self._call(what, created))

    async def _get(self, what: str, kind: str, name: str) -> dict[str, Any] | None:
        return await self._call(what, copy.deepcopy(self.objects.get((kind, name))))

    async def create_service_account(self, body: dict[str, Any]) -> bool:
        return await self._create("create serviceaccount", body)

    async def create_role(self, body: dict[str, Any]) -> bool:
        return await self._create("create role", body)

    async def create_role_binding(self, body: dict[str, Any]) -> bool:
        return await self._create("create rolebinding", body)

    async def create_rayjob(self, body: dict[str, Any]) -> bool:
        return await self._create("create rayjob", body)

    async def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get("get serviceaccount", "ServiceAccount", name)

    async def get_role(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get("get role", "Role", name)

    async def get_role_binding(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get("get rolebinding", "RoleBinding", name)

    async def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get("get rayjob", "RayJob", name)

    async def create_network_policy(self, body: dict[str, Any]) -> bool:
        return await self._create("create networkpolicy", body)

    async def get_network_policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get("get networkpolicy", "NetworkPolicy", name)

    async def patch_network_policy_spec(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        await self._call("patch networkpolicy")
        self.objects[("NetworkPolicy", name)]["spec"] = copy.deepcopy(spec)

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
    job = rayjob(
        jobDeploymentStatus="Failed",
        jobStatus="FAILED",
        reason="AppFailed",
        message="Job entrypoint command failed with exit code 1",
    )
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
    from trainingrun_operator.core import departures, observation

    run, _jobs = running_attempt_whose_rayjob_failed()
    job = rayjob(jobDeploymentStatus="Running", jobStatus="RUNNING")
    head = pod("tiny-a1-head", "head", conditions=[{"type": "Ready", "status": "True"}])
    head["metadata"]["deletionTimestamp"] = "2024-12-31T23:59:50Z"
    seen = copy.deepcopy(head)
    del seen["metadata"]["deletionTimestamp"]
    seen["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    )
    memory = departures.Departures()
    memory.record("ns", "tiny", "1", observation.pod_observation(seen, None))
    api = FakeApi(run, [job])
    api.pods = [head]
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


async def test_a_template_adding_a_capability_fails_the_run_unless_the_admins_allowance_has_it() -> None:
    def adding_ipc_lock() -> dict[str, Any]:
        run = tiny()
        context = {"capabilities": {"add": ["IPC_LOCK"]}}
        run["spec"]["ray"]["head"]["template"] = {
            "spec": {"containers": [{"name": "ray-head", "securityContext": context}]}
        }
        return run

    refused = FakeApi(adding_ipc_lock())
    await reconciler.reconcile(refused, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    status = refused.run["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert status["message"].startswith(
        "spec.ray.head.template.spec.containers.0.securityContext.capabilities.add: IPC_LOCK is not in the cluster's"
    )
    assert "start create rayjob" not in refused.log

    allowed = FakeApi(adding_ipc_lock())
    allow = allowance.parse(["IPC_LOCK"])
    await reconciler.reconcile(allowed, "ns", "tiny", lambda: NOW, allow=allow)  # type: ignore[arg-type]
    assert allowed.run["status"]["phase"] != "Failed" and "start create rayjob" in allowed.log
    (job,) = [body for (kind, _), body in allowed.objects.items() if kind == "RayJob"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"], "drop": ["ALL"]}


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


# ------------------------------------------------------------------- what the run owns, and what it refuses


def foreign(body: dict[str, Any], owners: list[dict[str, Any]]) -> dict[str, Any]:
    """`body` as someone else made it: the same kind and name, other owner references (none: [])."""
    found = copy.deepcopy(body)
    found["metadata"]["ownerReferences"] = owners
    return found


ANOTHER_RUN = {**OWNER, "uid": "u-old"}
"""The owner reference of an earlier TrainingRun named tiny (another uid)."""


def identity_bodies() -> dict[str, dict[str, Any]]:
    from trainingrun_operator.core import identity

    return {
        "ServiceAccount": identity.build_service_account("tiny", "ns", "u-1"),
        "Role": identity.build_role("tiny", "ns", "u-1"),
        "RoleBinding": identity.build_role_binding("tiny", "ns", "u-1"),
    }


@pytest.mark.parametrize("kind", ["ServiceAccount", "Role", "RoleBinding"])
@pytest.mark.parametrize(
    ("owners", "whose"), [([], "owned by nobody"), ([ANOTHER_RUN], "TrainingRun tiny (uid u-old)")]
)
async def test_a_driver_identity_object_that_another_owns_is_refused_named_and_left_alone(
    kind: str, owners: list[dict[str, Any]], whose: str
) -> None:
    api = FakeApi(tiny())
    found = foreign(identity_bodies()[kind], owners)
    api.objects[(kind, "tiny-driver")] = copy.deepcopy(found)
    with pytest.raises(errors.ForeignObject) as refused:
        await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    message = str(refused.value)
    assert f"{kind} ns/tiny-driver exists and is " in message and whose in message
    assert f"kubectl delete {kind.lower()} -n ns tiny-driver" in message and "another name" in message
    assert refused.value.retryable, "an earlier run's object may be on its way out: the pass is retried"
    assert api.objects[(kind, "tiny-driver")] == found, "the foreign object is not touched"
    assert "start create rayjob" not in api.log, "no RayJob runs with an identity the run did not make"
    status = api.run["status"]
    assert (status["phase"], status["reason"], status["message"]) == ("Starting", "ForeignObject", message)
    assert ("ForeignObject", message) in api.events

    api.events.clear()
    api.patches.clear()
    api.log.clear()
    with pytest.raises(errors.ForeignObject):
        await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert f"end get {kind.lower()}" in api.log, "the second pass looked again"
    assert not api.events and not api.patches, "the same refusal is told once, not on every retry"


@pytest.mark.parametrize("kind", ["ServiceAccount", "Role", "RoleBinding"])
async def test_a_driver_identity_object_this_run_owns_is_adopted_and_the_rayjob_created(kind: str) -> None:
    api = FakeApi(tiny())
    api.objects[(kind, "tiny-driver")] = identity_bodies()[kind]
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert f"end get {kind.lower()}" in api.log, "the 409 was looked at"
    assert "start create rayjob" in api.log and api.run["status"]["reason"] == "AttemptStarted"


@pytest.mark.parametrize(
    ("kind", "field", "value", "said"),
    [
        ("RoleBinding", "roleRef", {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "admin"}, "admin"),
        ("RoleBinding", "subjects", [{"kind": "ServiceAccount", "name": "intruder", "namespace": "ns"}], "intruder"),
        ("Role", "rules", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}], "secrets"),
    ],
)
async def test_a_role_or_binding_this_run_owns_that_grants_or_binds_otherwise_is_refused(
    kind: str, field: str, value: Any, said: str
) -> None:
    """An owner reference names a uid anyone who reads the run knows: what a Role grants and whom a RoleBinding binds
    are checked too, never taken from the object found."""
    api = FakeApi(tiny())
    found = identity_bodies()[kind]
    found[field] = value
    api.objects[(kind, "tiny-driver")] = found
    with pytest.raises(errors.ForeignObject, match=f"{kind} ns/tiny-driver is owned by this TrainingRun but .*{said}"):
        await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "start create rayjob" not in api.log


async def test_a_rayjob_under_the_attempt_s_name_that_another_owns_is_refused_not_adopted() -> None:
    api = FakeApi(tiny())
    api.objects[("RayJob", "tiny-a1")] = rayjob(owned=False)
    with pytest.raises(errors.ForeignObject, match="RayJob ns/tiny-a1 exists and is owned by nobody"):
        await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "end get rayjob" in api.log
    assert not {r for r, _ in api.events} & {"AdoptedRayJob", "CreatedRayJob"}
    assert api.run["status"]["reason"] == "ForeignObject"


async def test_once_the_foreign_object_is_gone_the_run_makes_its_own_and_says_so() -> None:
    api = FakeApi(tiny())
    api.objects[("RoleBinding", "tiny-driver")] = foreign(identity_bodies()["RoleBinding"], [ANOTHER_RUN])
    with pytest.raises(errors.ForeignObject):
        await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    del api.objects[("RoleBinding", "tiny-driver")]  # deleted by hand, or by the garbage collector
    api.events.clear()
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert api.objects[("RoleBinding", "tiny-driver")] == identity_bodies()["RoleBinding"]
    assert "start create rayjob" in api.log
    status = api.run["status"]
    assert (status["phase"], status["reason"]) == ("Starting", "ForeignObjectGone")
    assert [r for r, _ in api.events] == ["CreatedRayJob", "ForeignObjectGone"]


async def test_a_rayjob_with_the_run_s_label_that_the_run_does_not_own_is_never_deleted() -> None:
    """Another attempt's RayJob is deleted by a pass, and all of them when the run is deleted: only the run's own."""
    run, jobs = running_attempt_whose_rayjob_failed()
    jobs[0]["status"].update(jobDeploymentStatus="Running", jobStatus="RUNNING", reason="", message="")
    jobs += [rayjob("tiny-a0", attempt=0), rayjob("tiny-forged", attempt=0, owned=False)]
    api = FakeApi(run, jobs)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "start delete rayjob tiny-a0" in api.log, "the run's own RayJob of another attempt goes"
    assert "start delete rayjob tiny-forged" not in api.log
    assert sorted(await reconciler.finalize(api, "ns", "tiny")) == ["tiny-a0", "tiny-a1"]  # type: ignore[arg-type]
    assert "start delete rayjob tiny-forged" not in api.log


async def test_a_rayjob_with_the_run_s_labels_and_the_attempt_s_name_but_no_owner_is_not_the_attempt_s() -> None:
    """A RayJob tiny-a1 someone made before the operator could: its status (Running) does not make the attempt run;
    the run sees no RayJob of its own, and its create finds that one and refuses it."""
    run, _ = running_attempt_whose_rayjob_failed()
    run["status"].update(phase="Starting", reason="AttemptStarted")
    forged = rayjob(owned=False, jobDeploymentStatus="Running", jobStatus="RUNNING")
    api = FakeApi(run, [forged])
    api.objects[("RayJob", "tiny-a1")] = forged
    with pytest.raises(errors.ForeignObject, match="RayJob ns/tiny-a1 exists and is owned by nobody"):
        await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert api.run["status"]["phase"] == "Starting" and "start event AttemptRunning" not in api.log


def forged_worker(**status: Any) -> dict[str, Any]:
    """A pod someone made with the run's labels, owned by no RayCluster of the run: a disruption victim."""
    return pod("forged-worker", "worker", owner=None, **status)


DISRUPTED = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]


async def test_a_forged_pod_with_the_run_s_labels_is_not_a_lost_worker_of_the_run() -> None:
    run, jobs = running_attempt_whose_rayjob_failed()
    jobs[0]["status"].update(jobDeploymentStatus="Running", jobStatus="RUNNING", reason="", message="")
    api = FakeApi(run, jobs)
    api.pods = [pod("tiny-a1-head", "head"), forged_worker(conditions=DISRUPTED), pod("w", "worker", owner="other-x")]
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "end list pods" in api.log
    assert "start event WorkerLost" not in api.log and not api.run["status"]["attempt"].get("workersLost")

    real = pod("tiny-a1-worker-0", "worker", conditions=DISRUPTED)
    api.pods.append(real)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert api.run["status"]["attempt"]["lostWorkerPods"] == ["tiny-a1-worker-0"], "the run's own worker counts"


async def test_a_forged_pod_the_watch_saw_disrupted_and_gone_is_not_a_departure_of_the_run() -> None:
    from trainingrun_operator.core import departures, observation

    run, jobs = running_attempt_whose_rayjob_failed()
    jobs[0]["status"].update(jobDeploymentStatus="Running", jobStatus="RUNNING", reason="", message="")
    memory = departures.Departures()
    memory.record("ns", "tiny", "1", observation.pod_observation(forged_worker(conditions=DISRUPTED), None))
    forged_head = pod("forged-head", "head", owner=None, conditions=DISRUPTED)
    memory.record("ns", "tiny", "1", observation.pod_observation(forged_head, None))
    api = FakeApi(run, jobs)
    api.pods = [pod("tiny-a1-head", "head")]
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, memory)  # type: ignore[arg-type]
    assert "end list pods" in api.log
    assert not {"start event WorkerLost", "start event Preempted"} & set(api.log), api.log
    assert api.run["status"]["phase"] == "Running"


async def test_a_forged_pod_of_the_ended_attempt_does_not_hold_back_the_next_one() -> None:
    api = FakeApi(restarting(0.0))
    api.pods = [forged_worker(), pod("tiny-a1-head", "head", owner="tiny-a1-elsewhere-x")]
    api.pods[1]["metadata"]["ownerReferences"][0]["apiVersion"] = "ray.io/v9"  # no kind the API server serves
    await reconciler.reconcile(api, "ns", "tiny", reconciler.utc_now)  # type: ignore[arg-type]
    assert "start create rayjob" in api.log, api.log


async def test_a_pod_of_the_ended_attempt_whose_rayjob_is_gone_still_holds_back_the_next_one() -> None:
    """The old RayJob is deleted at once; its cluster's pods go after it (the garbage collector): the next attempt
    waits for them, known by the name KubeRay gives a RayJob's cluster."""
    api = FakeApi(restarting(0.0))
    api.pods = [pod("tiny-a1-head", "head")]
    await reconciler.reconcile(api, "ns", "tiny", reconciler.utc_now)  # type: ignore[arg-type]
    assert "end list pods" in api.log and "start create rayjob" not in api.log
    api.pods.clear()
    await reconciler.reconcile(api, "ns", "tiny", reconciler.utc_now)  # type: ignore[arg-type]
    assert "start create rayjob" in api.log, "once they are gone, it starts"


# ------------------------------------------------------------------------------------ the run's NetworkPolicy


def network_policy(sources: Any = None) -> dict[str, Any]:
    """The NetworkPolicy the operator writes for `tiny()` (with the default settings unless `sources`)."""
    from trainingrun_operator.core import netpolicy

    spec = reconciler.read(tiny()).spec
    assert spec is not None
    return netpolicy.build("tiny", "ns", "u-1", spec, sources or netpolicy.DEFAULT)


async def test_the_network_policy_goes_out_with_the_status_write_and_the_rayjob_only_after_it() -> None:
    api = FakeApi(tiny(), delay=0.01)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "patch status" in api.overlapped["create networkpolicy"], "no round trip of its own before the RayJob"
    assert api.log.index("end create networkpolicy") < api.log.index("start create rayjob"), api.log
    assert api.objects[("NetworkPolicy", "tiny-ray")] == network_policy()


async def test_every_attempt_ensures_the_network_policy_not_only_the_first() -> None:
    """A run that started before the operator made policies (or whose policy was deleted) gets one before its next
    RayJob; one the run already has is adopted as it is."""
    api = FakeApi(restarting(0.0))
    await reconciler.reconcile(api, "ns", "tiny", reconciler.utc_now)  # type: ignore[arg-type]
    assert "start create serviceaccount" not in api.log, "attempt 2: the identity exists since attempt 1"
    assert api.log.index("end create networkpolicy") < api.log.index("start create rayjob"), api.log
    assert api.objects[("NetworkPolicy", "tiny-ray")] == network_policy()

    api = FakeApi(restarting(0.0))
    api.objects[("NetworkPolicy", "tiny-ray")] = network_policy()
    await reconciler.reconcile(api, "ns", "tiny", reconciler.utc_now)  # type: ignore[arg-type]
    assert "end get networkpolicy" in api.log and "start create rayjob" in api.log, api.log
    assert "start patch networkpolicy" not in api.log and "UpdatedNetworkPolicy" not in {r for r, _ in api.events}


async def test_a_pass_that_starts_no_attempt_makes_no_network_policy_call() -> None:
    run, jobs = running_attempt_whose_rayjob_failed()
    api = FakeApi(run, jobs)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "start delete rayjob tiny-a1" in api.log, "the pass ended the attempt"
    assert not [line for line in api.log if "networkpolicy" in line], api.log


@pytest.mark.parametrize(
    ("owners", "whose"), [([], "owned by nobody"), ([ANOTHER_RUN], "TrainingRun tiny (uid u-old)")]
)
async def test_a_network_policy_that_another_owns_is_refused_named_and_left_alone(
    owners: list[dict[str, Any]], whose: str
) -> None:
    """An earlier run's policy is on its way out (the garbage collector): adopted, it would go, and leave the
    run's pods open."""
    api = FakeApi(tiny())
    found = foreign(network_policy(), owners)
    found["spec"]["ingress"].append({})  # admits everyone: it is not set back either, it is not the run's
    api.objects[("NetworkPolicy", "tiny-ray")] = copy.deepcopy(found)
    with pytest.raises(errors.ForeignObject) as refused:
        await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "NetworkPolicy ns/tiny-ray exists and is " in message and whose in message
    assert "kubectl delete networkpolicy -n ns tiny-ray" in message
    assert api.objects[("NetworkPolicy", "tiny-ray")] == found, "the foreign object is not touched"
    assert "start patch networkpolicy" not in api.log and "start create rayjob" not in api.log
    status = api.run["status"]
    assert (status["phase"], status["reason"], status["message"]) == ("Starting", "ForeignObject", message)
    assert ("ForeignObject", message) in api.events


async def test_the_run_s_own_network_policy_that_admits_otherwise_is_set_back_before_the_rayjob() -> None:
    """The settings changed, the run's Ray ports changed, or someone edited it: the operator's spec is the one."""
    api = FakeApi(tiny())
    edited = network_policy()
    edited["spec"]["ingress"].append({})  # from anyone, on any port
    edited["spec"]["podSelector"]["matchLabels"]["narrower"] = "yes"  # selects none of the run's pods
    api.objects[("NetworkPolicy", "tiny-ray")] = edited
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert api.objects[("NetworkPolicy", "tiny-ray")]["spec"] == network_policy()["spec"]
    assert api.log.index("end patch networkpolicy") < api.log.index("start create rayjob"), api.log
    assert "UpdatedNetworkPolicy" in {r for r, _ in api.events}


async def test_the_kuberay_and_metrics_sources_come_from_the_settings() -> None:
    from trainingrun_operator.core import netpolicy

    sources = netpolicy.Sources(
        kuberay_labels={"app": "kuberay"}, kuberay_namespace="ray-system", metrics_namespaces=("monitoring",)
    )
    api = FakeApi(tiny())
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, network=sources)  # type: ignore[arg-type]
    made = api.objects[("NetworkPolicy", "tiny-ray")]
    assert made == network_policy(sources) != network_policy()
    kuberay, scrapers = made["spec"]["ingress"][1]["from"][0], made["spec"]["ingress"][2]["from"][0]
    assert kuberay["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}
    assert kuberay["podSelector"]["matchLabels"] == {"app": "kuberay"}
    assert scrapers["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]


async def test_without_network_settings_the_operator_makes_no_network_policy() -> None:
    api = FakeApi(tiny())
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, network=None)  # type: ignore[arg-type]
    assert "start create rayjob" in api.log, "the attempt started"
    assert ("NetworkPolicy", "tiny-ray") not in api.objects and "start create networkpolicy" not in api.log


async def test_a_network_policy_the_operator_may_not_create_holds_the_rayjob_back() -> None:
    """Without the ClusterRole's rule (403) no RayJob starts with its pods open; the pass fails and is retried."""

    class Forbidden(FakeApi):
        async def create_network_policy(self, body: dict[str, Any]) -> bool:
            await self._call("create networkpolicy")
            raise errors.ApiError("create networkpolicy ns/tiny-ray: 403 Forbidden", 403)

    api = Forbidden(tiny())
    with pytest.raises(errors.ApiError, match="403"):
        await reconciler.reconcile(api, "ns", "tiny", lambda: NOW)  # type: ignore[arg-type]
    assert "end create networkpolicy" in api.log and "start create rayjob" not in api.log
    assert api.run["status"]["phase"] == "Starting", "the status names the attempt; the next pass creates it"


def running() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run whose attempt 1 is running (its RayJob says so)."""
    run, jobs = running_attempt_whose_rayjob_failed()
    jobs[0]["status"].update(jobDeploymentStatus="Running", jobStatus="RUNNING", reason="", message="")
    return run, jobs


async def test_a_running_run_gets_its_policy_once_per_operator_process_not_only_at_its_next_attempt() -> None:
    """A run started before the operator made policies (the chart's namespace-wide one gone with the upgrade) is
    closed at the first pass of the new operator process, not left open until its next attempt."""
    covered: set[str] = set()
    api = FakeApi(*running())
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, covered=covered)  # type: ignore[arg-type]
    assert api.objects[("NetworkPolicy", "tiny-ray")] == network_policy() and covered == {"u-1"}
    api.log.clear()
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, covered=covered)  # type: ignore[arg-type]
    assert "end list pods" in api.log, "the second pass ran"
    assert not [line for line in api.log if "networkpolicy" in line], "once per process, not every pass"


async def test_a_foreign_policy_found_for_a_running_run_is_logged_and_holds_back_nothing_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only a RayJob waits for the policy: ending an attempt, deleting its RayJob, go on; the next pass looks again."""
    covered: set[str] = set()
    run, jobs = running_attempt_whose_rayjob_failed()
    api = FakeApi(run, jobs)
    api.objects[("NetworkPolicy", "tiny-ray")] = foreign(network_policy(), [ANOTHER_RUN])
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, covered=covered)  # type: ignore[arg-type]
    assert "end get networkpolicy" in api.log and "start delete rayjob tiny-a1" in api.log, api.log
    assert api.run["status"]["phase"] == "Restarting" and api.run["status"]["reason"] != "ForeignObject"
    assert not covered, "not ensured: the next pass tries again"
    assert any("NetworkPolicy not ensured (tried again next pass)" in r.getMessage() for r in caplog.records)


async def test_a_finished_run_gets_no_policy() -> None:
    run, _ = running_attempt_whose_rayjob_failed()
    run["status"].update(phase="Succeeded", reason="Succeeded")
    run["status"]["attempt"].update(end="2025-01-01T00:00:01Z", reason="Succeeded")
    covered: set[str] = set()
    api = FakeApi(run)
    await reconciler.reconcile(api, "ns", "tiny", lambda: NOW, covered=covered)  # type: ignore[arg-type]
    assert "end list pods" in api.log, "the pass ran"
    assert not [line for line in api.log if "networkpolicy" in line] and not covered
