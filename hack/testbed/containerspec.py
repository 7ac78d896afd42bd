"""Reading a pod's container as the kubelet runs it, turned into podman's terms: the options of its `podman run`
(user, read-only root, capabilities, seccomp, resources, volumes, environment, command and args), its volumes,
and the files of its projected volumes (the ServiceAccount token, the cluster CA, the namespace). Pure: the pod
in, values out; the token and the ConfigMap keys come through the callables the caller passes.

Who uses it: `containerpods.ContainerPods` (the pod runner's containers) and its unit tests.

Where it differs from a kubelet, by the bed's design (README, "Development: the full loop"):
- network: the container has its own network namespace on podman's bridge (podnet.py; the options come from the
  caller), as a pod has; but no pod sandbox holds it, so a restarted container gets a new namespace and maybe a
  new IP (the runner reports it as the pod's), and there is no Service network: no ClusterIP, no cluster DNS;
- KUBERNETES_SERVICE_HOST/PORT: the bed's relay to the API server on the bridge's gateway (podnet.ApiRelay), which
  stands for the `kubernetes` Service's ClusterIP that kube-proxy would translate;
- volumes: emptyDir (a directory of the pod's, mode 0777) and projected (serviceAccountToken, configMap,
  downwardAPI); any other kind, a subPath, or a startup probe fails the pod's start (probes.Unsupported).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import podspec
from probes import Unsupported

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# (audience or None, expirationSeconds) -> a token for the pod's ServiceAccount, bound to the pod
TokenSource = Callable[[str | None, int], str]
# (namespace, ConfigMap name, key) -> the value, None when the ConfigMap or the key is missing
ConfigMapKey = Callable[[str, str, str], str | None]


class VolumeNotReady(RuntimeError):
    """A projected volume's source does not exist yet (the namespace's kube-root-ca.crt, published by the
    controller manager shortly after the namespace); the kubelet retries the mount, and so does the runner."""


@dataclass(frozen=True)
class Mount:
    """A volume the container mounts: which volume, of what kind, where, and whether read-only."""

    volume: str
    kind: str  # emptyDir | projected
    target: str
    read_only: bool


def mounts(pod: dict[str, Any], container: dict[str, Any]) -> list[Mount]:
    """The container's volumeMounts with their volumes' kinds; Unsupported for a kind the bed does not make."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    found = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise Unsupported(f"{container['name']}: volumeMount {mount['name']!r} names no volume")
        kind = next((k for k in ("emptyDir", "projected") if k in volume), None)
        if kind is None:
            raise Unsupported(f"volume {mount['name']!r}: only emptyDir and projected volumes are made ({volume})")
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise Unsupported(f"{container['name']}: volumeMount {mount['name']!r} has a subPath")
        # A projected volume is always read-only (the kubelet mounts it so whatever the mount says).
        found.append(Mount(mount["name"], kind, mount["mountPath"], kind == "projected" or bool(mount.get("readOnly"))))
    return found


def projected_files(
    pod: dict[str, Any], volume_name: str, *, token: TokenSource, config_map: ConfigMapKey
) -> dict[str, str]:
    """path -> content of projected volume `volume_name`: serviceAccountToken (a token for the pod, bound to it),
    configMap items, downwardAPI items (fieldRef). VolumeNotReady when a ConfigMap key that is not optional is
    missing."""
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == volume_name]
    namespace = pod["metadata"]["namespace"]
    files: dict[str, str] = {}
    for source in volume["projected"].get("sources") or []:
        if "serviceAccountToken" in source:
            spec = source["serviceAccountToken"]
            files[spec["path"]] = token(spec.get("audience"), int(spec.get("expirationSeconds", 3600)))
        elif "configMap" in source:
            spec = source["configMap"]
            for item in spec.get("items") or []:
                value = config_map(namespace, spec["name"], item["key"])
                if value is None:
                    if spec.get("optional"):
                        continue
                    raise VolumeNotReady(f"configmap {namespace}/{spec['name']} has no key {item['key']!r} (yet)")
                files[item["path"]] = value
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                if "fieldRef" not in item:
                    raise Unsupported(f"volume {volume_name}: downwardAPI item {item} (only fieldRef)")
                files[item["path"]] = podspec.field_value(pod, item["fieldRef"]["fieldPath"]) or ""
        else:
            raise Unsupported(f"volume {volume_name}: projected source {sorted(source)}")
    return files


