"""The pod runner: a TEST COMPONENT that plays the kubelet for Ray pods, because this machine has no container runtime.

Who calls it: the full-loop fixtures (tests/e2e/conftest.py), the pod-runner tests, and people, through

    .venv/bin/python hack/testbed/podrunner.py up

which starts the control plane, the proxy, this runner and the real KubeRay operator, and prints the kubeconfig.

kwok still plays the pods' phase (Running, a fake pod IP, deletion); this runner adds what kwok cannot, the process:

    kube-scheduler binds a KubeRay pod (label ray.io/node-type) to a kwok node; kwok sets it Running and Ready
      └── runner (level-triggered, every `interval`):
          ├── head pod  ──> `ray start --head --block` on free loopback ports, own session/process group,
          │                 short --temp-dir (AF_UNIX paths < 107 bytes), fresh HOME (Ray 2.60 turns on dashboard
          │                 token auth when ~/.ray/auth_token exists; KubeRay 1.5 sends no token), the project's
          │                 .venv/bin first on PATH, the pod's env minus KubeRay's RAY_* container variables
          ├── worker pod ──> `ray start --address 127.0.0.1:<head gcs port> --block` once its head is up
          ├── identity  ──> a TokenRequest token bound to the pod (as the kubelet mints), in a kubeconfig that
          │                 KUBECONFIG names; the driver's client falls back to it outside a cluster
          ├── volumes   ──> each PVC mounted by the Ray container is bind-mounted from its PV's hostPath at the
          │                 container's mountPath inside a private mount namespace (`unshare -m`; needs root)
          ├── readiness ──> Ready=False while Ray starts, True once Ray answers; the container's termination is
          │                 reported (phase Failed/Succeeded under restartPolicy Never, else restarted with backoff)
          ├── routes    ──> for every Service that selects a running head: `<svc>.<ns>.svc.cluster.local:<port>`
          │                 -> the matching local port, in the forward proxy (DNS plus kube-proxy, for KubeRay)
          ├── endings   ──> pod deleted/evicted: SIGTERM, then SIGKILL after its grace period (capped);
          │                 node not Ready: SIGKILL at once (the machine is gone); nothing is restarted after that
          └── provisioner ─> a hostPath PV pre-bound by claimRef for every pending PVC

Every process of a pod carries TRUN_TESTBED_POD=<pod uid> in its environment, so a kill finds the Ray workers too.
Standard library only (plus `controlplane` and `proxy` from this directory).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import controlplane  # noqa: E402
import kubeapi  # noqa: E402
import proxy  # noqa: E402
from trainingrun_operator import processes  # noqa: E402

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
VENV_BIN = REPO_ROOT / ".venv" / "bin"
POD_MARKER = "TRUN_TESTBED_POD"
PLAY_ANNOTATION = "testbed.trainingrun.dev/play"
NODE_TYPE_LABEL, CLUSTER_LABEL = "ray.io/node-type", "ray.io/cluster"
CLUSTER_DOMAIN = "cluster.local"
# Variables KubeRay injects into the Ray container to describe the container itself (its address, ports, name).
KUBERAY_CONTAINER_VARIABLES = frozenset({
    "RAY_CLUSTER_NAME", "RAY_IP", "FQ_RAY_IP", "RAY_PORT", "RAY_ADDRESS", "RAY_REDIS_ADDRESS",
    "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "RAY_external_storage_namespace", "RAY_gcs_rpc_server_reconnect_timeout_s",
    "RAY_timeout_ms_task_wait_for_death_info", "RAY_gcs_server_request_timeout_seconds", "RAY_SERVE_KV_TIMEOUT_S",
    "RAY_USAGE_STATS_KUBERAY_IN_USE", "RAY_USAGE_STATS_EXTRA_TAGS", "KUBERAY_GEN_RAY_START_CMD",
    "RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME", "RAY_enable_autoscaler_v2",
})
# `ray start` parameters that describe the container's network or files; the runner chooses its own.
RUNNER_OWNED_PARAMS = frozenset({
    "head", "block", "address", "port", "node-ip-address", "temp-dir", "dashboard-host", "dashboard-port",
    "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port", "ray-client-server-port",
    "node-manager-port", "object-manager-port", "runtime-env-agent-port", "min-worker-port", "max-worker-port",
    "worker-port-list", "disable-usage-stats",
})
# KubeRay's container ports (constant.go) -> the local port the runner chose for that role.
GCS_PORT, DASHBOARD_PORT, CLIENT_PORT, AGENT_PORT = 6379, 8265, 10001, 52365


class RunnerError(RuntimeError):
    """The runner could not do what a kubelet would (start a pod, mount a volume); the message says which pod."""


def parse_ray_start(command: str) -> dict[str, str]:
    """`ray start --head --num-cpus=2 --block` -> {"head": "true", "num-cpus": "2", "block": "true"}."""
    params: dict[str, str] = {}
    words = shlex.split(command)
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            key, sep, value = word[2:].partition("=")
            if not sep and i + 1 < len(words) and not words[i + 1].startswith("--"):
                value, i = words[i + 1], i + 1
            params[key] = value if (sep or value) else "true"
        i += 1
    return params


def ray_start_args(params: dict[str, str]) -> list[str]:
    """The user's `ray start` parameters as flags, without the ones the runner owns."""
    args = []
    for key in sorted(params):
        if key in RUNNER_OWNED_PARAMS:
            continue
        value = params[key]
        args.append(f"--{key}" if value.lower() == "true" and key not in ("log-color", "include-dashboard")
                    else f"--{key}={value}")
    return args


