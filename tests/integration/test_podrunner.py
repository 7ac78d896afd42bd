"""The pod runner (hack/testbed/podrunner.py) plays the kubelet for Ray pods on kwok nodes: a local Ray per pod,
with the pod's identity, volumes, readiness and routes, and every ending a kubelet sees. Real API server, real
kwok, real Ray; the pods are written here the way KubeRay writes them (labels, the generated `ray start` command,
its RAY_* variables), so these tests need no KubeRay (the KubeRay self-test is tests/e2e/test_full_loop_harness.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chaos
import controlplane
import fakenodes
import fullloop
import kubeapi
import localpod
import podrunner
import podspec
import proxy
from support import waiting

pytestmark = pytest.mark.cluster


def played_and_ready(
    runner: podrunner.PodRunner, namespace: str, name: str, *, what: str, timeout: float = 180
) -> localpod.LocalPod:
    """Waits until the runner plays pod `namespace/name` and its Ray answers; returns the runner's record."""

    def ready() -> localpod.LocalPod | None:
        local = runner.find(namespace, name)
        return local if local is not None and local.state == "ready" else None

    return waiting.wait(ready, timeout=timeout, what=what, diagnostics=runner.describe)


def wait_passes(runner: podrunner.PodRunner, count: int = 2) -> None:
    """Waits until the runner has completed `count` more passes. The first may have begun before this call; the
    second began after it, so it saw every change the test made before: proof that a pass had the chance to act."""
    target = runner.completed_passes + count
    waiting.wait(
        lambda: runner.completed_passes >= target,
        timeout=30,
        what=f"{count} more passes of the pod runner",
        diagnostics=runner.describe,
    )


def ray_pod(
    name: str,
    cluster: str,
    role: str,
    *,
    claim: str | None = None,
    mount_path: str = "",
    restart_policy: str = "Never",
    **spec: Any,
) -> dict[str, Any]:
    """A pod shaped as KubeRay 1.5 builds it (labels, ports, KUBERAY_GEN_RAY_START_CMD and RAY_* variables)."""
    start = (
        "ray start --head --block --dashboard-host=0.0.0.0 --metrics-export-port=8080 --num-cpus=1"
        if role == "head"
        else f"ray start --address={cluster}-head-svc.ns.svc.cluster.local:6379 --block --num-cpus=1"
    )
    container: dict[str, Any] = {
        "name": "ray-head" if role == "head" else "ray-worker",
        "image": "rayproject/ray:2.60.0",
        "ports": [
            {"name": "gcs-server", "containerPort": 6379},
            {"name": "dashboard", "containerPort": 8265},
            {"name": "client", "containerPort": 10001},
        ]
        if role == "head"
        else [],
        "env": [
            {"name": "KUBERAY_GEN_RAY_START_CMD", "value": start},
            {"name": "RAY_ADDRESS", "value": "127.0.0.1:6379"},
            {"name": "RAY_PORT", "value": "6379"},
            {"name": "RAY_USAGE_STATS_KUBERAY_IN_USE", "value": "1"},
            {"name": "RAY_CLUSTER_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}}},
            {"name": "USER_SETTING", "value": "kept"},
            {"name": "MY_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
    }
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"ray.io/node-type": role, "ray.io/cluster": cluster},
            "annotations": {podspec.PLAY_ANNOTATION: "true"},
        },
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
            "nodeSelector": {"type": "kwok"},
            **spec,
        },
    }
    if claim:
        container["volumeMounts"] = [{"name": "checkpoints", "mountPath": mount_path}]
        body["spec"]["volumes"] = [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}]
    return body