def user(pod: dict[str, Any], container: dict[str, Any]) -> str | None:
    """`uid[:gid]` from the security contexts (the container's over the pod's), None for the image's user;
    Unsupported when runAsNonRoot contradicts runAsUser 0 (the kubelet refuses to start it)."""
    pod_context = pod["spec"].get("securityContext") or {}
    context = {**pod_context, **(container.get("securityContext") or {})}
    uid, gid = context.get("runAsUser"), context.get("runAsGroup")
    if context.get("runAsNonRoot") and (uid is None or uid == 0):
        raise Unsupported(f"{container['name']}: runAsNonRoot with runAsUser {uid} (the bed checks only runAsUser)")
    if uid is None:
        return None
    return f"{uid}:{gid}" if gid is not None else str(uid)


def environment(
    pod: dict[str, Any], container: dict[str, Any], lookup: podspec.Lookup, *, api_host: str, api_port: int
) -> dict[str, str]:
    """The container's environment: the `kubernetes` Service's variables (at the address where the pod reaches
    the API server: the bed's relay, podnet.py), then the container's `env` (valueFrom resolved through `lookup`)."""
    env = {
        "KUBERNETES_SERVICE_HOST": api_host,
        "KUBERNETES_SERVICE_PORT": str(api_port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(api_port),
        "KUBERNETES_PORT": f"tcp://{api_host}:{api_port}",
    }
    env.update(podspec.container_env(pod, container, lookup))
    return env


def cpus(quantity: str) -> str:
    """A CPU quantity ("1", "500m", "0.5") as podman's --cpus ("0.5")."""
    if quantity.endswith("m"):
        return f"{int(quantity[:-1]) / 1000:g}"
    return f"{float(quantity):g}"


_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def memory_bytes(quantity: str) -> int:
    """A memory quantity ("512Mi", "1G", "1048576") in bytes."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i|[kMGT])?", quantity)
    if match is None:
        raise Unsupported(f"memory quantity {quantity!r}")
    return int(float(match.group(1)) * _SUFFIXES.get(match.group(2) or "", 1))


def run_options(
    pod: dict[str, Any],
    container: dict[str, Any],
    *,
    name: str,
    env: dict[str, str],
    binds: list[tuple[Path, Mount]],
    labels: dict[str, str],
    network: list[str],
) -> list[str]:
    """The options of `podman run` (before the image) for the container: `network` (podnet.PodNetwork.run_options:
    a network namespace of its own), the pod's name as its hostname, no pull, the security contexts, the limits,
    the volumes (`binds`: the host directory of each mount), the environment and the command. The args go after
    the image (`args`)."""
    spec = pod["spec"]
    context = container.get("securityContext") or {}
    pod_context = spec.get("securityContext") or {}
    hostname = spec.get("hostname") or pod["metadata"]["name"]
    options = ["--name", name, *network, "--uts", "private", "--hostname", hostname, "--pull", "never"]
    for key, value in sorted(labels.items()):
        options += ["--label", f"{key}={value}"]
    uid_gid = user(pod, container)
    if uid_gid is not None:
        options += ["--user", uid_gid]
    for group in [pod_context.get("fsGroup"), *(pod_context.get("supplementalGroups") or [])]:
        if group is not None:
            options += ["--group-add", str(group)]
    if context.get("readOnlyRootFilesystem"):
        # Without podman's own tmpfs on /run, /tmp and /var/tmp: a kubelet adds none (the chart mounts /tmp).
        options += ["--read-only", "--read-only-tmpfs=false"]
    if context.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    if context.get("privileged"):
        options.append("--privileged")
    capabilities = context.get("capabilities") or {}
    options += [a for cap in capabilities.get("drop") or [] for a in ("--cap-drop", cap.lower())]
    options += [a for cap in capabilities.get("add") or [] for a in ("--cap-add", cap.lower())]
    seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        options += ["--security-opt", "seccomp=unconfined"]
    elif seccomp not in (None, "RuntimeDefault"):
        raise Unsupported(f"{container['name']}: seccompProfile {seccomp}")
    limits = (container.get("resources") or {}).get("limits") or {}
    if "cpu" in limits:
        options += ["--cpus", cpus(str(limits["cpu"]))]
    if "memory" in limits:
        options += ["--memory", str(memory_bytes(str(limits["memory"])))]
    for source, mount in binds:
        options += ["--volume", f"{source}:{mount.target}:{'ro' if mount.read_only else 'rw'}"]
    for key, value in env.items():
        options += ["--env", f"{key}={value}"]
    if container.get("workingDir"):
        options += ["--workdir", container["workingDir"]]
    if container.get("command"):
        options += ["--entrypoint", json.dumps(container["command"])]
    return options


def args(container: dict[str, Any]) -> list[str]:
    """What goes after the image: the container's args (without them, the image's CMD; a `command` without args
    drops the image's CMD, as in Kubernetes)."""
    if container.get("args") is not None:
        return [str(a) for a in container["args"]]
    return []