def plays(pod: dict[str, Any]) -> bool:
    """Whether the runner plays this pod: a Ray pod made by KubeRay (owned by a RayCluster), or one a test
    opted in with the PLAY_ANNOTATION (test doubles that make Ray-labelled pods of their own are left alone)."""
    meta = pod["metadata"]
    if NODE_TYPE_LABEL not in (meta.get("labels") or {}):
        return False
    owned = any(ref.get("kind") == "RayCluster" for ref in meta.get("ownerReferences") or [])
    return owned or (meta.get("annotations") or {}).get(PLAY_ANNOTATION) == "true"


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in (obj or {}).get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def node_ready(node: dict[str, Any] | None) -> bool:
    return (condition(node, "Ready") or {}).get("status") == "True"


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(eq=False)
class LocalPod:
    """One pod this runner plays: its identity, its process and what it was given."""

    uid: str
    namespace: str
    name: str
    node: str
    role: str  # head | worker
    cluster: str
    container: str
    restart_policy: str
    grace_seconds: float
    directory: Path  # HOME, logs, kubeconfig
    temp_dir: Path  # Ray's --temp-dir (short)
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    process: subprocess.Popen[bytes] | None = None
    state: str = "pending"  # pending | starting | ready | exited | backoff | killing | killed | detached
    restarts: int = 0
    exit_code: int | None = None
    started_at: str = ""
    restart_after: float = 0.0
    routes: dict[str, int] = field(default_factory=dict)  # proxy authority -> local port
    mountpoints: list[Path] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def log_path(self) -> Path:
        return self.directory / f"ray-{self.restarts}.log"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.ports[GCS_PORT]}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[DASHBOARD_PORT]}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def job_driver_logs(self) -> dict[str, str]:
        """Ray's per-job driver logs (`job-driver-<submission id>.log`) from this head's session, by file name."""
        return {path.name: path.read_text(errors="replace")
                for path in sorted(self.temp_dir.glob("session_*/logs/job-driver-*.log"))}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def pod_processes(uid: str) -> list[int]:
    """Every process whose environment carries this pod's marker (the Ray processes a pod's `ray start` spawned)."""
    return processes.carrying(POD_MARKER, uid)


def signal_pod(uid: str, leader: subprocess.Popen[bytes] | None, sig: int) -> int:
    """Sends `sig` to every process carrying the pod's marker, and to the process group of its `ray start` while
    that leader is not yet reaped (after that its pid, hence the group id, may belong to someone else). Returns
    how many were signalled."""
    count = 0
    if leader is not None and leader.poll() is None:
        try:
            os.killpg(leader.pid, sig)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pod_processes(uid):
        try:
            os.kill(pid, sig)
            count += 1
        except ProcessLookupError:
            pass
    return count