def head_service(cluster: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{cluster}-head-svc"},
        "spec": {
            "selector": {"ray.io/cluster": cluster, "ray.io/node-type": "head"},
            "ports": [
                {"name": "dashboard", "port": 8265, "targetPort": "dashboard"},
                {"name": "gcs-server", "port": 6379, "targetPort": 6379},
            ],
        },
    }


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def via_proxy(bed: proxy.ForwardProxy, url: str) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": bed.url}))
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.fixture(scope="module")
def bed(control_plane: controlplane.ControlPlane) -> Iterator[tuple[proxy.ForwardProxy, podrunner.PodRunner]]:
    with proxy.ForwardProxy() as forward, podrunner.PodRunner.for_plane(control_plane, forward) as runner:
        yield forward, runner


@pytest.fixture(scope="module")
def ray_cluster(
    control_plane: controlplane.ControlPlane, bed: tuple[proxy.ForwardProxy, podrunner.PodRunner]
) -> Iterator[dict[str, Any]]:
    """One head (mounting a PVC) and one worker, in a namespace of their own, shared by the tests below."""
    _, runner = bed
    namespace = f"t-podrunner-{uuid.uuid4().hex[:5]}"
    mount_path = f"/trun-testbed-{uuid.uuid4().hex[:6]}/checkpoints"
    control_plane.create_namespace(namespace)
    control_plane.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ray-sa"}},
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
        head_service("rc"),
        ray_pod("rc-head", "rc", "head", claim="ckpt", mount_path=mount_path, serviceAccountName="ray-sa"),
        namespace=namespace,
    )
    head = played_and_ready(runner, namespace, "rc-head", what="the head pod's Ray to answer")
    control_plane.apply(ray_pod("rc-worker", "rc", "worker"), namespace=namespace)
    worker = played_and_ready(runner, namespace, "rc-worker", what="the worker pod's Ray to start")
    try:
        yield {"namespace": namespace, "head": head, "worker": worker, "mount_path": Path(mount_path)}
    finally:
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_a_head_pod_runs_ray_with_a_fresh_home_the_project_path_and_only_the_users_variables(
    ray_cluster: dict[str, Any],
) -> None:
    head: localpod.LocalPod = ray_cluster["head"]
    assert head.process is not None
    assert os.getpgid(head.process.pid) == head.process.pid  # its own process group
    env = environ(head.process.pid)
    assert env["PATH"].split(":")[0] == str(podrunner.VENV_BIN)
    assert env["HOME"] != os.environ.get("HOME") and not (Path(env["HOME"]) / ".ray" / "auth_token").exists()
    assert env["USER_SETTING"] == "kept" and env["MY_POD_NAME"] == "rc-head"
    assert not {
        "RAY_ADDRESS",
        "RAY_PORT",
        "RAY_CLUSTER_NAME",
        "RAY_USAGE_STATS_KUBERAY_IN_USE",
        "KUBERAY_GEN_RAY_START_CMD",
    } & set(env)
    assert len(str(head.temp_dir)) < 20  # Ray's AF_UNIX socket paths must stay under 107 bytes
    cmdline = Path(f"/proc/{head.process.pid}/cmdline").read_bytes().split(b"\0")
    assert b"--num-cpus=1" in cmdline and b"--dashboard-host=127.0.0.1" in cmdline  # user's params kept, net ours
    assert len(localpod.pod_processes(head.uid)) >= 4  # gcs, raylet, dashboard, ... all carry the marker


def test_the_pod_is_reported_ready_only_once_ray_answers(
    control_plane: controlplane.ControlPlane,
    ray_cluster: dict[str, Any],
    bed: tuple[proxy.ForwardProxy, podrunner.PodRunner],
) -> None:
    events = [e for e in bed[1].events if f"{ray_cluster['namespace']}/rc-head" in e]
    reasons = [e.split("]: ", 1)[1].split(":")[0] for e in events]
    assert reasons.index("Started") < reasons.index("Ready")
    pod = control_plane.get(f"/api/v1/namespaces/{ray_cluster['namespace']}/pods/rc-head")
    assert kubeapi.condition(pod, "Ready")["status"] == "True"  # type: ignore[index]
    assert pod["status"]["containerStatuses"][0]["ready"] is True  # type: ignore[index]


