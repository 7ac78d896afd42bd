"""Reading a pod's container as the kubelet runs it, turned into podman's terms: the options of its `podman run`
(user, read-only root, capabilities, seccomp, resources, volumes, environment, command and args), its volumes,
and the files of its projected volumes (the ServiceAccount token, the cluster CA, the namespace). Pure: the pod
in, values out; the token and the ConfigMap keys come through the callables the caller passes.

Who uses it: `containerpods.ContainerPods` (the pod runner's containers) and its unit tests.

Where it differs from a kubelet, by the bed's design (docs/testbed.md, "The full loop"):
- network: the container has its own network namespace on podman's bridge (podnet.py; the options come from the
  caller), as a pod has; but no pod sandbox holds it, so a restarted container gets a new namespace and maybe a
  new IP (the runner reports it as the pod's), and there is no Service network: no ClusterIP, no cluster DNS;
- KUBERNETES_SERVICE_HOST/PORT: the bed's relay to the API server on the bridge's gateway (podnet.ApiRelay), which
  stands for the `kubernetes` Service's ClusterIP that kube-proxy would translate;
- service names: no cluster DNS; the names a pod must resolve (a RayCluster's head Service) come from the caller
  as `--add-host` entries (the head container's IP), fixed when the container starts;
- volumes: emptyDir (a directory of the pod's, mode 0777; medium Memory: a tmpfs, and at /dev/shm podman's
  --shm-size), persistentVolumeClaim (the claim's PV directory on this machine, from the caller; a subPath inside
  it) and projected (serviceAccountToken, configMap, downwardAPI); any other kind, a subPath of another kind, or a
  startup probe fails the pod's start (probes.Unsupported).
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
    kind: str  # emptyDir | memory (emptyDir, medium Memory) | persistentVolumeClaim | projected
    target: str
    read_only: bool
    claim: str = ""  # persistentVolumeClaim: the claim's name
    sub_path: str = ""  # persistentVolumeClaim: a directory inside the volume
    size_limit: str = ""  # memory: the emptyDir's sizeLimit, if set


def mounts(pod: dict[str, Any], container: dict[str, Any]) -> list[Mount]:
    """The container's volumeMounts with their volumes' kinds; Unsupported for a kind the bed does not make."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    found = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise Unsupported(f"{container['name']}: volumeMount {mount['name']!r} names no volume")
        kind = next((k for k in ("emptyDir", "persistentVolumeClaim", "projected") if k in volume), None)
        if kind is None:
            raise Unsupported(
                f"volume {mount['name']!r}: only emptyDir, persistentVolumeClaim and projected volumes are made "
                f"({volume})"
            )
        sub_path = mount.get("subPath") or ""
        if mount.get("subPathExpr") or (sub_path and kind != "persistentVolumeClaim"):
            raise Unsupported(f"{container['name']}: volumeMount {mount['name']!r} has a subPath")
        if sub_path and (sub_path.startswith("/") or ".." in sub_path.split("/")):
            raise Unsupported(f"{container['name']}: volumeMount {mount['name']!r}: subPath {sub_path!r} leaves it")
        read_only = kind == "projected" or bool(mount.get("readOnly"))  # projected: read-only whatever it says
        if kind == "persistentVolumeClaim":
            claim = volume["persistentVolumeClaim"]
            read_only = read_only or bool(claim.get("readOnly"))
            found.append(Mount(mount["name"], kind, mount["mountPath"], read_only, claim["claimName"], sub_path))
        elif kind == "emptyDir" and (volume["emptyDir"] or {}).get("medium") == "Memory":
            size = str((volume["emptyDir"] or {}).get("sizeLimit") or "")
            found.append(Mount(mount["name"], "memory", mount["mountPath"], read_only, size_limit=size))
        else:
            found.append(Mount(mount["name"], kind, mount["mountPath"], read_only))
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
    hosts: dict[str, str] | None = None,
) -> list[str]:
    """The options of `podman run` (before the image) for the container: `network` (podnet.PodNetwork.run_options:
    a network namespace of its own), `hosts` (name -> IP, what the pod resolves without cluster DNS), the pod's
    name as its hostname, no pull, the security contexts, the limits, the volumes (`binds`: the host directory of
    each mount; a memory emptyDir's is not used), the environment and the command. The args go after the image
    (`args`)."""
    spec = pod["spec"]
    context = container.get("securityContext") or {}
    pod_context = spec.get("securityContext") or {}
    hostname = spec.get("hostname") or pod["metadata"]["name"]
    options = ["--name", name, *network, "--uts", "private", "--hostname", hostname, "--pull", "never"]
    for host, address in sorted((hosts or {}).items()):
        options += ["--add-host", f"{host}:{address}"]
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
        if mount.kind == "memory":
            options += memory_volume(mount, limits.get("memory"))
        else:
            options += ["--volume", f"{source}:{mount.target}:{'ro' if mount.read_only else 'rw'}"]
    for key, value in env.items():
        options += ["--env", f"{key}={value}"]
    if container.get("workingDir"):
        options += ["--workdir", container["workingDir"]]
    if container.get("command"):
        options += ["--entrypoint", json.dumps(container["command"])]
    return options


DEFAULT_MEMORY_VOLUME = "1Gi"
"""A memory emptyDir's size when neither its sizeLimit nor the container's memory limit sets one (a kubelet would
let it grow to the node's memory; the bed keeps a bound)."""


def memory_volume(mount: Mount, memory_limit: object = None) -> list[str]:
    """`podman run` options for a memory-backed emptyDir: its size is the sizeLimit, else the container's memory
    limit (as the kubelet sizes it), else DEFAULT_MEMORY_VOLUME; at /dev/shm, podman's own shm mount resized
    (Ray's object store lives there), elsewhere a tmpfs that any user of the pod may write."""
    size = memory_bytes(mount.size_limit or str(memory_limit or DEFAULT_MEMORY_VOLUME))
    if mount.target == "/dev/shm":
        return ["--shm-size", str(size)]
    return ["--mount", f"type=tmpfs,destination={mount.target},tmpfs-size={size},tmpfs-mode=1777"]


def args(container: dict[str, Any]) -> list[str]:
    """What goes after the image: the container's args (without them, the image's CMD; a `command` without args
    drops the image's CMD, as in Kubernetes)."""
    if container.get("args") is not None:
        return [str(a) for a in container["args"]]
    return []