@dataclass(eq=False)
class PodRunner:
    """Plays the kubelet for KubeRay's pods on kwok nodes (see the module docstring); `start()`/`stop()`."""

    server: str
    ca_file: Path
    admin_token: str
    forward_proxy: proxy.ForwardProxy
    interval: float = 0.3
    grace_cap: float = 10.0
    object_store_bytes: int = 256 * 1024 * 1024
    venv_bin: Path = VENV_BIN
    keep_workdir: bool = field(default_factory=lambda: os.environ.get("TESTBED_KEEP") == "1")

    workdir: Path = field(init=False)
    pods: dict[str, LocalPod] = field(init=False, default_factory=dict)
    events: list[str] = field(init=False, default_factory=list)
    _api: kubeapi.KubeApi = field(init=False)
    _lock: threading.RLock = field(init=False, default_factory=threading.RLock)
    _thread: threading.Thread | None = field(init=False, default=None)
    _stopping: threading.Event = field(init=False, default_factory=threading.Event)
    _mountpoints: dict[Path, int] = field(init=False, default_factory=dict)  # created by us -> users
    _provisioned: set[str] = field(init=False, default_factory=set)  # PV names
    _extra_env: list[tuple[dict[str, str], dict[str, str]]] = field(init=False, default_factory=list)
    _pass_error: str = field(init=False, default="")

    @classmethod
    def for_plane(cls, plane: controlplane.ControlPlane, forward_proxy: proxy.ForwardProxy,
                  **options: Any) -> PodRunner:
        return cls(server=plane.server, ca_file=plane.ca_file, admin_token=plane.admin_token,
                   forward_proxy=forward_proxy, **options)

    # -- life cycle ---------------------------------------------------------------------------------------

    def start(self) -> PodRunner:
        self.workdir = Path(tempfile.mkdtemp(prefix="trun-pr-"))
        (self.workdir / "volumes").mkdir()
        self._api = kubeapi.KubeApi(self.server, kubeapi.verified_context(self.ca_file), self.admin_token)
        self._stopping.clear()
        atexit.register(self.stop)
        self._thread = threading.Thread(target=self._loop, name="podrunner", daemon=True)
        self._thread.start()
        log.info("pod runner started (workdir %s)", self.workdir)
        return self

    def stop(self) -> None:
        """Kills every pod's processes (SIGKILL), drops its routes and removes what it created; idempotent."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        with self._lock:
            pods = list(self.pods.values())
        for pod in pods:
            if pod.state != "killed" or pod_processes(pod.uid):
                self._kill(pod, "runner stopped", grace=0.0, final_state="killed", wait=True)
        for pod in pods:
            if not self.keep_workdir:
                shutil.rmtree(pod.temp_dir, ignore_errors=True)
        for mountpoint in sorted(self._mountpoints, key=lambda p: len(p.parts), reverse=True):
            _remove_empty_dirs(mountpoint)
        self._mountpoints.clear()
        atexit.unregister(self.stop)
        workdir = getattr(self, "workdir", None)
        if workdir is not None and workdir.exists() and not self.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- what tests and chaos use ------------------------------------------------------------------------

    def find(self, namespace: str, name: str) -> LocalPod | None:
        with self._lock:
            found = [p for p in self.pods.values() if p.namespace == namespace and p.name == name]
        return found[-1] if found else None

    def head(self, namespace: str, cluster: str) -> LocalPod | None:
        """The newest live head this runner plays for RayCluster `namespace/cluster`."""
        with self._lock:
            heads = [p for p in self.pods.values() if p.namespace == namespace and p.cluster == cluster
                     and p.role == "head" and p.state in ("starting", "ready")]
        return heads[-1] if heads else None

    def add_env(self, match_labels: dict[str, str], env: dict[str, str]) -> None:
        """Test knob: pods started from now on whose labels include `match_labels` also get `env` (as a
        mutating admission webhook would add it). The driver's crash points (TRAININGRUN_CRASH_AT) are armed so."""
        with self._lock:
            self._extra_env.append((dict(match_labels), dict(env)))

    def detach(self, uid: str) -> LocalPod:
        """Forgets a pod's processes without killing them: what a partitioned node looks like from the API
        server (chaos uses it to leave a zombie running). `stop()` still kills them."""
        with self._lock:
            pod = self.pods[uid]
            pod.state = "detached"
        self._drop_routes(pod)  # a partitioned node is unreachable
        self._event(pod, "Detached", "processes left running (partitioned node)")
        return pod

    def kill_node(self, node: str) -> list[LocalPod]:
        """SIGKILLs every process of every pod on `node`, as when the machine dies."""
        with self._lock:
            victims = [p for p in self.pods.values() if p.node == node and p.state in ("starting", "ready", "backoff")]
        for pod in victims:
            self._kill(pod, f"node {node} failed", grace=0.0, final_state="killed", wait=True)
        return victims

    def describe(self) -> str:
        """A dump for failing tests: every pod's state and log tail, and the runner's event list."""
        with self._lock:
            lines = [f"runner events:\n  " + "\n  ".join(self.events[-40:]), f"last pass error: {self._pass_error}"]
            for pod in self.pods.values():
                lines.append(f"--- {pod.key} ({pod.role}, {pod.state}, exit {pod.exit_code}) {pod.log_path}\n"
                             f"{pod.log_tail(15)}")
        return "\n".join(lines)

    # -- the loop ------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._pass()
                self._pass_error = ""
            except Exception as err:  # the loop must survive API hiccups; the next pass retries
                self._pass_error = f"{type(err).__name__}: {err}"
                log.warning("pod runner pass failed: %s", self._pass_error)
            self._stopping.wait(self.interval)

    def _pass(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self._api.items("/api/v1/nodes")}
        pods = self._api.items(f"/api/v1/pods?labelSelector={urllib.parse.quote(NODE_TYPE_LABEL)}")
        self._provision()
        seen = set()
        for pod in pods:
            if not plays(pod):
                continue
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            with self._lock:
                local = self.pods.get(uid)
            node = nodes.get(pod["spec"].get("nodeName") or "")
            if local is None:
                if self._should_start(pod, node):
                    self._start(pod)
                continue
            if local.state in ("killing", "killed", "detached"):
                continue
            if node is None or not node_ready(node):
                self._kill(local, f"node {local.node} not Ready", grace=0.0, final_state="killed")
            elif pod["metadata"].get("deletionTimestamp"):
                self._kill(local, "pod deleted", grace=self._grace(pod), final_state="killed")
            else:
                self._tend(local, pod)
        with self._lock:
            gone = [p for uid, p in self.pods.items() if uid not in seen and p.state not in ("killed", "detached")]
        for local in gone:
            if local.state != "killing":
                self._kill(local, "pod gone", grace=local.grace_seconds, final_state="killed")
        self._sync_routes()

    def _should_start(self, pod: dict[str, Any], node: dict[str, Any] | None) -> bool:
        meta, status = pod["metadata"], pod.get("status", {})
        if node is None or controlplane.KWOK_ANNOTATION not in (node["metadata"].get("annotations") or {}):
            return False
        if meta.get("deletionTimestamp") or not node_ready(node):
            return False
        # kwok has played the pod (Running, pod IP): from here on, only this runner writes its status.
        if status.get("phase") != "Running" or not status.get("podIP"):
            return False
        if meta["labels"].get(NODE_TYPE_LABEL) == "worker":
            head = self.head(meta["namespace"], meta["labels"].get(CLUSTER_LABEL, ""))
            return head is not None and head.state == "ready"
        return True

    def _grace(self, pod: dict[str, Any]) -> float:
        seconds = pod["metadata"].get("deletionGracePeriodSeconds")
        if seconds is None:
            seconds = pod["spec"].get("terminationGracePeriodSeconds", 30)
        return float(min(seconds, self.grace_cap))

    # -- starting ------------------------------------------------------------------------------------------

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        container = spec["containers"][0]  # KubeRay's Ray container is index 0
        role = meta["labels"][NODE_TYPE_LABEL]
        directory = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        directory.mkdir(parents=True)
        local = LocalPod(
            uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], node=spec["nodeName"], role=role,
            cluster=meta["labels"].get(CLUSTER_LABEL, ""), container=container["name"],
            restart_policy=spec.get("restartPolicy", "Always"),
            grace_seconds=float(min(spec.get("terminationGracePeriodSeconds", 30), self.grace_cap)),
            directory=directory, temp_dir=Path(tempfile.mkdtemp(prefix="rp", dir="/tmp")))
        with self._lock:
            self.pods[local.uid] = local
        try:
            env = self._environment(pod, container, local)
            mounts = self._mounts(pod, container)
            self._launch(local, container, env, mounts)
        except Exception as err:
            local.state = "exited"
            self._event(local, "FailedToStart", str(err))
            self._patch_terminated(local, exit_code=128, reason="StartError", message=str(err)[:500])
            raise

    def _environment(self, pod: dict[str, Any], container: dict[str, Any], local: LocalPod) -> dict[str, str]:
        home = local.directory / "home"
        home.mkdir(exist_ok=True)  # fresh: no ~/.ray/auth_token from an earlier ray.init()
        env = {"PATH": f"{self.venv_bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
               "HOSTNAME": local.name, "PYTHONUNBUFFERED": "1", POD_MARKER: local.uid}
        if pod["spec"].get("automountServiceAccountToken", True):
            env["KUBECONFIG"] = str(self._pod_kubeconfig(pod, local))
        for var in container.get("env") or []:
            name = var["name"]
            if name in KUBERAY_CONTAINER_VARIABLES:
                continue
            if "value" in var:
                env[name] = str(var["value"])
            elif "valueFrom" in var:
                value = self._value_from(pod, var["valueFrom"])
                if value is not None:
                    env[name] = value
        labels = pod["metadata"].get("labels") or {}
        with self._lock:
            for match, extra in self._extra_env:
                if all(labels.get(k) == v for k, v in match.items()):
                    env.update(extra)
        return env

    def _value_from(self, pod: dict[str, Any], source: dict[str, Any]) -> str | None:
        meta = pod["metadata"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                      "metadata.uid": meta["uid"], "spec.nodeName": pod["spec"].get("nodeName"),
                      "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
                      "status.podIP": pod["status"].get("podIP"), "status.hostIP": pod["status"].get("hostIP")}
            if path in simple:
                return str(simple[path]) if simple[path] is not None else None
            for prefix, values in (("metadata.labels", meta.get("labels")),
                                   ("metadata.annotations", meta.get("annotations"))):
                if path.startswith(prefix + "['"):
                    return (values or {}).get(path[len(prefix) + 2:-2])
            return None
        for kind, ref_key in (("secrets", "secretKeyRef"), ("configmaps", "configMapKeyRef")):
            if ref_key in source:
                ref = source[ref_key]
                status, obj = self._api.request("GET", f"/api/v1/namespaces/{meta['namespace']}/{kind}/{ref['name']}")
                if status != 200:
                    return None
                data = obj.get("data") or {}
                if kind == "secrets" and ref["key"] in data:
                    return base64.b64decode(data[ref["key"]]).decode()
                return data.get(ref["key"])
        return None

    def _pod_kubeconfig(self, pod: dict[str, Any], local: LocalPod) -> Path:
        """A token for the pod's ServiceAccount bound to the pod (invalid once the pod is gone), as a kubelet
        projects it, written into a kubeconfig."""
        return kubeapi.service_account_kubeconfig(
            self._api, pod["metadata"]["namespace"], pod["spec"].get("serviceAccountName") or "default",
            ca_file=self.ca_file, out=local.directory / "kubeconfig", bound_pod=pod)

    def _mounts(self, pod: dict[str, Any], container: dict[str, Any]) -> list[tuple[Path, Path, bool]]:
        """(source directory, mountPath, readOnly) for each PVC the Ray container mounts."""
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in pod["spec"].get("volumes") or [] if "persistentVolumeClaim" in v}
        mounts = []
        for mount in container.get("volumeMounts") or []:
            claim = claims.get(mount["name"])
            if claim is None:
                continue  # emptyDir, projected token, ...: the process sees the host's directory instead
            source = self._claim_directory(pod["metadata"]["namespace"], claim)
            if mount.get("subPath"):
                source = source / mount["subPath"]
                source.mkdir(parents=True, exist_ok=True)
            mounts.append((source, Path(mount["mountPath"]), bool(mount.get("readOnly"))))
        return mounts

    def _claim_directory(self, namespace: str, claim: str) -> Path:
        status, pvc = self._api.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        if status != 200 or pvc.get("status", {}).get("phase") != "Bound":
            raise RunnerError(f"PVC {namespace}/{claim} is not Bound ({status})")
        status, pv = self._api.request("GET", f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
        path = (pv.get("spec", {}).get("hostPath") or {}).get("path") if status == 200 else None
        if not path:
            raise RunnerError(f"PV {pvc['spec']['volumeName']} of PVC {namespace}/{claim} has no hostPath")
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)

    def _launch(self, local: LocalPod, container: dict[str, Any], env: dict[str, str],
                mounts: list[tuple[Path, Path, bool]]) -> None:
        generated = next((v.get("value", "") for v in container.get("env") or []
                          if v["name"] == "KUBERAY_GEN_RAY_START_CMD"), "")
        params = parse_ray_start(generated) if generated else {}
        if "object-store-memory" not in params:
            params["object-store-memory"] = str(self.object_store_bytes)
        local.ports = local.ports or {port: controlplane.free_port()
                                      for port in (GCS_PORT, DASHBOARD_PORT, CLIENT_PORT, AGENT_PORT)}
        ray = [str(self.venv_bin / "ray"), "start", "--block", "--disable-usage-stats",
               "--node-ip-address=127.0.0.1", f"--temp-dir={local.temp_dir}",
               f"--dashboard-agent-listen-port={local.ports[AGENT_PORT]}"]
        if local.role == "head":
            ray += ["--head", f"--port={local.ports[GCS_PORT]}", "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={local.ports[DASHBOARD_PORT]}",
                    f"--ray-client-server-port={local.ports[CLIENT_PORT]}"]
        else:
            head = self.head(local.namespace, local.cluster)
            if head is None:
                raise RunnerError(f"worker {local.key}: no running head for cluster {local.cluster}")
            ray.append(f"--address={head.gcs_address}")
        ray += ray_start_args(params)
        command = ray
        if mounts:
            script = []
            for source, target, read_only in mounts:
                self._ensure_mountpoint(target, local)
                script.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}")
                if read_only:
                    script.append(f"mount -o remount,bind,ro {shlex.quote(str(target))}")
            script.append("exec " + shlex.join(ray))
            command = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", "; ".join(script)]
        cwd = container.get("workingDir") or env["HOME"]
        with open(local.log_path, "wb") as log_file:
            local.process = subprocess.Popen(command, env=env, cwd=cwd if Path(cwd).is_dir() else env["HOME"],
                                             stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                             start_new_session=True, preexec_fn=controlplane.die_with_parent(signal.SIGTERM))
        local.state, local.started_at, local.exit_code = "starting", now_rfc3339(), None
        self._event(local, "Started", f"pid {local.process.pid}: {shlex.join(command)[:300]}")
        self._patch_status(local, ready=False, running=True)

    def _ensure_mountpoint(self, target: Path, local: LocalPod) -> None:
        """The mountPath must exist on the host filesystem (it is shared); create it and remember to remove it."""
        missing = target
        while not missing.parent.exists():
            missing = missing.parent
        if not target.exists():
            target.mkdir(parents=True)
            with self._lock:
                self._mountpoints[missing] = self._mountpoints.get(missing, 0) + 1
            local.mountpoints.append(missing)
        elif target in self._mountpoints or any(p in target.parents for p in self._mountpoints):
            root = next(p for p in self._mountpoints if p == target or p in target.parents)
            with self._lock:
                self._mountpoints[root] += 1
            local.mountpoints.append(root)

    # -- running -------------------------------------------------------------------------------------------

    def _tend(self, local: LocalPod, pod: dict[str, Any]) -> None:
        """Readiness, exits and restarts of one running pod."""
        if local.state == "backoff":
            if time.monotonic() >= local.restart_after:
                local.restarts += 1
                container = pod["spec"]["containers"][0]
                self._launch(local, container, self._environment(pod, container, local), self._mounts(pod, container))
            return
        if local.process is None or local.state not in ("starting", "ready"):
            return
        code = local.process.poll()
        if code is not None:
            code = 128 - code if code < 0 else code  # killed by signal N: 128+N, as a container runtime reports
            local.exit_code = code
            self._drop_routes(local)
            self._event(local, "Exited", f"exit code {code}; log tail:\n{local.log_tail(10)}")
            signal_pod(local.uid, local.process, signal.SIGKILL)  # leftovers of a crashed ray start
            restart = local.restart_policy == "Always" or (local.restart_policy == "OnFailure" and code != 0)
            if restart:
                local.state = "backoff"
                local.restart_after = time.monotonic() + min(10.0 * 2 ** local.restarts, 300.0)
                self._patch_terminated(local, exit_code=code, reason="Error" if code else "Completed",
                                       phase=None, waiting=True)
            else:
                local.state = "exited"
                self._patch_terminated(local, exit_code=code, reason="Error" if code else "Completed",
                                       phase="Failed" if code else "Succeeded")
            return
        if local.state == "starting" and self._ray_answers(local):
            local.state = "ready"
            self._event(local, "Ready", "Ray answers")
            self._patch_status(local, ready=True, running=True)

    def _ray_answers(self, local: LocalPod) -> bool:
        try:
            started = "Ray runtime started" in local.log_path.read_text(errors="replace")
        except OSError:
            return False
        if not started or local.role != "head":
            return started
        try:
            with urllib.request.urlopen(f"{local.dashboard_url}/api/version", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    # -- stopping ------------------------------------------------------------------------------------------

    def _kill(self, local: LocalPod, why: str, *, grace: float, final_state: str, wait: bool = False) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (0: SIGKILL at once), in a thread unless `wait`."""
        with self._lock:
            if local.state in ("killing", "killed") and not wait:
                return
            detached = local.state == "detached"
            local.state = "killing"
        self._drop_routes(local)
        self._event(local, "Killing", why)

        def finish() -> None:
            if grace > 0:
                signal_pod(local.uid, local.process, signal.SIGTERM)
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and pod_processes(local.uid):
                    time.sleep(0.2)
            for _ in range(50):
                if not signal_pod(local.uid, local.process, signal.SIGKILL) and not pod_processes(local.uid):
                    break
                time.sleep(0.1)
            if local.process is not None:
                try:
                    local.process.wait(10)
                    local.exit_code = local.process.returncode
                except subprocess.TimeoutExpired:
                    pass
            self._release_mountpoints(local)  # Ray's logs stay in temp_dir until the runner stops
            local.state = final_state
            self._event(local, "Killed", f"{why} (was detached: {detached})")

        if wait:
            finish()
        else:
            threading.Thread(target=finish, name=f"kill-{local.name}", daemon=True).start()

    def _release_mountpoints(self, local: LocalPod) -> None:
        with self._lock:
            for root in local.mountpoints:
                self._mountpoints[root] -= 1
                if self._mountpoints[root] <= 0:
                    del self._mountpoints[root]
                    _remove_empty_dirs(root)
            local.mountpoints.clear()

    # -- status --------------------------------------------------------------------------------------------

    def _patch_status(self, local: LocalPod, *, ready: bool, running: bool) -> None:
        when = now_rfc3339()
        state: dict[str, Any] = {"running": {"startedAt": local.started_at}} if running else {}
        self._patch(local, {"status": {
            "conditions": [{"type": "Ready", "status": str(ready), "lastTransitionTime": when,
                            "reason": None if ready else "ContainersNotReady"},
                           {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": when,
                            "reason": None if ready else "ContainersNotReady"}],
            "containerStatuses": [{"name": local.container, "ready": ready, "started": running,
                                   "restartCount": local.restarts, "state": state}]}})

    def _patch_terminated(self, local: LocalPod, *, exit_code: int, reason: str, message: str = "",
                          phase: str | None = "Failed", waiting: bool = False) -> None:
        when = now_rfc3339()
        terminated = {"exitCode": exit_code, "reason": reason, "message": message or None,
                      "startedAt": local.started_at or when, "finishedAt": when}
        status: dict[str, Any] = {
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": when,
                            "reason": "PodCompleted" if phase else "ContainersNotReady"},
                           {"type": "ContainersReady", "status": "False", "lastTransitionTime": when,
                            "reason": "PodCompleted" if phase else "ContainersNotReady"}],
            "containerStatuses": [{"name": local.container, "ready": False, "started": False,
                                   "restartCount": local.restarts,
                                   **({"state": {"waiting": {"reason": "CrashLoopBackOff"}, "running": None},
                                       "lastState": {"terminated": terminated}} if waiting else
                                      {"state": {"terminated": terminated, "running": None}})}]}
        if phase:
            status["phase"] = phase
        self._patch(local, {"status": status})

    def _patch(self, local: LocalPod, body: dict[str, Any]) -> None:
        status, answer = self._api.request(
            "PATCH", f"/api/v1/namespaces/{local.namespace}/pods/{local.name}/status", body,
            content_type="application/strategic-merge-patch+json")
        if status not in (200, 404):
            log.warning("patching %s status returned %s: %s", local.key, status, answer)

    # -- services -> proxy routes --------------------------------------------------------------------------

    def _sync_routes(self) -> None:
        with self._lock:
            heads = [p for p in self.pods.values() if p.role == "head" and p.state == "ready"]
        if not heads:
            return
        wanted: dict[str, dict[str, int]] = {}
        for namespace in {h.namespace for h in heads}:
            services = self._api.items(f"/api/v1/namespaces/{namespace}/services")
            pods = {p["metadata"]["uid"]: p for p in self._api.items(
                f"/api/v1/namespaces/{namespace}/pods?labelSelector={urllib.parse.quote(NODE_TYPE_LABEL)}%3Dhead")}
            for head in (h for h in heads if h.namespace == namespace and h.uid in pods):
                labels = pods[head.uid]["metadata"].get("labels") or {}
                container_ports = {p.get("name"): p["containerPort"]
                                   for p in pods[head.uid]["spec"]["containers"][0].get("ports") or []}
                for service in services:
                    selector = service["spec"].get("selector") or {}
                    if not selector or any(labels.get(k) != v for k, v in selector.items()):
                        continue
                    for port in service["spec"].get("ports") or []:
                        target = port.get("targetPort", port["port"])
                        number = container_ports.get(target) if isinstance(target, str) else target
                        local_port = head.ports.get(number or -1)
                        if local_port is None:
                            continue
                        authority = f"{service['metadata']['name']}.{namespace}.svc.{CLUSTER_DOMAIN}:{port['port']}"
                        wanted.setdefault(head.uid, {})[authority] = local_port
                        if self.forward_proxy.lookup(*proxy.split_host_port(authority, 80)) != local_port:
                            self.forward_proxy.set_route(authority, local_port)
                            self._event(head, "Routed", f"{authority} -> 127.0.0.1:{local_port}")
        for head in heads:
            stale = {a: p for a, p in head.routes.items() if a not in wanted.get(head.uid, {})}
            head.routes = stale
            self._drop_routes(head)
            head.routes = wanted.get(head.uid, {})

    def _drop_routes(self, local: LocalPod) -> None:
        """Removes this pod's routes, unless a newer pod has taken the name over meanwhile."""
        for authority, local_port in local.routes.items():
            if self.forward_proxy.lookup(*proxy.split_host_port(authority, 80)) == local_port:
                self.forward_proxy.remove_route(authority)
        local.routes = {}

    # -- provisioner ---------------------------------------------------------------------------------------

    def _provision(self) -> None:
        """A hostPath PV pre-bound (claimRef) to each pending PVC; Released PVs it made are deleted."""
        for pvc in self._api.items("/api/v1/persistentvolumeclaims"):
            meta, spec = pvc["metadata"], pvc["spec"]
            if pvc.get("status", {}).get("phase") != "Pending" or spec.get("volumeName"):
                continue
            name = f"pv-{meta['namespace']}-{meta['name']}"[:200] + f"-{meta['uid'][:6]}"
            if name in self._provisioned:
                continue
            directory = self.workdir / "volumes" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:6]}"
            directory.mkdir(parents=True, exist_ok=True)
            body = {"apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": name, "labels": {"trainingrun.dev/testbed-provisioner": "podrunner"}},
                    "spec": {"capacity": {"storage": (spec.get("resources", {}).get("requests") or {}).get(
                        "storage", "1Gi")},
                             "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                             "persistentVolumeReclaimPolicy": "Retain",
                             "storageClassName": spec.get("storageClassName") or "",
                             "volumeMode": spec.get("volumeMode", "Filesystem"),
                             "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"},
                             "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                          "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}}}
            status, answer = self._api.request("POST", "/api/v1/persistentvolumes", body)
            if status in (201, 409):
                self._provisioned.add(name)
                self.events.append(f"{now_rfc3339()} pvc {meta['namespace']}/{meta['name']}: Provisioned {name} "
                                   f"at {directory}")
            else:
                log.warning("creating PV %s returned %s: %s", name, status, answer)
        for pv in self._api.items("/api/v1/persistentvolumes?labelSelector=trainingrun.dev%2Ftestbed-provisioner"):
            if pv.get("status", {}).get("phase") == "Released":
                self._api.request("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")

    def claim_directory(self, namespace: str, claim: str) -> Path:
        """Where PVC `namespace/claim`'s data lives on this machine (the PV's hostPath)."""
        return self._claim_directory(namespace, claim)

    def _event(self, local: LocalPod, reason: str, message: str) -> None:
        line = f"{now_rfc3339()} {local.key} [{local.role}]: {reason}: {message}"
        self.events.append(line)
        log.info("%s", line)