def test_the_head_service_name_reaches_the_local_dashboard_through_the_proxy(
    ray_cluster: dict[str, Any], bed: tuple[proxy.ForwardProxy, podrunner.PodRunner]
) -> None:
    forward, runner = bed
    url = f"http://rc-head-svc.{ray_cluster['namespace']}.svc.cluster.local:8265"

    def routed() -> tuple[int, bytes] | None:
        answer = via_proxy(forward, f"{url}/api/version")
        return answer if answer[0] == 200 else None

    _, body = waiting.wait(routed, timeout=30, what="the route to the dashboard", diagnostics=runner.describe)
    assert json.loads(body)["ray_version"] == "2.60.0"
    assert via_proxy(forward, "http://rc-head-svc.elsewhere.svc.cluster.local:8265/api/version")[0] == 502


def test_a_worker_pod_joins_its_head(ray_cluster: dict[str, Any]) -> None:
    head: localpod.LocalPod = ray_cluster["head"]
    worker: localpod.LocalPod = ray_cluster["worker"]
    assert worker.process is not None
    assert f"--address={head.gcs_address}".encode() in Path(f"/proc/{worker.process.pid}/cmdline").read_bytes()

    def alive_nodes() -> int:
        with urllib.request.urlopen(f"{head.dashboard_url}/nodes?view=summary", timeout=5) as response:
            summary = json.loads(response.read())["data"]["summary"]
        return sum(1 for node in summary if node["raylet"]["state"] == "ALIVE")

    assert waiting.wait(lambda: alive_nodes() == 2, timeout=60, what="two alive Ray nodes")


