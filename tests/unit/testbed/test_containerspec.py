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
    with pytest.raises(probes.Unsupported, match="only emptyDir and projected"):
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