def _remove_empty_dirs(root: Path) -> None:
    """Removes `root` and the empty directories below it (the mountpoints a pod needed); keeps anything else."""
    if not root.is_dir():
        return
    for directory, _subdirs, _files in sorted(os.walk(root), key=lambda w: len(w[0]), reverse=True):
        try:
            os.rmdir(directory)
        except OSError:
            pass


# -- the real KubeRay operator, with its own identity --------------------------------------------------------


@dataclass(eq=False)
class KubeRayOperator:
    """The KubeRay operator binary from the test bed, run as ServiceAccount kuberay-system/kuberay-operator with
    the ClusterRole from its module's config/rbac, and `HTTP_PROXY` set to the forward proxy (for the dashboard)."""

    plane: controlplane.ControlPlane
    forward_proxy: proxy.ForwardProxy
    namespace: str = "kuberay-system"
    extra_args: tuple[str, ...] = ()

    process: controlplane.Process | None = field(init=False, default=None)

    def install_rbac(self) -> None:
        import yaml  # a test dependency (pyyaml is a core dependency of the project)

        rbac = self.plane.kuberay_module_dir / "config" / "rbac"
        role = yaml.safe_load((rbac / "role.yaml").read_text())
        binding = yaml.safe_load((rbac / "role_binding.yaml").read_text())
        for subject in binding["subjects"]:
            subject["namespace"] = self.namespace
        account = yaml.safe_load((rbac / "service_account.yaml").read_text())
        account["metadata"]["namespace"] = self.namespace
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        self.plane.kubectl("apply", "--server-side", "--field-manager=trainingrun-testbed", "-f", "-",
                           input=json.dumps({"apiVersion": "v1", "kind": "List",
                                             "items": [namespace, account, role, binding]}))

    def start(self) -> KubeRayOperator:
        self.install_rbac()
        kubeconfig = self.plane.service_account_kubeconfig(self.namespace, "kuberay-operator",
                                                           expiration_seconds=6 * 3600)
        log_path = self.plane.workdir / "kuberay-operator.log"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.plane.workdir), "HTTP_PROXY": self.forward_proxy.url,
               "http_proxy": self.forward_proxy.url, "NO_PROXY": "127.0.0.1,localhost",
               "no_proxy": "127.0.0.1,localhost"}
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                [str(self.plane.binaries.path("kuberay-operator")), "--kubeconfig", str(kubeconfig),
                 "--enable-leader-election=false", "--metrics-addr", "0", "--health-probe-bind-address", "0",
                 *self.extra_args],
                env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=controlplane.die_with_parent(signal.SIGTERM))
        self.process = controlplane.Process(name="kuberay-operator", popen=popen, log_path=log_path)
        time.sleep(0.5)
        if not self.process.alive():
            raise RunnerError(f"kuberay-operator exited at once:\n{self.process.log_tail()}")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log_tail(self, lines: int = 15) -> str:
        if self.process is None:
            return "(not started)"
        return "\n".join(line[:300] for line in self.process.log_tail(lines).splitlines())