def test_the_process_acts_as_the_pods_service_account_with_a_token_bound_to_the_pod(
    control_plane: controlplane.ControlPlane, ray_cluster: dict[str, Any]
) -> None:
    head: localpod.LocalPod = ray_cluster["head"]
    assert head.process is not None
    kubeconfig = Path(environ(head.process.pid)["KUBECONFIG"])
    review = control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
    user = json.loads(review.stdout)["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{ray_cluster['namespace']}:ray-sa"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["rc-head"]
    # RBAC is enforced for real: the ServiceAccount has no role.
    denied = control_plane.kubectl("get", "pods", kubeconfig=kubeconfig, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()


def test_the_pvc_is_bind_mounted_at_its_mount_path_in_the_pods_private_mount_namespace(
    control_plane: controlplane.ControlPlane,
    ray_cluster: dict[str, Any],
    bed: tuple[proxy.ForwardProxy, podrunner.PodRunner],
) -> None:
    namespace, head = ray_cluster["namespace"], ray_cluster["head"]
    claim = control_plane.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/ckpt")
    assert claim is not None and claim["status"]["phase"] == "Bound"  # provisioned by the runner
    directory = bed[1].claim_directory(namespace, "ckpt")
    (directory / "from-host").write_text("written on the PV")
    mount_path: Path = ray_cluster["mount_path"]
    inside = subprocess.run(
        [
            "nsenter",
            "-t",
            str(head.process.pid),
            "-m",
            "--",
            "sh",
            "-c",
            f"cat {mount_path}/from-host && echo from-pod > {mount_path}/from-pod",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout == "written on the PV"
    assert (directory / "from-pod").read_text() == "from-pod\n"
    assert mount_path.is_dir() and not any(mount_path.iterdir())  # outside the pod: an empty mountpoint only


def test_a_crashed_head_is_reported_terminated_and_failed_under_restart_policy_never(
    control_plane: controlplane.ControlPlane, namespace: str, bed: tuple[proxy.ForwardProxy, podrunner.PodRunner]
) -> None:
    runner = bed[1]
    control_plane.apply(ray_pod("crashy", "crashy", "head"), namespace=namespace)
    local = played_and_ready(runner, namespace, "crashy", what="the head's Ray to answer")
    assert local.process is not None
    os.killpg(local.process.pid, 9)
    path = f"/api/v1/namespaces/{namespace}/pods/crashy"
    pod = waiting.wait(
        lambda: (p := control_plane.get(path)) and p["status"].get("phase") == "Failed" and p,
        timeout=30,
        what="the pod Failed",
        diagnostics=runner.describe,
    )
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 137 and terminated["reason"] == "Error"
    assert kubeapi.condition(pod, "Ready")["status"] == "False"  # type: ignore[index]
    waiting.wait(lambda: not localpod.pod_processes(local.uid), timeout=15, what="no leftover Ray process")


def test_an_evicted_head_loses_its_processes_its_route_and_its_mountpoint(
    control_plane: controlplane.ControlPlane,
    ray_cluster: dict[str, Any],
    bed: tuple[proxy.ForwardProxy, podrunner.PodRunner],
) -> None:
    forward, runner = bed
    namespace, head = ray_cluster["namespace"], ray_cluster["head"]
    chaos.evict(control_plane, namespace, "rc-head")
    waiting.wait(
        lambda: not localpod.pod_processes(head.uid) and head.state == "killed",
        timeout=30,
        what="the head's processes gone",
        diagnostics=runner.describe,
    )
    status, body = via_proxy(forward, f"http://rc-head-svc.{namespace}.svc.cluster.local:8265/api/version")
    assert status == 502 and b"no route" in body
    assert not ray_cluster["mount_path"].parent.exists()  # the mountpoint the runner created is removed


def test_a_node_failure_kills_its_pods_processes_at_once(
    control_plane: controlplane.ControlPlane, namespace: str, bed: tuple[proxy.ForwardProxy, podrunner.PodRunner]
) -> None:
    runner = bed[1]
    with control_plane.lone_node() as node:
        try:
            control_plane.apply(ray_pod("on-doomed", "doomed", "head", **node.pod_fields()), namespace=namespace)
            local = played_and_ready(runner, namespace, "on-doomed", what="the head's Ray on the doomed node")
            started = time.monotonic()
            killed = chaos.fail_node(control_plane, runner, node.name, node.kubelet)
            assert [p.uid for p in killed] == [local.uid]
            assert not localpod.pod_processes(local.uid) and time.monotonic() - started < 10
            node_obj = control_plane.get(f"/api/v1/nodes/{node.name}")
            assert kubeapi.condition(node_obj, "Ready")["status"] == "Unknown"  # type: ignore[index]
            wait_passes(runner)  # passes that saw the pod on a node that is not Ready
            assert runner.find(namespace, "on-doomed") is local and local.state == "killed"  # not restarted
        finally:
            control_plane.kubectl(
                "delete",
                "pod",
                "on-doomed",
                "-n",
                namespace,
                "--force",
                "--grace-period=0",
                "--ignore-not-found",
                check=False,
            )


def test_a_pending_claim_gets_a_hostpath_volume_bound_by_claim_ref(
    control_plane: controlplane.ControlPlane, namespace: str, bed: tuple[proxy.ForwardProxy, podrunner.PodRunner]
) -> None:
    control_plane.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}},
        },
        namespace=namespace,
    )
    path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/c"
    claim = waiting.wait(
        lambda: (c := control_plane.get(path)) and c["status"].get("phase") == "Bound" and c,
        timeout=30,
        what="the claim Bound",
        diagnostics=bed[1].describe,
    )
    volume = control_plane.get(f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
    assert volume is not None
    assert volume["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert volume["spec"]["capacity"]["storage"] == "2Gi"
    assert Path(volume["spec"]["hostPath"]["path"]).is_dir()
    assert Path(volume["spec"]["hostPath"]["path"]).is_relative_to(bed[1].workdir)


def test_a_ray_labelled_pod_that_kuberay_did_not_make_is_left_to_kwok(
    control_plane: controlplane.ControlPlane, namespace: str, bed: tuple[proxy.ForwardProxy, podrunner.PodRunner]
) -> None:
    """The operator's cluster tests play KubeRay with a test double that creates Ray-labelled pods owned by the
    RayJob; the runner must not start Ray for those (only for pods a RayCluster owns, or opted in)."""
    runner = bed[1]
    body = ray_pod("double-head", "double", "head")
    del body["metadata"]["annotations"]
    control_plane.apply(body, namespace=namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/double-head"
    waiting.wait(
        lambda: (p := control_plane.get(path)) and p["status"].get("phase") == "Running",
        timeout=60,
        what="kwok to run the pod",
    )
    wait_passes(runner)  # passes that listed the pod Running on a kwok node: one the runner would have started
    assert runner.find(namespace, "double-head") is None


def test_disrupt_and_delete_sets_disruption_target_before_the_delete_and_the_runner_kills_the_head(
    control_plane: controlplane.ControlPlane, namespace: str, bed: tuple[proxy.ForwardProxy, podrunner.PodRunner]
) -> None:
    runner = bed[1]
    control_plane.apply(ray_pod("preemptee", "preemptee", "head"), namespace=namespace)
    local = played_and_ready(runner, namespace, "preemptee", what="the head's Ray to answer")
    seen: list[tuple[str, dict[str, Any]]] = []
    watching = threading.Event()

    def watch() -> None:  # every change of the pod, in order, until it is deleted
        _, pod = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/pods/preemptee")
        url = (
            f"{control_plane.server}/api/v1/namespaces/{namespace}/pods?watch=1&fieldSelector=metadata.name%3D"
            f"preemptee&resourceVersion={pod['metadata']['resourceVersion']}"
        )
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {control_plane.admin_token}"})
        context = kubeapi.verified_context(control_plane.ca_file)
        with urllib.request.urlopen(request, context=context, timeout=60) as stream:
            watching.set()
            for line in stream:
                event = json.loads(line)
                seen.append((event["type"], event["object"]))
                if event["type"] == "DELETED":
                    return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert watching.wait(10)
    chaos.disrupt_and_delete(control_plane, namespace, "preemptee")
    watcher.join(60)
    types = [t for t, _ in seen]
    assert types[-1] == "DELETED", types
    first_disrupted = next(i for i, (_, pod) in enumerate(seen) if kubeapi.condition(pod, "DisruptionTarget"))
    deleting = next(i for i, (_, pod) in enumerate(seen) if pod["metadata"].get("deletionTimestamp"))
    assert first_disrupted < deleting
    disruption = kubeapi.condition(seen[first_disrupted][1], "DisruptionTarget")
    assert disruption is not None and disruption["reason"] == "PreemptionByScheduler"
    waiting.wait(
        lambda: local.state == "killed" and not localpod.pod_processes(local.uid),
        timeout=30,
        what="the head's processes gone",
        diagnostics=runner.describe,
    )


@pytest.fixture
def kubelet_node(
    control_plane: controlplane.ControlPlane, bed: tuple[proxy.ForwardProxy, podrunner.PodRunner]
) -> Iterator[fakenodes.LoneNode]:
    """A node whose kwok leaves Ray pods' deletion to the runner, as the full-loop bed's nodes do."""
    stages = bed[1].workdir / f"stages-{uuid.uuid4().hex[:6]}.yaml"
    stages.write_text(fullloop.KWOK_POD_STAGES)
    with control_plane.lone_node("kubelet", stages=stages) as node:
        yield node


def test_a_deleted_head_runs_its_pre_stop_hook_with_its_env_and_volume_before_sigterm_and_is_deleted_after(
    control_plane: controlplane.ControlPlane,
    namespace: str,
    bed: tuple[proxy.ForwardProxy, podrunner.PodRunner],
    kubelet_node: fakenodes.LoneNode,
) -> None:
    runner = bed[1]
    mount_path = Path(f"/trun-testbed-{uuid.uuid4().hex[:6]}/checkpoints")
    control_plane.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
        namespace=namespace,
    )
    body = ray_pod("hooked", "hooked", "head", claim="ckpt", mount_path=str(mount_path), **kubelet_node.pod_fields())
    body["spec"]["terminationGracePeriodSeconds"] = 8
    hook = f'echo "$MY_POD_NAME" > {mount_path}/hook-ran; sleep 3'
    body["spec"]["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/sh", "-c", hook]}}}
    control_plane.apply(body, namespace=namespace)
    local = played_and_ready(runner, namespace, "hooked", what="the head's Ray to answer")
    path = f"/api/v1/namespaces/{namespace}/pods/hooked"
    chaos.evict(control_plane, namespace, "hooked")
    claim_dir = runner.claim_directory(namespace, "ckpt")
    waiting.wait(
        lambda: (claim_dir / "hook-ran").exists(), timeout=20, what="the hook ran", diagnostics=runner.describe
    )
    assert (claim_dir / "hook-ran").read_text() == "hooked\n"  # the container's env, and its volume mounted
    pod = control_plane.get(path)  # while the hook runs: still there, terminating, its Ray untouched
    assert pod is not None and pod["metadata"].get("deletionTimestamp")
    assert local.alive() and local.state == "killing"
    waiting.wait(lambda: control_plane.get(path) is None, timeout=30, what="the pod deleted for good")
    assert not localpod.pod_processes(local.uid) and local.state == "killed"
    hooks = [e for e in runner.events if f"{namespace}/hooked" in e and "PreStop:" in e]
    assert len(hooks) == 1 and "exit code 0" in hooks[0]


