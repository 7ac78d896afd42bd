"""Smoke tests of the test bed's control plane (hack/testbed/controlplane.py): the real API server, controller
manager, scheduler, kwok and CRDs do what the operator and the driver will rely on (RBAC by resource name,
TokenRequest, our CRD and its printer columns, KubeRay's schema, garbage collection of owned objects, scheduling,
eviction, a node that stops heartbeating).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import controlplane
import fakenodes
import kubeapi
from support import waiting

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "trainingrun.dev", "v1alpha1", "trainingruns"
TINY_EXAMPLE = REPO / "manifests" / "examples" / "tiny.yaml"


def trainingrun(name: str) -> dict[str, Any]:
    """The tiny example TrainingRun under another name (so the example is also checked against the CRD)."""
    docs = [d for d in yaml.safe_load_all(TINY_EXAMPLE.read_text()) if d and d.get("kind") == "TrainingRun"]
    run = copy.deepcopy(docs[0])
    run["metadata"] = {"name": name}
    return dict(run)


def run_path(namespace: str, name: str = "") -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}" + (f"/{name}" if name else "")


def rayjob(name: str, *, with_template: bool = True) -> dict[str, Any]:
    head: dict[str, Any] = {"rayStartParams": {}}
    if with_template:
        head["template"] = {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0"}]}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "python -m trainingrun_runtime --help",
            "backoffLimit": 0,
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {"rayVersion": "2.60.0", "headGroupSpec": head},
        },
    }


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "fake.invalid/none:0"}], **spec},
    }


def test_a_namespace_service_account_role_and_binding_grant_exactly_the_role(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    control_plane.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"k": "v"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "configmap-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
        namespace=namespace,
    )
    listed = control_plane.kubectl(
        "get", "-n", namespace, "serviceaccount/reader", "role/configmap-reader", "rolebinding/reader", "-o", "name"
    ).stdout.split()
    assert listed == [
        "serviceaccount/reader",
        "role.rbac.authorization.k8s.io/configmap-reader",
        "rolebinding.rbac.authorization.k8s.io/reader",
    ]

    reader = control_plane.service_account_kubeconfig(namespace, "reader")
    allowed = control_plane.kubectl(
        "get", "configmap", "settings", "-n", namespace, "-o", "jsonpath={.data.k}", kubeconfig=reader
    )
    assert allowed.stdout == "v"
    denied = control_plane.kubectl("get", "secrets", "-n", namespace, kubeconfig=reader, check=False)
    assert denied.returncode != 0
    assert f'User "system:serviceaccount:{namespace}:reader" cannot list resource "secrets"' in denied.stderr
    whoami = control_plane.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=reader)
    assert whoami.stdout == f"system:serviceaccount:{namespace}:reader"


def test_a_status_role_limited_by_resource_names_lets_a_minted_token_patch_only_that_run(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    control_plane.apply(
        trainingrun("run-a"),
        trainingrun("run-b"),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "driver"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "run-a-status"},
            "rules": [
                {
                    "apiGroups": [GROUP],
                    "resources": ["trainingruns/status"],
                    "resourceNames": ["run-a"],
                    "verbs": ["get", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "driver"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "run-a-status"},
            "subjects": [{"kind": "ServiceAccount", "name": "driver", "namespace": namespace}],
        },
        namespace=namespace,
    )
    driver = client.CustomObjectsApi(
        control_plane.api_client(control_plane.service_account_kubeconfig(namespace, "driver"))
    )
    report = {"status": {"runtime": {"attempt": 1, "step": 5, "reward": 0.25, "finished": False}}}

    def patch_status(name: str) -> int:
        try:
            _, status, _ = driver.patch_namespaced_custom_object_status_with_http_info(
                GROUP, VERSION, namespace, PLURAL, name, report, _content_type="application/merge-patch+json"
            )
        except ApiException as err:
            return int(err.status)
        return int(status)

    assert patch_status("run-a") == 200
    assert patch_status("run-b") == 403
    stored_a = control_plane.get(run_path(namespace, "run-a"))
    stored_b = control_plane.get(run_path(namespace, "run-b"))
    assert stored_a is not None and stored_a["status"]["runtime"] == report["status"]["runtime"]
    assert stored_b is not None and "runtime" not in stored_b.get("status", {})
    # The role names the status subresource only: the run's spec stays out of the driver's reach.
    with pytest.raises(ApiException) as spec_patch:
        driver.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            "run-a",
            {"spec": {"suspend": True}},
            _content_type="application/merge-patch+json",
        )
    assert spec_patch.value.status == 403


def test_our_crd_applies_and_kubectl_shows_a_trainingrun_with_its_printer_columns(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    crds = sorted((REPO / "manifests" / "crd").glob("*.yaml"))
    assert [p.name for p in crds] == ["trainingrun.dev_trainingruns.yaml"]
    installed = control_plane.install_crds(crds)
    assert installed == ["customresourcedefinition.apiextensions.k8s.io/trainingruns.trainingrun.dev"]
    control_plane.apply(trainingrun("columns"), namespace=namespace)
    status = {
        "phase": "Running",
        "reason": "AttemptRunning",
        "attempt": {"number": 2},
        "restarts": {"total": 1, "preempted": 1},
        "checkpoints": {"latest": {"step": 15, "attempt": 2}},
        "progress": "18/120",
        "reward": 0.625,
        "eta": "3m",
    }
    control_plane.kubectl(
        "patch",
        "trun",
        "columns",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )

    table = control_plane.kubectl("get", "trun", "columns", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PROGRESS", "STEP", "ATTEMPT", "RESTARTS", "AGE"]
    name, phase, progress, step, attempt, restarts, age = table[1].split()
    assert (name, phase, progress, step, attempt, restarts) == ("columns", "Running", "18/120", "15", "2", "1")
    assert age.endswith("s")
    wide = control_plane.kubectl("get", "trainingruns.trainingrun.dev", "-n", namespace, "-o", "wide").stdout
    header, row = wide.splitlines()
    assert header.split() == [
        *["NAME", "PHASE", "PROGRESS", "STEP", "ATTEMPT", "RESTARTS"],
        *["WORKERS-LOST", "REWARD", "GOODPUT", "ETA", "REASON", "AGE"],
    ]
    at = header.index
    assert row[at("WORKERS-LOST") : at("REWARD")].strip() == "", "no workersLost in this status"
    assert row[at("GOODPUT") : at("ETA")].strip() == "", "no goodput in this status"
    assert row[at("REWARD") :].split()[:3] == ["0.625", "3m", "AttemptRunning"]


def test_kuberay_schema_accepts_a_well_formed_rayjob_and_rejects_one_without_a_head_template(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    control_plane.apply(rayjob("well-formed"), namespace=namespace)
    stored = control_plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/well-formed")
    assert stored is not None and stored["spec"]["backoffLimit"] == 0
    assert stored["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["name"] == "ray-head"

    rejected = control_plane.kubectl(
        "apply", "-n", namespace, "-f", "-", check=False, input=json.dumps(rayjob("no-template", with_template=False))
    )
    assert rejected.returncode != 0
    assert "spec.rayClusterSpec.headGroupSpec.template: Required value" in rejected.stderr
    assert control_plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/no-template") is None


def test_deleting_a_trainingrun_garbage_collects_the_rayjob_it_owns(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    control_plane.apply(trainingrun("owner"), namespace=namespace)
    owner = control_plane.get(run_path(namespace, "owner"))
    assert owner is not None
    owned = rayjob("owner-a1")
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingRun",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    control_plane.apply(owned, rayjob("bystander"), namespace=namespace)
    rayjobs = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs"
    assert control_plane.get(f"{rayjobs}/owner-a1") is not None

    control_plane.kubectl("delete", "trun", "owner", "-n", namespace, "--wait=true")
    waiting.wait(
        lambda: control_plane.get(f"{rayjobs}/owner-a1") is None,
        timeout=60,
        what="the garbage collector to delete the owned RayJob",
    )
    assert control_plane.get(f"{rayjobs}/bystander") is not None  # no owner, so not collected


def test_a_pod_scheduled_onto_a_kwok_node_runs_and_an_eviction_removes_it(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    core = client.CoreV1Api(control_plane.api_client())
    control_plane.apply(pod("evictee", nodeSelector={"type": "kwok"}), namespace=namespace)

    def running() -> dict[str, Any] | None:
        found = control_plane.get(f"/api/v1/namespaces/{namespace}/pods/evictee")
        return found if found and found["status"].get("phase") == "Running" else None

    scheduled = waiting.wait(running, timeout=60, what="pod evictee Running")
    assert scheduled is not None
    assert scheduled["spec"]["nodeName"] in control_plane.node_names  # placed by kube-scheduler
    assert (kubeapi.condition(scheduled, "Ready") or {}).get("status") == "True"

    _, status, _ = core.create_namespaced_pod_eviction_with_http_info(
        "evictee", namespace, client.V1Eviction(metadata=client.V1ObjectMeta(name="evictee", namespace=namespace))
    )
    assert status == 201
    waiting.wait(
        lambda: control_plane.get(f"/api/v1/namespaces/{namespace}/pods/evictee") is None,
        timeout=60,
        what="the evicted pod to be gone",
    )


def test_a_node_that_stops_heartbeating_turns_unknown_and_its_pods_not_ready(
    control_plane: controlplane.ControlPlane, namespace: str
) -> None:
    """The node's own kwok process plays its kubelet; stopping it is the node dying. The node lifecycle
    controller then sets the node's Ready condition to Unknown, taints it unreachable, marks its pods not Ready
    (with a NodeNotReady event) and leaves their phase Running: what the operator sees on a real node loss
    before the taint evicts the pods. (Patching the node's Ready condition to False while its kwok runs does
    not do this: kwok sets it back to True, and the controller only marks pods on a Ready -> not-Ready edge.)"""
    with control_plane.lone_node() as node:
        try:
            _the_node_dies(control_plane, namespace, node)
        finally:
            control_plane.kubectl(
                "delete",
                "pod",
                "on-doomed-node",
                "-n",
                namespace,
                "--force",
                "--grace-period=0",
                "--ignore-not-found",
                check=False,
            )


def _the_node_dies(control_plane: controlplane.ControlPlane, namespace: str, node: fakenodes.LoneNode) -> None:
    control_plane.apply(pod("on-doomed-node", **node.pod_fields()), namespace=namespace)
    pod_path = f"/api/v1/namespaces/{namespace}/pods/on-doomed-node"

    def pod_ready() -> str:
        return str((kubeapi.condition(control_plane.get(pod_path), "Ready") or {}).get("status"))

    waiting.wait(lambda: pod_ready() == "True", timeout=60, what="the pod Running and Ready on the doomed node")

    node.kubelet.stop()

    def node_ready_unknown() -> dict[str, Any] | None:
        ready = kubeapi.condition(control_plane.get(f"/api/v1/nodes/{node.name}"), "Ready")
        return ready if ready and ready["status"] == "Unknown" else None

    node_ready = waiting.wait(node_ready_unknown, timeout=90, what="the node's Ready condition to turn Unknown")
    assert node_ready["reason"] == "NodeStatusUnknown"
    waiting.wait(lambda: pod_ready() == "False", timeout=30, what="the pod's Ready condition to turn False")
    events = f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3Don-doomed-node"
    waiting.wait(
        lambda: any(e.get("reason") == "NodeNotReady" for e in (control_plane.get(events) or {})["items"]),
        timeout=30,
        what="a NodeNotReady event on the pod",
    )
    stored = control_plane.get(pod_path)
    assert stored is not None and stored["status"]["phase"] == "Running"  # nobody reports it dead yet

    def tainted_unreachable() -> bool:
        taints = (control_plane.get(f"/api/v1/nodes/{node.name}") or {}).get("spec", {}).get("taints") or []
        return any(t["key"] == "node.kubernetes.io/unreachable" and t["effect"] == "NoExecute" for t in taints)

    # The controller's rate-limited tainting pass may run a moment after it marked the pods.
    waiting.wait(tainted_unreachable, timeout=30, what="the NoExecute unreachable taint on the node")
