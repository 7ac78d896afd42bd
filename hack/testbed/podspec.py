"""Reading a Ray pod as KubeRay 1.5 writes it: which pods the pod runner plays, the Ray container's environment,
the PVCs it mounts, its preStop hook, its grace period. Pure: the pod object in, values out; a Secret or ConfigMap
is read through the `lookup` the caller passes.

Who uses it: `podrunner.PodRunner` (to start and end pods) and the pod-runner tests (PLAY_ANNOTATION).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PLAY_ANNOTATION = "testbed.trainingrun.dev/play"
NODE_TYPE_LABEL, CLUSTER_LABEL = "ray.io/node-type", "ray.io/cluster"
GENERATED_COMMAND = "KUBERAY_GEN_RAY_START_CMD"
# Variables KubeRay injects into the Ray container to describe the container itself (its address, ports, name).
KUBERAY_CONTAINER_VARIABLES = frozenset(
    {
        "RAY_CLUSTER_NAME",
        "RAY_IP",
        "FQ_RAY_IP",
        "RAY_PORT",
        "RAY_ADDRESS",
        "RAY_REDIS_ADDRESS",
        "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE",
        "RAY_external_storage_namespace",
        "RAY_gcs_rpc_server_reconnect_timeout_s",
        "RAY_timeout_ms_task_wait_for_death_info",
        "RAY_gcs_server_request_timeout_seconds",
        "RAY_SERVE_KV_TIMEOUT_S",
        "RAY_USAGE_STATS_KUBERAY_IN_USE",
        "RAY_USAGE_STATS_EXTRA_TAGS",
        GENERATED_COMMAND,
        "RAY_CLOUD_INSTANCE_ID",
        "RAY_NODE_TYPE_NAME",
        "RAY_enable_autoscaler_v2",
    }
)

# (namespace, "secrets" | "configmaps", name, key) -> the decoded value, or None when it is missing.
Lookup = Callable[[str, str, str, str], str | None]


@dataclass(frozen=True)
class ClaimMount:
    """A PVC the Ray container mounts: the claim, where, which subdirectory of the volume, read-only or not."""

    claim: str
    mount_path: str
    sub_path: str
    read_only: bool


def plays(pod: dict[str, Any]) -> bool:
    """Whether the runner plays this pod: a Ray pod made by KubeRay (owned by a RayCluster), or one a test
    opted in with the PLAY_ANNOTATION (test doubles that make Ray-labelled pods of their own are left alone)."""
    meta = pod["metadata"]
    if NODE_TYPE_LABEL not in (meta.get("labels") or {}):
        return False
    owned = any(ref.get("kind") == "RayCluster" for ref in meta.get("ownerReferences") or [])
    return owned or (meta.get("annotations") or {}).get(PLAY_ANNOTATION) == "true"


def ray_container(pod: dict[str, Any]) -> dict[str, Any]:
    """KubeRay's Ray container: index 0."""
    return dict(pod["spec"]["containers"][0])


def generated_command(container: dict[str, Any]) -> str:
    """The `ray start` command KubeRay generated for the container ("" when there is none)."""
    return next((str(v.get("value", "")) for v in container.get("env") or [] if v["name"] == GENERATED_COMMAND), "")


def pre_stop_command(container: dict[str, Any]) -> list[str] | None:
    """The container's `lifecycle.preStop.exec.command`, or None (no hook, or an httpGet/sleep hook, which the
    runner does not play)."""
    command = ((container.get("lifecycle") or {}).get("preStop") or {}).get("exec", {}).get("command")
    return [str(part) for part in command] if command else None


def grace_seconds(pod: dict[str, Any], cap: float) -> float:
    """The grace period of the pod's termination (the delete's, else the spec's, else 30 s), at most `cap`."""
    seconds = pod["metadata"].get("deletionGracePeriodSeconds")
    if seconds is None:
        seconds = pod["spec"].get("terminationGracePeriodSeconds", 30)
    return float(min(seconds, cap))


def container_env(pod: dict[str, Any], container: dict[str, Any], lookup: Lookup) -> dict[str, str]:
    """The container's `env`, without KubeRay's variables about the container itself; `valueFrom` resolved
    (fieldRef from the pod, secretKeyRef and configMapKeyRef through `lookup`); unresolvable ones left out."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        name = var["name"]
        if name in KUBERAY_CONTAINER_VARIABLES:
            continue
        if "value" in var:
            env[name] = str(var["value"])
        elif "valueFrom" in var:
            value = _value_from(pod, var["valueFrom"], lookup)
            if value is not None:
                env[name] = value
    return env


def field_value(pod: dict[str, Any], path: str) -> str | None:
    """A fieldRef's value: the pod's name, namespace, uid, node, ServiceAccount, IPs, or one label/annotation."""
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": pod["spec"].get("nodeName"),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": pod["status"].get("podIP"),
        "status.hostIP": pod["status"].get("hostIP"),
    }
    if path in simple:
        return str(simple[path]) if simple[path] is not None else None
    for prefix, values in (("metadata.labels", meta.get("labels")), ("metadata.annotations", meta.get("annotations"))):
        if path.startswith(prefix + "['"):
            return (values or {}).get(path[len(prefix) + 2 : -2])
    return None


def _value_from(pod: dict[str, Any], source: dict[str, Any], lookup: Lookup) -> str | None:
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    for kind, ref_key in (("secrets", "secretKeyRef"), ("configmaps", "configMapKeyRef")):
        if ref_key in source:
            ref = source[ref_key]
            return lookup(pod["metadata"]["namespace"], kind, ref["name"], ref["key"])
    return None


def claim_mounts(pod: dict[str, Any], container: dict[str, Any]) -> list[ClaimMount]:
    """The container's volumeMounts that are PVCs (emptyDir, projected tokens and the like are not: the process
    sees the host's directory instead)."""
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or []
        if "persistentVolumeClaim" in v
    }
    return [
        ClaimMount(
            claim=claims[mount["name"]],
            mount_path=mount["mountPath"],
            sub_path=mount.get("subPath") or "",
            read_only=bool(mount.get("readOnly")),
        )
        for mount in container.get("volumeMounts") or []
        if mount["name"] in claims
    ]