def test_a_pre_stop_hook_that_outlasts_the_grace_period_is_cut_off_and_the_pod_still_ends(
    control_plane: controlplane.ControlPlane,
    namespace: str,
    bed: tuple[proxy.ForwardProxy, podrunner.PodRunner],
    kubelet_node: fakenodes.LoneNode,
) -> None:
    runner = bed[1]
    body = ray_pod("stubborn", "stubborn", "head", **kubelet_node.pod_fields())
    body["spec"]["terminationGracePeriodSeconds"] = 2
    body["spec"]["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", "600"]}}}
    control_plane.apply(body, namespace=namespace)
    local = played_and_ready(runner, namespace, "stubborn", what="the head's Ray to answer")
    path = f"/api/v1/namespaces/{namespace}/pods/stubborn"
    started = time.monotonic()
    control_plane.kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=false")
    waiting.wait(lambda: control_plane.get(path) is None, timeout=40, what="the pod deleted for good")
    # grace 2 s for the hook, the kubelet's 2 s extension for SIGTERM, then SIGKILL: well under the hook's 600 s
    assert time.monotonic() - started < 20
    assert not localpod.pod_processes(local.uid)
    hooks = [e for e in runner.events if f"{namespace}/stubborn" in e and "PreStop:" in e]
    assert len(hooks) == 1 and "killed after 2 s" in hooks[0]


def test_a_deleted_ray_pod_the_runner_never_started_is_deleted_for_good(
    control_plane: controlplane.ControlPlane,
    namespace: str,
    bed: tuple[proxy.ForwardProxy, podrunner.PodRunner],
    kubelet_node: fakenodes.LoneNode,
) -> None:
    runner = bed[1]
    control_plane.apply(ray_pod("orphan-worker", "no-head", "worker", **kubelet_node.pod_fields()), namespace=namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/orphan-worker"
    waiting.wait(
        lambda: (p := control_plane.get(path)) and p["status"].get("phase") == "Running",
        timeout=60,
        what="kwok to run the pod",
    )
    wait_passes(runner)  # it has no head: the runner does not start it
    assert runner.find(namespace, "orphan-worker") is None
    control_plane.kubectl("delete", "pod", "orphan-worker", "-n", namespace, "--wait=false")
    waiting.wait(lambda: control_plane.get(path) is None, timeout=30, what="the pod deleted for good")
