"""A pod's container in podman's terms (hack/testbed/containerspec.py): the chart's operator pod as the API server
stores it (the ServiceAccount admission's projected volume included) turned into `podman run` options, its volumes
and its projected files. Pure: dicts in, lists and dicts out; no podman, no cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import containerspec
import probes

SA = containerspec.SERVICE_ACCOUNT_DIR


def operator_pod() -> dict[str, Any]:
    """The chart's operator pod (charts/trainingrun/templates/deployment.yaml rendered), as stored: with the
    kube-api-access projected volume that the ServiceAccount admission plugin adds."""
    return {
        "metadata": {"name": "op-7d9-x2", "namespace": "trainingrun-chart", "uid": "0123456789abcdef", "labels": {}},
        "spec": {
            "serviceAccountName": "op",
            "nodeName": "fullloop-system-1",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "operator",
                    "image": "localhost/trainingrun-operator:dev",
                    "imagePullPolicy": "Never",
                    "args": ["operator", "--liveness=http://0.0.0.0:18080/healthz", "--log-level=INFO"],
                    "env": [{"name": "WATCH_NAMESPACES", "value": ""}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "resources": {"limits": {"cpu": "1", "memory": "512Mi"}, "requests": {"cpu": "100m"}},
                    "volumeMounts": [
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "kube-api-access-abcde", "mountPath": SA, "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "tmp", "emptyDir": {}},
                {
                    "name": "kube-api-access-abcde",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ],
                    },
                },
            ],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.7"},
    }


def test_the_charts_pod_runs_as_65532_read_only_without_capabilities_on_the_network_it_is_given() -> None:
    pod = operator_pod()
    (container,) = pod["spec"]["containers"]
    mounts = containerspec.mounts(pod, container)
    binds = [(Path(f"/host/{m.volume}"), m) for m in mounts]
    options = containerspec.run_options(
        pod,
        container,
        name="k8s_operator_x",
        env={"A": "1"},
        binds=binds,
        labels={"io.kubernetes.pod.name": "op"},
        network=["--network", "podman"],
    )
    joined = " ".join(options)
    assert "--name k8s_operator_x --network podman --uts private --hostname op-7d9-x2 --pull never" in joined
    assert "--user 65532:65532" in joined and "--read-only" in options
    assert "--security-opt no-new-privileges" in joined and "--cap-drop all" in joined
    assert "--cpus 1" in joined and f"--memory {512 * 2**20}" in joined
    assert f"--volume /host/tmp:/tmp:rw --volume /host/kube-api-access-abcde:{SA}:ro" in joined
    assert "--env A=1" in joined and "--label io.kubernetes.pod.name=op" in joined
    assert "--entrypoint" not in options  # no `command`: the image's entrypoint, with the container's args
    assert containerspec.args(container) == container["args"]


def test_a_command_replaces_the_images_entrypoint() -> None:
    pod = operator_pod()
    container = {**pod["spec"]["containers"][0], "command": ["python", "-m", "x"]}
    options = containerspec.run_options(pod, container, name="n", env={}, binds=[], labels={}, network=[])
    assert options[options.index("--entrypoint") + 1] == json.dumps(["python", "-m", "x"])


def test_the_projected_volume_holds_a_token_bound_to_the_pod_the_clusters_ca_and_the_namespace() -> None:
    pod = operator_pod()
    asked: list[tuple[str | None, int]] = []

    def token(audience: str | None, ttl: int) -> str:
        asked.append((audience, ttl))
        return "header.payload.signature"

    def config_map(namespace: str, name: str, key: str) -> str | None:
        published = {("trainingrun-chart", "kube-root-ca.crt", "ca.crt"): "-----BEGIN CERTIFICATE-----"}
        return published.get((namespace, name, key))

    files = containerspec.projected_files(pod, "kube-api-access-abcde", token=token, config_map=config_map)
    assert files == {
        "token": "header.payload.signature",
        "ca.crt": "-----BEGIN CERTIFICATE-----",
        "namespace": "trainingrun-chart",
    }
    assert asked == [(None, 3607)]


def test_a_missing_ca_configmap_means_the_volume_is_not_ready_yet() -> None:
    with pytest.raises(containerspec.VolumeNotReady):
        containerspec.projected_files(
            operator_pod(), "kube-api-access-abcde", token=lambda *_: "t", config_map=lambda *_: None
        )


def test_the_kubernetes_service_names_the_address_it_is_given_and_the_containers_env_follows() -> None:
    pod = operator_pod()
    env = containerspec.environment(
        pod, pod["spec"]["containers"][0], lambda *_: None, api_host="10.88.0.1", api_port=6443
    )
    assert env["KUBERNETES_SERVICE_HOST"] == "10.88.0.1" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env["WATCH_NAMESPACES"] == ""
    assert "KUBECONFIG" not in env


def test_a_volume_the_runner_cannot_make_or_a_subpath_refuses_the_pod() -> None:
    pod = operator_pod()
    pod["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    container = pod["spec"]["containers"][0]
    with pytest.raises(probes.Unsupported, match="only emptyDir, persistentVolumeClaim and projected"):
        containerspec.mounts(pod, {**container, "volumeMounts": [{"name": "root", "mountPath": "/host"}]})
    with pytest.raises(probes.Unsupported, match="subPath"):
        containerspec.mounts(pod, {**container, "volumeMounts": [{"name": "tmp", "mountPath": "/t", "subPath": "x"}]})


def test_run_as_non_root_with_user_0_refuses_the_pod_as_the_kubelet_does() -> None:
    pod = operator_pod()
    pod["spec"]["securityContext"]["runAsUser"] = 0
    with pytest.raises(probes.Unsupported, match="runAsNonRoot"):
        containerspec.user(pod, pod["spec"]["containers"][0])


@pytest.mark.parametrize(("quantity", "cpus"), [("1", "1"), ("500m", "0.5"), ("0.25", "0.25"), ("2", "2")])
def test_cpu_limits_become_podman_cpus(quantity: str, cpus: str) -> None:
    assert containerspec.cpus(quantity) == cpus


@pytest.mark.parametrize(("quantity", "size"), [("512Mi", 512 * 2**20), ("1G", 10**9), ("1024", 1024)])
def test_memory_limits_become_bytes(quantity: str, size: int) -> None:
    assert containerspec.memory_bytes(quantity) == size


def ray_head_pod() -> dict[str, Any]:
    """A Ray head pod as KubeRay makes it from the operator's RayJob (trimmed): the checkpoint PVC, a memory-backed
    /dev/shm, KubeRay's generated command, its exec probe."""
    return {
        "metadata": {"name": "tiny-a1-head-x7", "namespace": "runs", "uid": "fedcba9876543210", "labels": {}},
        "spec": {
            "containers": [
                {
                    "name": "ray-head",
                    "image": "localhost/trainingrun-runtime:dev",
                    "command": ["/bin/bash", "-c", "--"],
                    "args": ["ulimit -n 65536; ray start --head --block --dashboard-host=0.0.0.0 --num-cpus=8"],
                    "resources": {"limits": {"cpu": "2", "memory": "4Gi"}},
                    "readinessProbe": {"exec": {"command": ["bash", "-c", "wget -q -O- localhost:8265 | grep ok"]}},
                    "volumeMounts": [
                        {"name": "checkpoints", "mountPath": "/checkpoints"},
                        {"name": "shared-mem", "mountPath": "/dev/shm"},
                        {"name": "scratch", "mountPath": "/scratch"},
                    ],
                }
            ],
            "volumes": [
                {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "tiny-checkpoints"}},
                {"name": "shared-mem", "emptyDir": {"medium": "Memory"}},
                {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            ],
        },
    }