KWOK_NODE_LEASE_SECONDS = 20  # as the test bed's own kwok: lease renewed every 5 s, tolerant of a busy machine
# kwok's default pod stages with one change: a pod turns Running with its IP but NOT Ready; the pod runner reports
# Ready once Ray answers (as a kubelet does after the readiness probe). With kwok's default (Ready at once), KubeRay
# sees a ready head before Ray listens, calls the dashboard, fails, and backs off exponentially.
KWOK_POD_STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-running-not-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: DoesNotExist}
    - {key: '.status.podIP', operator: DoesNotExist}
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
      - {lastTransitionTime: {{ $now | Quote }}, status: "False", type: Ready, reason: ContainersNotReady}
      - {lastTransitionTime: {{ $now | Quote }}, status: "False", type: ContainersReady, reason: ContainersNotReady}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          waiting: {reason: ContainerCreating}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
  next:
    finalizers: {empty: true}
    delete: true
"""


@dataclass(eq=False)
class FullLoopBed:
    """Proxy, pod runner and KubeRay on a running control plane, plus a node of its own for the Ray pods: kwok
    plays that node with KWOK_POD_STAGES, and the other schedulable nodes are cordoned while the bed is up (so
    that KubeRay's pods, which we do not build, land there). `stop()` undoes all of it."""

    plane: controlplane.ControlPlane
    forward_proxy: proxy.ForwardProxy = field(init=False)
    runner: PodRunner = field(init=False)
    kuberay: KubeRayOperator = field(init=False)
    node: str = field(init=False, default="")
    kubelet: controlplane.Process | None = field(init=False, default=None)
    cordoned: list[str] = field(init=False, default_factory=list)

    def start(self) -> FullLoopBed:
        try:
            self.forward_proxy = proxy.ForwardProxy().start()
            self.runner = PodRunner.for_plane(self.plane, self.forward_proxy).start()
            self._start_node()
            self.kuberay = KubeRayOperator(self.plane, self.forward_proxy).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self) -> None:
        tag = f"fullloop-{uuid.uuid4().hex[:6]}"
        stages = self.runner.workdir / "kwok-stages.yaml"
        stages.write_text(KWOK_POD_STAGES)
        self.node = tag
        self.plane.create_fake_node(tag, annotations={controlplane.KWOK_ANNOTATION: tag})
        log_path = self.plane.workdir / f"kwok-{tag}.log"
        with open(log_path, "wb") as log_file:
            popen = subprocess.Popen(
                [str(self.plane.binaries.path("kwok")), "--kubeconfig", str(self.plane.kubeconfig),
                 "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={controlplane.KWOK_ANNOTATION}={tag}",
                 "--node-ip", "127.0.0.1", "--server-address", "127.0.0.1:0",
                 f"--node-lease-duration-seconds={KWOK_NODE_LEASE_SECONDS}", "--config", str(stages)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, cwd=self.plane.workdir,
                start_new_session=True, preexec_fn=controlplane.die_with_parent(signal.SIGTERM))
        self.kubelet = controlplane.Process(name=f"kwok-{tag}", popen=popen, log_path=log_path)
        self.plane.wait_nodes_ready([tag])
        status, nodes = self.plane.request("GET", "/api/v1/nodes")
        for other in nodes["items"] if status == 200 else []:
            name = other["metadata"]["name"]
            if name != tag and not other["spec"].get("unschedulable"):
                self.plane.kubectl("cordon", name)
                self.cordoned.append(name)

    def stop(self) -> None:
        for part in ("kuberay", "runner", "kubelet", "forward_proxy"):
            thing = getattr(self, part, None)
            if thing is not None:
                thing.stop()
        for name in self.cordoned:
            self.plane.kubectl("uncordon", name, check=False)
        self.cordoned.clear()
        if self.node:
            self.plane.kubectl("delete", "node", self.node, "--ignore-not-found", "--wait=false", check=False)

    def describe(self) -> str:
        kubelet = self.kubelet.log_tail(10) if self.kubelet else ""
        kuberay = getattr(self, "kuberay", None)
        runner = getattr(self, "runner", None)
        return (f"{runner.describe() if runner else ''}\n--- kwok for {self.node}\n{kubelet}"
                f"\n--- kuberay-operator log (last lines, cut at 300 characters)\n"
                f"{kuberay.log_tail() if kuberay else ''}")

    @staticmethod
    @contextlib.contextmanager
    def running(plane: controlplane.ControlPlane) -> Iterator[FullLoopBed]:
        bed = FullLoopBed(plane)
        try:
            yield bed.start()
        finally:
            bed.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="control plane + forward proxy + pod runner + KubeRay, until Ctrl-C")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up")
    up.add_argument("--nodes", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    signal.signal(signal.SIGTERM, controlplane.raise_keyboard_interrupt)
    with controlplane.ControlPlane(controlplane.Binaries.locate(), nodes=args.nodes) as plane, \
            FullLoopBed.running(plane) as bed:
        print(plane.kubeconfig, flush=True)
        print(f"# export KUBECONFIG={plane.kubeconfig}; proxy {bed.forward_proxy.url}; pods in {bed.runner.workdir}",
              file=sys.stderr, flush=True)
        try:
            while bed.kuberay.process is not None and bed.kuberay.process.alive():
                time.sleep(1)
            print(f"kuberay-operator exited:\n{bed.kuberay.log_tail()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
