"""The chart installed for real: `helm install charts/trainingrun` into the full-loop bed with the locally built
operator image (`localhost/trainingrun-operator:<IMAGE_TAG or dev>`, pullPolicy Never); kube-controller-manager
makes the ReplicaSet and the pod, kube-scheduler binds it to the bed's container node, and the pod runner runs it
as a podman container the way a kubelet would (hack/testbed/containerpods.py): the chart's security context, the
projected ServiceAccount token and CA, KUBERNETES_SERVICE_HOST/PORT, and the chart's liveness probe, probed at the
pod's IP. The container has a network namespace and an IP of its own on podman's bridge, and reaches the API
server through the bed's relay on the bridge's gateway with TLS verified (hack/testbed/podnet.py).

Against that operator: the user's journey (support/journeys.py), and a hung operator that its liveness probe gets
restarted while a run goes on to finish. The fixtures are `chart_operator` and `chart_loop` (tests/e2e/conftest.py).
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import chaos
import chartrelease
import containerspec
import fullloop
import podnet
from support import containers, journeys

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.containers]

SA = containerspec.SERVICE_ACCOUNT_DIR


def owner(obj: dict[str, Any]) -> tuple[str, str]:
    (ref,) = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
    return ref["kind"], ref["name"]


def writers(obj: dict[str, Any]) -> set[str]:
    """The field managers of the object's metadata and spec (its status subresource's writers left out)."""
    return {m["manager"] for m in obj["metadata"].get("managedFields") or [] if not m.get("subresource")}


def container_status(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["containerStatuses"]
    return dict(status)


def jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def answers(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except OSError:
        return None


def in_container(release: chartrelease.ChartRelease, *command: str) -> str:
    done = containers.exec_(release.container().instance, *command)
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout


def test_helm_install_makes_a_deployment_whose_pod_kube_controller_manager_made_runs_in_podman_as_the_chart_says(
    chart_loop: Loop, chart_operator: chartrelease.ChartRelease
) -> None:
    release, plane = chart_operator, chart_loop.plane
    assert release.status()["info"]["status"] == "deployed"
    installed = {(o["kind"], o["metadata"]["name"]) for o in release.manifest()}
    name = f"{release.release}-trainingrun"
    assert {("Deployment", name), ("ServiceAccount", name), ("ClusterRole", name)} <= installed, installed

    # Deployment (helm) -> ReplicaSet -> Pod (kube-controller-manager) -> the container node (kube-scheduler).
    deployment = plane.get(f"/apis/apps/v1/namespaces/{release.namespace}/deployments/{name}")
    assert deployment is not None and deployment["status"].get("availableReplicas") == 1, deployment
    assert "helm" in writers(deployment), deployment["metadata"]["managedFields"]
    pod = release.pod()
    kind, replica_set_name = owner(pod)
    assert kind == "ReplicaSet" and "kube-controller-manager" in writers(pod), pod["metadata"]
    replica_set = plane.get(f"/apis/apps/v1/namespaces/{release.namespace}/replicasets/{replica_set_name}")
    assert replica_set is not None and owner(replica_set) == ("Deployment", name)
    assert "kube-controller-manager" in writers(replica_set) and "helm" not in writers(replica_set)
    assert pod["spec"]["nodeName"] == chart_loop.bed.container_node
    scheduled = chart_loop.wait_events(release.namespace, "Scheduled")
    assert any(e["involvedObject"]["name"] == pod["metadata"]["name"] for e in scheduled), scheduled
    status = container_status(pod)
    assert status["ready"] and "running" in status["state"], status
    assert status["image"] == release.image and status["containerID"].startswith("podman://"), status

    # The container, as podman runs it: the chart's user, a read-only root, no capabilities, no new privileges,
    # /tmp the emptyDir, the projected token at the standard path (read-only).
    local = release.container()
    (inspected,) = json.loads(containers.podman("inspect", local.instance).stdout)
    assert inspected["ImageName"] == release.image
    assert inspected["Config"]["User"] == "65532:65532" and inspected["HostConfig"]["ReadonlyRootfs"] is True
    mounts = {m["Destination"]: m["RW"] for m in inspected["Mounts"]}
    assert mounts == {"/tmp": True, SA: False}, mounts
    assert in_container(release, "id", "-u").strip() == "65532"
    proc = in_container(release, "cat", "/proc/1/status")
    assert "CapEff:\t0000000000000000" in proc and "NoNewPrivs:\t1" in proc, proc
    wrote = containers.exec_(local.instance, "python", "-c", "open('/usr/local/probe', 'w')")
    assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, wrote.stderr
    in_container(release, "python", "-c", "open('/tmp/probe', 'w')")

    # In-cluster configuration from the real environment and token path; no kubeconfig anywhere. The Service's
    # address is the bed's relay to the API server on the bridge's gateway (kube-proxy's part, podnet.py).
    host, port = chart_loop.bed.runner.containers.network.api_address()
    assert in_container(release, "printenv", "KUBERNETES_SERVICE_HOST").strip() == host
    assert in_container(release, "printenv", "KUBERNETES_SERVICE_PORT").strip() == str(port)
    assert containers.exec_(local.instance, "printenv", "KUBECONFIG").returncode == 1
    assert not any("kubeconfig" in a for a in inspected["Config"]["Cmd"] or []), inspected["Config"]["Cmd"]
    # A ServiceAccount token bound to this pod (TokenRequest, as the kubelet projects it), the API server's CA
    # (from the kube-root-ca.crt ConfigMap the controller manager publishes), the namespace.
    claims = jwt_claims(in_container(release, "cat", f"{SA}/token"))
    assert claims["sub"] == f"system:serviceaccount:{release.namespace}:{name}", claims
    assert claims["kubernetes.io"]["pod"] == {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    assert in_container(release, "cat", f"{SA}/ca.crt") == Path(plane.ca_file).read_text()
    assert in_container(release, "cat", f"{SA}/namespace") == release.namespace
    # kopf comes up: its liveness endpoint (the chart's probe target) and /metrics answer on the chart's own
    # ports, at the pod's IP.
    for url in (
        f"http://{release.pod_ip()}:{release.port('health')}/healthz",
        f"http://{release.pod_ip()}:{release.port('metrics')}/metrics",
    ):
        chart_loop.wait(lambda u=url: answers(u) == 200, timeout=60, what=f"{url} answering 200")
    print(f"\nFIGURES helm_install_wait_s={release.install_seconds:.1f}")


# Run inside the operator's container with its own Python: the in-cluster configuration as a client library reads
# it (the Service's environment, the projected token and CA), TLS verified against that CA with the host name
# checked, and the API server asked who the token is. Then the API server's loopback address, which only the
# host's network namespace has.
IN_CLUSTER_PROBE = """
import json, os, socket, ssl, sys, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
request = urllib.request.Request(
    f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews",
    data=json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
    headers={"Authorization": "Bearer " + open(f"{sa}/token").read(), "Content-Type": "application/json"},
)
with urllib.request.urlopen(request, context=context, timeout=10) as answer:
    review = json.load(answer)
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    loopback = "connected"
except OSError as err:
    loopback = type(err).__name__
