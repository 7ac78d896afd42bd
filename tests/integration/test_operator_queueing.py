"""Queueing with Kueue, against a real API server with the operator in-process, the test playing Kueue's admission
(a merge patch of the RayJob's spec.suspend, which is all Kueue does to a RayJob when it admits or evicts it) and
KubeRay played by the double of test_operator_double.py. test_operator_kueue.py runs the same journey with the real
Kueue controller deciding admission from a ClusterQueue's quota.

- a run labelled kueue.x-k8s.io/queue-name and kueue.x-k8s.io/priority-class: its RayJob is created suspended, with
  both labels; the run is Queued, its Queued condition names the LocalQueue; `kubectl get` shows the phase;
- admitted (spec.suspend false): Starting, status.attempt.admitted set; then Running, nothing charged for the wait;
- suspended again by the queue while running: Preempted (the preemption budget), and attempt 2 waits in the queue;
- a queued run whose spec breaks Kueue's rules (8 worker groups) fails at once, naming the field and the label,
  while the same spec without the label is accepted by the API server and runs;
- with the chart's ValidatingAdmissionPolicy (from manifests/deploy/, bound here to the test's namespace only), the
  API server itself refuses such a run at creation, naming the field, and refuses adding the label to one; it
  accepts the same runs without the label, and a metadata-only update (a finalizer) of a run it would refuse.

Everything asserted is read back through the API server: status, conditions, events and RayJob objects.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from support.operator_double import Cluster, InProcessOperator, KubeRayDouble, eventually, phase_is, tiny_run

pytestmark = pytest.mark.cluster

RENDERED = pathlib.Path(__file__).resolve().parents[2] / "manifests" / "deploy" / "trainingrun-operator.yaml"
QUEUE_LABELS = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"}


def queued_run(name: str = "tiny", **spec: Any) -> dict[str, Any]:
    doc = tiny_run(name, **spec)
    doc["metadata"]["labels"] = dict(QUEUE_LABELS)
    return doc


def set_suspend(cluster: Cluster, name: str, suspend: bool) -> None:
    """What Kueue does to a RayJob: spec.suspend false when it admits it, true when it evicts or preempts it."""
    cluster.custom.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        cluster.namespace,
        "rayjobs",
        name,
        {"spec": {"suspend": suspend}},
        _content_type="application/merge-patch+json",
    )


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions") or [] if c["type"] == kind)


def test_a_queued_run_waits_as_queued_until_admitted_then_runs_and_a_suspend_after_admission_is_a_preemption(
    cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    cluster.apply_run(queued_run())
    status = eventually(lambda: phase_is(cluster, "tiny", "Queued"), what="run Queued")
    queued = condition(status, "Queued")
    assert queued["status"] == "True" and "LocalQueue team-a" in queued["message"], queued
    job = eventually(lambda: cluster.rayjob("tiny-a1"), what="RayJob tiny-a1")
    assert job["spec"]["suspend"] is True, "created suspended, as Kueue's webhook would"
    assert QUEUE_LABELS.items() <= job["metadata"]["labels"].items()
    shown = cluster.plane.kubectl("get", "trainingrun", "tiny", "-n", cluster.namespace, "--no-headers").stdout
    assert shown.split()[1] == "Queued", shown
    cluster.events_with("tiny", "Queued")
    assert cluster.pods("trainingrun.dev/run=tiny") == [], "nothing runs while queued"

    set_suspend(cluster, "tiny-a1", False)  # admitted
    status = eventually(lambda: phase_is(cluster, "tiny", "Starting"), what="run Starting after admission")
    assert status["attempt"]["admitted"], status["attempt"]
    assert condition(status, "Queued")["status"] == "False"
    kuberay.start("tiny-a1")
    status = eventually(lambda: phase_is(cluster, "tiny", "Running"), what="run Running")
    assert status["restarts"]["total"] == 0 and not status.get("consecutiveFailures"), "the wait cost nothing"
    cluster.events_with("tiny", "Admitted")

    set_suspend(cluster, "tiny-a1", True)  # evicted by the queue (a higher-priority workload took the quota)
    job2 = eventually(lambda: cluster.rayjob("tiny-a2"), what="RayJob tiny-a2 after the queue suspended attempt 1")
    assert job2["spec"]["suspend"] is True and QUEUE_LABELS.items() <= job2["metadata"]["labels"].items()
    status = eventually(lambda: phase_is(cluster, "tiny", "Queued"), what="attempt 2 Queued")
    first = status["attempts"][0]
    assert first["reason"] == "Preempted" and "suspended by a queue" in first["message"], first
    assert status["restarts"]["preempted"] == 1 and status["restarts"]["total"] == 1


def test_a_queued_run_that_breaks_kueues_rules_fails_naming_the_field_and_the_label(
    cluster: Cluster, operator: InProcessOperator
) -> None:
    workers = [{"name": f"g{i}", "replicas": 1} for i in range(8)]
    cluster.apply_run(queued_run("many", ray={"head": {}, "workers": workers}))
    cluster.apply_run(tiny_run("unqueued", ray={"head": {}, "workers": workers}))
    status = eventually(lambda: phase_is(cluster, "many", "Failed"), what="queued run Failed")
    assert status["reason"] == "InvalidSpec", status
    assert status["message"].startswith("spec.ray.workers: 8 worker groups"), status["message"]
    assert "kueue.x-k8s.io/queue-name" in status["message"]
    assert cluster.rayjob("many-a1") is None, "no RayJob for Kueue to refuse"
    eventually(lambda: phase_is(cluster, "unqueued", "Starting"), what="the same spec without the label starts")


def admission_policy(namespace: str) -> list[dict[str, Any]]:
    """The shipped policy, and its binding renamed and narrowed to `namespace` (other tests create such runs on
    purpose, to see the operator fail them)."""
    docs = [d for d in yaml.safe_load_all(RENDERED.read_text()) if d]
    (policy,) = [
        d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-kueue")
    ]
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    binding["metadata"]["name"] = f"{binding['metadata']['name']}-{namespace}"
    binding["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    return [policy, binding]


def test_the_shipped_admission_policy_refuses_a_queued_run_that_breaks_kueues_rules_at_creation(
    cluster: Cluster,
) -> None:
    plane, namespace = cluster.plane, cluster.namespace
    path = f"/apis/trainingrun.dev/v1alpha1/namespaces/{namespace}/trainingruns"

    def create(doc: dict[str, Any], dry_run: bool = True) -> tuple[int, Any]:
        status, body = plane.request("POST", path + ("?dryRun=All" if dry_run else ""), doc)
        return status, body

    def refused(doc: dict[str, Any]) -> tuple[int, Any] | None:
        got = create(doc)
        return got if got[0] >= 400 else None

    eight = {"head": {}, "workers": [{"name": f"g{i}", "replicas": 1} for i in range(8)]}
    # A run that the policy would refuse, stored before it exists (the policy must leave its metadata alone).
    assert create(queued_run("before", ray=eight), dry_run=False)[0] == 201
    objects = admission_policy(namespace)
    try:
        plane.apply(*objects)
        first = eventually(
            lambda: refused(queued_run("many", ray=eight)),
            what="the policy in force (the API server loads it shortly after it is created)",
        )
        assert first[0] == 422 and "spec.ray.workers: 8 worker groups" in first[1]["message"], first
        cases: list[tuple[dict[str, Any], Callable[[tuple[int, Any]], bool]]] = [
            (queued_run("head", ray={"head": {}, "workers": [{"name": "head"}]}), lambda got: got[0] == 422),
            (tiny_run("unqueued", ray=eight), lambda got: got[0] == 201),
            (queued_run("fine"), lambda got: got[0] == 201),
        ]
        bad_queue = queued_run("badqueue")
        bad_queue["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "Team_A"
        cases.append((bad_queue, lambda got: got[0] == 422 and "queue-name]: Team_A" in got[1]["message"]))
        answers = {doc["metadata"]["name"]: create(doc) for doc, _ in cases}
        assert all(check(answers[doc["metadata"]["name"]]) for doc, check in cases), answers
        assert "'head' is the name of the head's pod set" in answers["head"][1]["message"]

        stored = create(tiny_run("relabel", ray=eight), dry_run=False)
        assert stored[0] == 201
        relabel = {"metadata": {"labels": dict(QUEUE_LABELS)}}
        status, body = plane.request("PATCH", f"{path}/relabel", relabel, content_type="application/merge-patch+json")
        assert status == 422 and "spec.ray.workers: 8 worker groups" in body["message"], (status, body)
        finalizer = {"metadata": {"finalizers": ["trainingrun.dev/finalizer"]}}
        status, body = plane.request("PATCH", f"{path}/before", finalizer, content_type="application/merge-patch+json")
        assert status == 200, (status, body)
        plane.request(
            "PATCH", f"{path}/before", {"metadata": {"finalizers": None}}, content_type="application/merge-patch+json"
        )
    finally:
        binding = objects[1]["metadata"]["name"]
        plane.kubectl("delete", "validatingadmissionpolicybinding", binding, "--ignore-not-found", check=False)