def test_a_ray_pods_claim_is_bound_from_its_volume_and_its_memory_volumes_are_sized_as_the_kubelet_sizes_them() -> None:
    pod = ray_head_pod()
    container = pod["spec"]["containers"][0]
    mounts = containerspec.mounts(pod, container)
    claim, shm, scratch = mounts
    assert (claim.kind, claim.claim, claim.read_only) == ("persistentVolumeClaim", "tiny-checkpoints", False)
    assert (shm.kind, scratch.kind, scratch.size_limit) == ("memory", "memory", "64Mi")
    binds = [(Path("/pv/tiny"), claim), (Path("/unused"), shm), (Path("/unused"), scratch)]
    options = containerspec.run_options(
        pod, container, name="c", env={}, binds=binds, labels={}, network=[],
        hosts={"tiny-a1-head-svc.runs.svc.cluster.local": "10.88.0.7"},
    )  # fmt: skip
    joined = " ".join(options)
    assert "--volume /pv/tiny:/checkpoints:rw" in joined
    assert f"--shm-size {4 * 2**30}" in joined  # no sizeLimit: the container's memory limit
    assert f"type=tmpfs,destination=/scratch,tmpfs-size={64 * 2**20},tmpfs-mode=1777" in joined
    assert "/unused" not in joined
    assert "--add-host tiny-a1-head-svc.runs.svc.cluster.local:10.88.0.7" in joined
    assert options[options.index("--entrypoint") + 1] == json.dumps(["/bin/bash", "-c", "--"])
    assert containerspec.args(container) == container["args"]  # KubeRay's command as it is


def test_a_claims_subpath_stays_inside_the_volume_and_other_kinds_take_none() -> None:
    pod = ray_head_pod()
    container = pod["spec"]["containers"][0]
    inside = {"name": "checkpoints", "mountPath": "/c", "subPath": "runs/tiny", "readOnly": True}
    (mount,) = containerspec.mounts(pod, {**container, "volumeMounts": [inside]})
    assert (mount.sub_path, mount.read_only) == ("runs/tiny", True)
    with pytest.raises(probes.Unsupported, match="leaves it"):
        containerspec.mounts(pod, {**container, "volumeMounts": [{**inside, "subPath": "../other"}]})
    with pytest.raises(probes.Unsupported, match="subPath"):
        containerspec.mounts(pod, {**container, "volumeMounts": [{**inside, "name": "scratch"}]})


def test_a_memory_volume_without_any_limit_gets_the_beds_bound() -> None:
    mount = containerspec.Mount("shm", "memory", "/dev/shm", False)
    assert containerspec.memory_volume(mount) == ["--shm-size", str(containerspec.memory_bytes("1Gi"))]