print(json.dumps({"user": review["status"]["userInfo"]["username"], "loopback_api": loopback}))
"""


def test_the_operator_container_has_its_own_network_namespace_and_ip_and_reaches_the_api_server_with_verified_tls(
    chart_loop: Loop, chart_operator: chartrelease.ChartRelease
) -> None:
    release, network = chart_operator, chart_loop.bed.runner.containers.network
    pod, local = release.pod(), release.container()
    # The pod's IP is the container's address on podman's bridge, as the runner read it from podman.
    bridge = podnet.bridge()
    ip = pod["status"]["podIP"]
    assert bridge.holds(ip) and pod["status"]["podIPs"] == [{"ip": ip}], (bridge, pod["status"])
    assert podnet.container_ip(local.instance) == ip == local.pod_ip
    # Its network namespace is not this host's.
    (inspected,) = json.loads(containers.podman("inspect", local.instance).stdout)
    assert inspected["HostConfig"]["NetworkMode"] == "bridge", inspected["HostConfig"]["NetworkMode"]
    assert podnet.network_namespace_inode(inspected["State"]["Pid"]) != podnet.network_namespace_inode(os.getpid())
    # It reaches the API server through the relay with in-cluster config, as its ServiceAccount; the API server's
    # loopback address is not there for it.
    relayed = network.relay.connections if network.relay else 0
    api_port = chart_loop.plane.server.rpartition(":")[2]
    said = json.loads(in_container(release, "python", "-c", IN_CLUSTER_PROBE, api_port))
    account = f"system:serviceaccount:{release.namespace}:{release.release}-trainingrun"
    assert said == {"user": account, "loopback_api": "ConnectionRefusedError"}, said
    assert network.relay is not None and network.relay.connections > relayed
    assert network.relay.address[0] == bridge.gateway


def test_the_users_journey_runs_against_the_operator_in_its_container(
    chart_loop: Loop, chart_operator: chartrelease.ChartRelease, namespace: str
) -> None:
    restarts = container_status(chart_operator.pod())["restartCount"]
    journeys.evicted_head_is_survived(chart_loop, namespace)
    assert container_status(chart_operator.pod())["restartCount"] == restarts  # the operator never restarted
    log = chart_operator.log_tail(2000)
    assert "Traceback" not in log and "orbidden" not in log, log[-3000:]


def test_a_hung_operator_fails_its_liveness_probe_is_restarted_by_the_runner_and_the_run_still_finishes(
    chart_loop: Loop, chart_operator: chartrelease.ChartRelease, namespace: str
) -> None:
    release, plane = chart_operator, chart_loop.plane
    pod = release.pod()
    probe = pod["spec"]["containers"][0]["livenessProbe"]
    restarts = container_status(pod)["restartCount"]
    hung_instance = release.container().instance
    started = time.monotonic()
    run = chart_loop.tiny_run("hung", steps=60)  # shorter than the example: the hang, not the run, is tested
    plane.apply(chart_loop.checkpoints_pvc("tiny-checkpoints"), run, namespace=namespace)
    chart_loop.wait(
        lambda: plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/hung-a1"),
        timeout=60,
        what="attempt 1's RayJob, from the operator before it hangs",
    )

    chaos.hang_container(chart_loop.bed.runner, release.namespace, pod["metadata"]["name"])
    hung = time.monotonic()
    restarted = chart_loop.wait(
        lambda: (
            (s := container_status(release.pod()))["restartCount"] == restarts + 1
            and "running" in s["state"]
            and s["ready"]
            and s
        ),
        timeout=probe["initialDelaySeconds"] + (probe["failureThreshold"] + 2) * probe["periodSeconds"]
        + fullloop.CONTAINER_GRACE_CAP + 60,
        what="the operator's container restarted after its liveness probe failed",
    )  # fmt: skip
    hang_to_restart = time.monotonic() - hung
    # The kubelet's count: failureThreshold failures in a row, one check per period, each failing at its timeout.
    assert hang_to_restart >= (probe["failureThreshold"] - 1) * probe["periodSeconds"], hang_to_restart
    terminated = restarted["lastState"]["terminated"]
    assert terminated["exitCode"] == 137 and terminated["reason"] == "Error", terminated  # SIGKILL, after SIGTERM
    assert release.container().instance != hung_instance
    events = [
        e
        for e in (plane.get(f"/api/v1/namespaces/{release.namespace}/events") or {}).get("items") or []
        if e["involvedObject"]["name"] == pod["metadata"]["name"]
    ]
    unhealthy = [e for e in events if e["reason"] == "Unhealthy" and e["message"].startswith("Liveness probe failed")]
    assert len(unhealthy) >= probe["failureThreshold"], [e["message"] for e in events]
    assert any(e["reason"] == "Killing" and "failed liveness probe" in e["message"] for e in events), events

    final = chart_loop.wait_phase(namespace, "hung", "Succeeded", timeout=420)
    steps = run["spec"]["trainer"]["steps"]
    assert final["checkpoints"]["latest"]["step"] == steps, final["checkpoints"]
    attempts = {a["number"] for a in [final.get("attempt") or {}, *(final.get("attempts") or [])] if a}
    assert attempts == {1}, final  # the operator's restart cost the run no attempt
    columns = journeys.printer_columns(chart_loop, namespace, "hung")
    assert columns["PHASE"] == "Succeeded" and columns["RESTARTS"] == "0", columns
    print(
        f"\nFIGURES liveness_hang_to_restart_s={hang_to_restart:.1f} "
        f"liveness_test_wall_s={time.monotonic() - started:.1f} unhealthy_events={len(unhealthy)}"
    )
