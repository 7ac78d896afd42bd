"""The pod runner: a TEST COMPONENT that plays the kubelet: for Ray pods as local processes (the default: fast, and
what the chaos tests kill and freeze), or with `ray_in_containers` as podman containers from the pod's image; and
for the pods bound to its container nodes (the chart's operator) as podman containers (containerpods.py).

Who uses it: `fullloop.FullLoopBed` (the full-loop tests and `hack/testbed/fullloop.py up`), `chaos` and the
pod-runner tests (tests/integration/test_podrunner.py).

kwok still plays the pods' phase (Running, a fake pod IP, deletion); this runner adds what kwok cannot, the process:

    kube-scheduler binds a KubeRay pod (label ray.io/node-type) to a kwok node; kwok sets it Running
      └── runner (level-triggered, every `interval`; `completed_passes` counts the passes):
          ├── head pod  ──> `ray start --head --block` on free loopback ports (raystart.py), own session and
          │                 process group, short --temp-dir (AF_UNIX paths < 107 bytes), fresh HOME (Ray 2.60
          │                 turns on dashboard token auth when ~/.ray/auth_token exists; KubeRay 1.5 sends no
          │                 token), the project's .venv/bin first on PATH, the pod's env minus KubeRay's RAY_*
          │                 container variables (podspec.py)
          ├── worker pod ──> `ray start --address 127.0.0.1:<head gcs port> --block` once its head is up
          ├── identity  ──> a TokenRequest token bound to the pod (as the kubelet mints), in a kubeconfig that
          │                 KUBECONFIG names; the driver's client falls back to it outside a cluster
          ├── volumes   ──> each PVC mounted by the Ray container is bind-mounted from its PV's hostPath at the
          │                 container's mountPath inside a private mount namespace (mountpoints.py; needs root)
          ├── readiness ──> Ready=False while Ray starts, True once Ray answers; the container's termination is
          │                 reported (phase Failed/Succeeded under restartPolicy Never, else restarted with
          │                 backoff); the patch bodies are podstatus.py's
          ├── routes    ──> for every Service that selects a running head: `<svc>.<ns>.svc.cluster.local:<port>`
          │                 -> the matching local port, in the forward proxy (DNS plus kube-proxy, for KubeRay)
          ├── endings   ──> pod deleted/evicted: the container's preStop exec hook (with its env and volumes),
          │                 SIGTERM, SIGKILL once its grace period (capped by `grace_cap`) is spent, then the
          │                 final delete of the pod object (the bed's kwok leaves Ray pods' deletion to the
          │                 runner, as a real control plane leaves it to the kubelet); node deleted, or
          │                 `kill_node` (the machine is gone): SIGKILL at once; nothing is restarted after that.
          │                 A node that is only not Ready (its kubelet stopped posting status: a blip) keeps its
          │                 processes running, untended, as a real machine would (`chaos.lapse_node`;
          │                 `chaos.fail_node` also kills them)
          ├── provisioner ─> a hostPath PV pre-bound by claimRef for every pending PVC (provisioner.py)
          └── containers ──> every pod bound to a container node (`serve_containers`: the bed's node for the
                            chart's operator), and with `ray_in_containers` every Ray pod, runs as a real podman
                            container instead: security context, volumes (the PVC from its PV's directory),
                            projected ServiceAccount token and CA, init containers, probes (httpGet and exec),
                            the preStop hook, restarts (containerpods.py); a head container's Services become
                            --add-host entries of the pods that start after it (a worker waits for its head) and
                            proxy routes to its address on the bridge

Every process of a pod carries localpod.POD_MARKER=<pod uid> in its environment, so a kill finds the Ray workers
too. Standard library only, plus this directory's modules and `trainingrun_runtime.timestamps`.
"""

from __future__ import annotations

import atexit
import base64
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import components
import containerpods
import controlplane
import fakenodes
import kubeapi
import localpod
import mountpoints
import podspec
import podstatus
import provisioner
import proxy
import raystart
from trainingrun_runtime import timestamps

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
VENV_BIN = REPO_ROOT / ".venv" / "bin"
CLUSTER_DOMAIN = "cluster.local"
LIVE_STATES = ("starting", "ready", "backoff")
PRE_STOP_EXTENSION_S = 2.0
"""A preStop hook that used the whole grace period up leaves the container this long after SIGTERM (the
kubelet's one-off extension)."""


class RunnerError(RuntimeError):
    """The runner could not start a pod as a kubelet would (a worker without a running head); the message says
    which pod."""


@dataclass(eq=False)
class PodRunner:
    """Plays the kubelet for KubeRay's pods on kwok nodes (see the module docstring); `start()`/`stop()`."""

    server: str
    ca_file: Path
    admin_token: str
    forward_proxy: proxy.ForwardProxy
    interval: float = 0.3
    grace_cap: float = 10.0  # the most a pod's termination may take here; a test of the notice raises it
    object_store_bytes: int = 256 * 1024 * 1024
    venv_bin: Path = VENV_BIN
    # Ray pods as podman containers from their own image (containerpods.py) instead of local processes: KubeRay's
    # command as it is, the pod's volumes, KubeRay's exec probes, the head's Services as --add-host entries, and
    # proxy routes to the head container's address.
    ray_in_containers: bool = False
    keep_workdir: bool = field(default_factory=lambda: os.environ.get("TESTBED_KEEP") == "1")

    workdir: Path = field(init=False)
    pods: dict[str, localpod.LocalPod] = field(init=False, default_factory=dict)
    events: list[str] = field(init=False, default_factory=list)
    # Passes that ran to the end without an error. A pass under way when a test changes something may have read
    # the API before the change: two more completed passes include one that started after it.
    completed_passes: int = field(init=False, default=0)
    _api: kubeapi.KubeApi = field(init=False)
    _volumes: provisioner.HostPathProvisioner = field(init=False)
    _lock: threading.RLock = field(init=False, default_factory=threading.RLock)
    _thread: threading.Thread | None = field(init=False, default=None)
    _stopping: threading.Event = field(init=False, default_factory=threading.Event)
    _mountpoints: mountpoints.Mountpoints = field(init=False, default_factory=mountpoints.Mountpoints)
    _extra_env: list[tuple[dict[str, str], dict[str, str]]] = field(init=False, default_factory=list)
    # The nodes whose pods run as podman containers, and those containers (made when the first node is served).
    container_nodes: set[str] = field(init=False, default_factory=set)
    containers: containerpods.ContainerPods | None = field(init=False, default=None)
    _pass_error: str = field(init=False, default="")

    @classmethod
    def for_plane(
        cls, plane: controlplane.ControlPlane, forward_proxy: proxy.ForwardProxy, **options: Any
    ) -> PodRunner:
        return cls(
            server=plane.server,
            ca_file=plane.ca_file,
            admin_token=plane.admin_token,
            forward_proxy=forward_proxy,
            **options,
        )

    # -- life cycle ---------------------------------------------------------------------------------------

    def start(self) -> PodRunner:
        self.workdir = Path(tempfile.mkdtemp(prefix="trun-pr-"))
        (self.workdir / "volumes").mkdir()
        self._api = kubeapi.KubeApi(self.server, kubeapi.verified_context(self.ca_file), self.admin_token)
        self._volumes = provisioner.HostPathProvisioner(self._api, self.workdir / "volumes")
        self._stopping.clear()
        atexit.register(self.stop)
        if self.ray_in_containers:
            keeper = self._containers_keeper(self.grace_cap)
            self.forward_proxy.pod_address = keeper.network.start().bridge.holds  # type: ignore[union-attr]
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
        if self.containers is not None:
            self.containers.stop()
        with self._lock:
            pods = list(self.pods.values())
        for pod in pods:
            if pod.state != "killed" or localpod.pod_processes(pod.uid):
                self._kill(pod, "runner stopped", grace=0.0, final_state="killed", wait=True)
        for pod in pods:
            if not self.keep_workdir:
                shutil.rmtree(pod.temp_dir, ignore_errors=True)
        self._mountpoints.remove_all()
        atexit.unregister(self.stop)
        workdir = getattr(self, "workdir", None)
        if workdir is not None and workdir.exists() and not self.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- what tests and chaos use ------------------------------------------------------------------------

    def find(self, namespace: str, name: str) -> localpod.LocalPod | None:
        with self._lock:
            found = [p for p in self.pods.values() if p.namespace == namespace and p.name == name]
        return found[-1] if found else None

    def head(self, namespace: str, cluster: str) -> localpod.LocalPod | None:
        """The newest live head this runner plays for RayCluster `namespace/cluster`."""
        with self._lock:
            heads = [
                p
                for p in self.pods.values()
                if p.namespace == namespace
                and p.cluster == cluster
                and p.role == "head"
                and p.state in ("starting", "ready")
            ]
        return heads[-1] if heads else None

    def add_env(self, match_labels: dict[str, str], env: dict[str, str]) -> None:
        """Test knob: pods started from now on whose labels include `match_labels` also get `env` (as a
        mutating admission webhook would add it). The driver's crash points (TRAININGRUN_CRASH_AT) are armed so."""
        with self._lock:
            self._extra_env.append((dict(match_labels), dict(env)))

    def detach(self, uid: str) -> localpod.LocalPod:
        """Forgets a pod's processes without killing them: what a partitioned node looks like from the API
        server (chaos uses it to leave a zombie running). `stop()` still kills them."""
        with self._lock:
            pod = self.pods[uid]
            pod.state = "detached"
        self._drop_routes(pod)  # a partitioned node is unreachable
        self._event(pod, "Detached", "processes left running (partitioned node)")
        return pod

    def kill_node(self, node: str) -> list[localpod.LocalPod]:
        """SIGKILLs every process of every pod on `node`, as when the machine dies."""
        with self._lock:
            victims = [p for p in self.pods.values() if p.node == node and p.state in LIVE_STATES]
        for pod in victims:
            self._kill(pod, f"node {node} failed", grace=0.0, final_state="killed", wait=True)
        return victims

    def serve_containers(self, node: str, *, grace_cap: float = 10.0) -> containerpods.ContainerPods:
        """From the next pass on, every pod bound to `node` (other than a Ray pod) runs as a podman container
        (containerpods.py), each stopped within at most `grace_cap` seconds. Returns the containers' keeper."""
        keeper = self._containers_keeper(grace_cap)
        with self._lock:
            self.container_nodes.add(node)
        return keeper

    def _containers_keeper(self, grace_cap: float) -> containerpods.ContainerPods:
        with self._lock:
            if self.containers is None:
                self.containers = containerpods.ContainerPods(
                    self._api,
                    self.workdir,
                    record=self._record,
                    remove=self._remove,
                    grace_cap=grace_cap,
                    claim_directory=self.claim_directory,
                    hosts=self._pod_hosts,
                    extra_env=self._added_env,
                )
            return self.containers

    def claim_directory(self, namespace: str, claim: str) -> Path:
        """Where PVC `namespace/claim`'s data lives on this machine (the PV's hostPath)."""
        return self._volumes.claim_directory(namespace, claim)

    def describe(self) -> str:
        """A dump for failing tests: every pod's state and log tail, and the runner's event list."""
        with self._lock:
            lines = [
                "runner events:\n  " + "\n  ".join(self.events[-40:]),
                f"passes completed: {self.completed_passes}; last pass error: {self._pass_error}",
            ]
            for pod in self.pods.values():
                lines.append(
                    f"--- {pod.key} ({pod.role}, {pod.state}, exit {pod.exit_code}) {pod.log_path}\n{pod.log_tail(15)}"
                )
        if self.containers is not None:
            lines += self.containers.describe()
        return "\n".join(lines)

    # -- the loop ------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._pass()
                self._pass_error = ""
                self.completed_passes += 1
            except Exception as err:  # the loop must survive API hiccups; the next pass retries
                self._pass_error = f"{type(err).__name__}: {err}"
                log.warning("pod runner pass failed: %s", self._pass_error)
            self._stopping.wait(self.interval)

    def _pass(self) -> None:
        """One level-triggered look at the nodes, the claims and the Ray pods: start, tend or end each one."""
        nodes = {n["metadata"]["name"]: n for n in self._api.items("/api/v1/nodes")}
        pods = self._api.items(f"/api/v1/pods?labelSelector={urllib.parse.quote(podspec.NODE_TYPE_LABEL)}")
        for line in self._volumes.provision():
            self._record(line)
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            with self._lock:
                local = self.pods.get(uid)
            node = nodes.get(pod["spec"].get("nodeName") or "")
            deleted = bool(pod["metadata"].get("deletionTimestamp"))
            if self.ray_in_containers and podspec.plays(pod):
                continue  # the containers' keeper plays it (_sync_containers)
            if deleted and (local is None or local.state in ("exited", "killed", "detached")):
                if self._kubelet_up(node):
                    self._remove(pod)  # nothing of it runs (any more): the kubelet's final delete
            elif not podspec.plays(pod) or (local is not None and local.state in ("killing", "killed", "detached")):
                continue
            elif local is None:
                if self._should_start(pod, node):
                    self._start(pod)
            elif node is None:
                self._kill(local, f"node {local.node} deleted", grace=0.0, final_state="killed")
            elif not fakenodes.node_ready(node):
                continue  # the kubelet cannot post status; the processes run on until the machine is really gone
            elif deleted:
                grace = podspec.grace_seconds(pod, self.grace_cap)
                self._kill(local, "pod deleted", grace=grace, final_state="killed", pre_stop=True, remove=pod)
            else:
                self._tend(local, pod)
        with self._lock:
            gone = [p for uid, p in self.pods.items() if uid not in seen and p.state not in ("killed", "detached")]
        for local in gone:
            if local.state != "killing":
                self._kill(local, "pod gone", grace=local.grace_seconds, final_state="killed")
        self._sync_containers(nodes, pods)
        self._sync_routes()
        self._sync_container_routes()

    def _sync_containers(self, nodes: dict[str, dict[str, Any]], ray_pods: list[dict[str, Any]]) -> None:
        """The pods bound to the container nodes (Ray pods there stay processes unless `ray_in_containers`), and
        with `ray_in_containers` every Ray pod, to the containers' keeper."""
        with self._lock:
            containers, served = self.containers, sorted(self.container_nodes)
        if containers is None:
            return
        bound = [p for p in ray_pods if podspec.plays(p)] if self.ray_in_containers else []
        for node in served:
            selector = urllib.parse.quote(f"spec.nodeName={node}")
            bound += [p for p in self._api.items(f"/api/v1/pods?fieldSelector={selector}") if not podspec.plays(p)]
        containers.sync(bound, nodes)

    @staticmethod
    def _kubelet_up(node: dict[str, Any] | None) -> bool:
        """Whether the runner plays the kubelet of `node` now: a kwok node that is Ready."""
        return fakenodes.kubelet_up(node)

    def _should_start(self, pod: dict[str, Any], node: dict[str, Any] | None) -> bool:
        meta, status = pod["metadata"], pod.get("status", {})
        if meta.get("deletionTimestamp") or not self._kubelet_up(node):
            return False
        # kwok has played the pod (Running, pod IP): from here on, only this runner writes its status.
        if status.get("phase") != "Running" or not status.get("podIP"):
            return False
        if meta["labels"].get(podspec.NODE_TYPE_LABEL) == "worker":
            head = self.head(meta["namespace"], meta["labels"].get(podspec.CLUSTER_LABEL, ""))
            return head is not None and head.state == "ready"
        return True

    # -- starting ------------------------------------------------------------------------------------------

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        container = podspec.ray_container(pod)
        directory = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        directory.mkdir(parents=True)
        local = localpod.LocalPod(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            node=spec["nodeName"],
            role=meta["labels"][podspec.NODE_TYPE_LABEL],
            cluster=meta["labels"].get(podspec.CLUSTER_LABEL, ""),
            container=container["name"],
            restart_policy=spec.get("restartPolicy", "Always"),
            grace_seconds=float(min(spec.get("terminationGracePeriodSeconds", 30), self.grace_cap)),
            directory=directory,
            temp_dir=Path(tempfile.mkdtemp(prefix="rp", dir="/tmp")),
        )
        with self._lock:
            self.pods[local.uid] = local
        try:
            self._launch(local, pod)
        except Exception as err:
            local.state = "exited"
            self._event(local, "FailedToStart", str(err))
            self._patch(
                local,
                podstatus.terminated(local, exit_code=128, reason="StartError", message=str(err)[:500], when=_now()),
            )
            raise

    def _environment(self, pod: dict[str, Any], container: dict[str, Any], local: localpod.LocalPod) -> dict[str, str]:
        home = local.directory / "home"
        home.mkdir(exist_ok=True)  # fresh: no ~/.ray/auth_token from an earlier ray.init()
        env = {
            "PATH": f"{self.venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "HOSTNAME": local.name,
            "PYTHONUNBUFFERED": "1",
            localpod.POD_MARKER: local.uid,
        }
        if pod["spec"].get("automountServiceAccountToken", True):
            env["KUBECONFIG"] = str(self._pod_kubeconfig(pod, local))
        env.update(podspec.container_env(pod, container, self._read_key))
        env.update(self._added_env(pod))
        return env

    def _added_env(self, pod: dict[str, Any]) -> dict[str, str]:
        """What `add_env` adds to `pod`'s Ray container."""
        labels = pod["metadata"].get("labels") or {}
        added: dict[str, str] = {}
        with self._lock:
            for match, extra in self._extra_env:
                if all(labels.get(k) == v for k, v in match.items()):
                    added.update(extra)
        return added

    def _read_key(self, namespace: str, kind: str, name: str, key: str) -> str | None:
        """A key of a Secret (decoded) or ConfigMap, as a kubelet resolves secretKeyRef/configMapKeyRef."""
        status, obj = self._api.request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if status != 200:
            return None
        data = obj.get("data") or {}
        if kind == "secrets" and key in data:
            return base64.b64decode(data[key]).decode()
        return data.get(key)

    def _pod_kubeconfig(self, pod: dict[str, Any], local: localpod.LocalPod) -> Path:
        """A token for the pod's ServiceAccount bound to the pod (invalid once the pod is gone), as a kubelet
        projects it, written into a kubeconfig."""
        return kubeapi.service_account_kubeconfig(
            self._api,
            pod["metadata"]["namespace"],
            pod["spec"].get("serviceAccountName") or "default",
            ca_file=self.ca_file,
            out=local.directory / "kubeconfig",
            bound_pod=pod,
        )

    def _binds(self, pod: dict[str, Any], container: dict[str, Any]) -> list[mountpoints.Bind]:
        """A bind mount for each PVC the Ray container mounts, from the directory of the claim's PV."""
        binds = []
        for mount in podspec.claim_mounts(pod, container):
            source = self.claim_directory(pod["metadata"]["namespace"], mount.claim)
            if mount.sub_path:
                source = source / mount.sub_path
                source.mkdir(parents=True, exist_ok=True)
            binds.append(mountpoints.Bind(source, Path(mount.mount_path), mount.read_only))
        return binds

    def _launch(self, local: localpod.LocalPod, pod: dict[str, Any]) -> None:
        """Starts (or restarts) the pod's Ray, reports the container Running and not Ready."""
        container = podspec.ray_container(pod)
        env = self._environment(pod, container, local)
        binds = self._binds(pod, container)
        if not local.ports or not all(components.bindable(p) for p in local.ports.values()):
            # a restart keeps its ports unless one was taken meanwhile (routes follow at the next Ready)
            chosen = components.pod_ports(len(raystart.CONTAINER_PORTS))
            local.ports = dict(zip(raystart.CONTAINER_PORTS, chosen, strict=True))
        head_gcs = None
        if local.role != "head":
            head = self.head(local.namespace, local.cluster)
            if head is None:
                raise RunnerError(f"worker {local.key}: no running head for cluster {local.cluster}")
            head_gcs = head.gcs_address
        command = raystart.command(
            self.venv_bin / "ray",
            podspec.generated_command(container),
            ports=local.ports,
            temp_dir=local.temp_dir,
            head_gcs_address=head_gcs,
            object_store_bytes=self.object_store_bytes,
        )
        if binds:
            for bind in binds:  # the mountPath must exist on the host's (shared) filesystem
                root = self._mountpoints.ensure(bind.target)
                if root is not None:
                    local.mountpoints.append(root)
            command = mountpoints.in_private_mount_namespace(command, binds)
        cwd = container.get("workingDir") or env["HOME"]
        local.env, local.binds, local.pre_stop = env, binds, podspec.pre_stop_command(container)
        local.cwd = cwd if Path(cwd).is_dir() else env["HOME"]
        with open(local.log_path, "wb") as log_file:
            local.process = subprocess.Popen(
                command,
                env=env,
                cwd=local.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=components.die_with_parent(signal.SIGTERM),
            )
        local.state, local.started_at, local.exit_code = "starting", _now(), None
        self._event(local, "Started", f"pid {local.process.pid}: {shlex.join(command)[:300]}")
        self._patch(local, podstatus.running(local, ready=False, when=_now()))

    # -- running -------------------------------------------------------------------------------------------

    def _tend(self, local: localpod.LocalPod, pod: dict[str, Any]) -> None:
        """Readiness, exits and restarts of one running pod."""
        if local.state == "backoff":
            if time.monotonic() >= local.restart_after:
                local.restarts += 1
                self._launch(local, pod)
            return
        if local.process is None or local.state not in ("starting", "ready"):
            return
        code = local.process.poll()
        if code is not None:
            self._exited(local, 128 - code if code < 0 else code)  # killed by signal N: 128+N, as a runtime reports
        elif local.state == "starting" and self._ray_answers(local):
            local.state = "ready"
            self._event(local, "Ready", "Ray answers")
            self._patch(local, podstatus.running(local, ready=True, when=_now()))

    def _exited(self, local: localpod.LocalPod, code: int) -> None:
        """The pod's `ray start` exited with `code`: report it, and restart later if the restart policy says so."""
        local.exit_code = code
        self._drop_routes(local)
        self._event(local, "Exited", f"exit code {code}; log tail:\n{local.log_tail(10)}")
        localpod.signal_pod(local.uid, local.process, signal.SIGKILL)  # leftovers of a crashed ray start
        reason = "Error" if code else "Completed"
        if local.restart_policy == "Always" or (local.restart_policy == "OnFailure" and code != 0):
            local.state = "backoff"
            local.restart_after = time.monotonic() + min(10.0 * 2**local.restarts, 300.0)
            self._patch(
                local, podstatus.terminated(local, exit_code=code, reason=reason, phase=None, waiting=True, when=_now())
            )
        else:
            local.state = "exited"
            self._patch(
                local,
                podstatus.terminated(
                    local, exit_code=code, reason=reason, phase="Failed" if code else "Succeeded", when=_now()
                ),
            )

    def _ray_answers(self, local: localpod.LocalPod) -> bool:
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

    def _kill(
        self,
        local: localpod.LocalPod,
        why: str,
        *,
        grace: float,
        final_state: str,
        wait: bool = False,
        pre_stop: bool = False,
        remove: dict[str, Any] | None = None,
    ) -> None:
        """Ends the pod's processes in a thread (unless `wait`), as a kubelet does: the container's preStop exec
        hook first when `pre_stop` (and the container runs), then SIGTERM, then SIGKILL once `grace` seconds have
        passed since the start (0: SIGKILL at once; a hook that used the grace up gets PRE_STOP_EXTENSION_S
        more). Then the pod object `remove` is deleted for good, as the kubelet's final delete."""
        with self._lock:
            if local.state in ("killing", "killed") and not wait:
                return
            detached = local.state == "detached"
            hook = local.pre_stop if pre_stop and grace > 0 and local.alive() else None
            local.state = "killing"
        self._drop_routes(local)
        self._event(local, "Killing", f"{why}, grace {grace:g} s")

        def finish() -> None:
            deadline = time.monotonic() + grace
            if hook is not None:
                self._run_pre_stop(local, hook, timeout=grace)
                deadline = max(deadline, time.monotonic() + PRE_STOP_EXTENSION_S)
            _terminate(local, max(0.0, deadline - time.monotonic()) if grace > 0 else 0.0)
            self._release_mountpoints(local)  # Ray's logs stay in temp_dir until the runner stops
            local.state = final_state
            self._event(local, "Killed", f"{why} (was detached: {detached})")
            if remove is not None:
                self._remove(remove)

        if wait:
            finish()
        else:
            threading.Thread(target=finish, name=f"kill-{local.name}", daemon=True).start()

    def _run_pre_stop(self, local: localpod.LocalPod, hook: list[str], *, timeout: float) -> None:
        """The container's preStop exec hook, with the container's environment, working directory and volumes,
        killed after `timeout` seconds; its output goes to the pod's directory (`pre-stop.log`)."""
        command = mountpoints.in_private_mount_namespace(hook, local.binds) if local.binds else hook
        started = time.monotonic()
        with open(local.directory / "pre-stop.log", "ab") as out:
            try:
                done = subprocess.run(
                    command,
                    env=local.env,
                    cwd=local.cwd or None,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    check=False,
                )
                outcome = f"exit code {done.returncode}"
            except subprocess.TimeoutExpired:
                outcome = f"killed after {timeout:g} s"
            except OSError as err:
                outcome = f"could not run: {err}"
        self._event(local, "PreStop", f"{shlex.join(hook)[:200]}: {outcome} in {time.monotonic() - started:.1f} s")

    def _remove(self, pod: dict[str, Any]) -> None:
        """Deletes the pod object for good (grace 0, this uid only): what a kubelet does once nothing of the pod
        runs. Without it the pod would stay Terminating, as the bed's kwok leaves Ray pods' deletion to us."""
        meta = pod["metadata"]
        status, answer = self._api.request(
            "DELETE",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]},
            },
        )
        if status not in (200, 404, 409):
            log.warning("deleting pod %s/%s returned %s: %s", meta["namespace"], meta["name"], status, answer)

    def _release_mountpoints(self, local: localpod.LocalPod) -> None:
        for root in local.mountpoints:
            self._mountpoints.release(root)
        local.mountpoints.clear()

    # -- status --------------------------------------------------------------------------------------------

    def _patch(self, local: localpod.LocalPod, body: dict[str, Any]) -> None:
        self._api.patch_pod_status(local.namespace, local.name, body, content_type=podstatus.PATCH_CONTENT_TYPE)

    # -- services -> proxy routes --------------------------------------------------------------------------

    def _sync_routes(self) -> None:
        """Each ready head's routes become what the Services that select it ask for; stale ones are dropped."""
        with self._lock:
            heads = [p for p in self.pods.values() if p.role == "head" and p.state == "ready"]
        if not heads:
            return
        wanted: dict[str, dict[str, int]] = {}
        for namespace in {h.namespace for h in heads}:
            wanted.update(self._wanted_routes(namespace, [h for h in heads if h.namespace == namespace]))
        for head in heads:
            for authority, local_port in wanted.get(head.uid, {}).items():
                if self.forward_proxy.lookup(*proxy.split_host_port(authority, 80)) != local_port:
                    self.forward_proxy.set_route(authority, local_port)
                    self._event(head, "Routed", f"{authority} -> 127.0.0.1:{local_port}")
            head.routes = {a: p for a, p in head.routes.items() if a not in wanted.get(head.uid, {})}
            self._drop_routes(head)
            head.routes = wanted.get(head.uid, {})

    def _sync_container_routes(self) -> None:
        """With `ray_in_containers`: each ready head container's Services routed to its address (the proxy's
        targets on the bridge); routes to a head container that is gone are dropped."""
        if not self.ray_in_containers or self.containers is None:
            return
        wanted = {
            authority: (head.pod_ip, number)
            for service, head in self._head_services()
            for authority, number in service_targets(service, head.pod).items()
        }
        current = {a: t for a, t in self.forward_proxy.targets().items() if t[0] != "127.0.0.1"}
        for authority, (host, port) in wanted.items():
            if current.get(authority) != (host, port):
                self.forward_proxy.set_route(authority, port, target_host=host)
                self._record(f"routed {authority} -> {host}:{port}")
        for authority in current.keys() - wanted.keys():
            self.forward_proxy.remove_route(authority)

    def _ready_heads(self) -> list[containerpods.ContainerPod]:
        """The Ray heads that run as containers, are ready and have an address."""
        assert self.containers is not None
        return [
            p for p in self.containers.running() if p.ready and p.pod_ip and podspec.plays(p.pod) and _is_head(p.pod)
        ]

    def _head_services(self) -> list[tuple[dict[str, Any], containerpods.ContainerPod]]:
        """(Service, head) for each Service that selects a ready head container."""
        heads = self._ready_heads()
        found = []
        for namespace in sorted({h.namespace for h in heads}):
            services = self._api.items(f"/api/v1/namespaces/{namespace}/services")
            found += [(s, h) for h in heads if h.namespace == namespace for s in services if selects(s, h.pod)]
        return found

    def _pod_hosts(self, pod: dict[str, Any]) -> dict[str, str] | None:
        """What a container pod resolves without cluster DNS: the Services of its namespace that select a running
        head container, by the names a pod may use (`svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`), to
        the head's address. A Ray worker waits (None) until its RayCluster's head runs."""
        namespace = pod["metadata"]["namespace"]
        if podspec.plays(pod) and not _is_head(pod):
            cluster = (pod["metadata"].get("labels") or {}).get(podspec.CLUSTER_LABEL, "")
            if not any(
                h.namespace == namespace
                and (h.pod["metadata"].get("labels") or {}).get(podspec.CLUSTER_LABEL) == cluster
                for h in self._ready_heads()
            ):
                return None
        hosts: dict[str, str] = {}
        for service, head in self._head_services():
            if head.namespace == namespace:
                name = service["metadata"]["name"]
                for alias in (
                    name,
                    f"{name}.{namespace}",
                    f"{name}.{namespace}.svc",
                    f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}",
                ):
                    hosts[alias] = head.pod_ip
        return hosts

    def _wanted_routes(self, namespace: str, heads: list[localpod.LocalPod]) -> dict[str, dict[str, int]]:
        """head uid -> {`<svc>.<ns>.svc.cluster.local:<port>`: local port} for the Services of `namespace`."""
        services = self._api.items(f"/api/v1/namespaces/{namespace}/services")
        selector = urllib.parse.quote(f"{podspec.NODE_TYPE_LABEL}=head")
        pods = {
            p["metadata"]["uid"]: p
            for p in self._api.items(f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
        }
        wanted: dict[str, dict[str, int]] = {}
        for head in (h for h in heads if h.uid in pods):
            for service in services:
                for authority, number in service_targets(service, pods[head.uid]).items():
                    local_port = head.ports.get(number)
                    if local_port is not None:
                        wanted.setdefault(head.uid, {})[authority] = local_port
        return wanted

    def _drop_routes(self, local: localpod.LocalPod) -> None:
        """Removes this pod's routes, unless a newer pod has taken the name over meanwhile."""
        for authority, local_port in local.routes.items():
            if self.forward_proxy.lookup(*proxy.split_host_port(authority, 80)) == local_port:
                self.forward_proxy.remove_route(authority)
        local.routes = {}

    # -- events --------------------------------------------------------------------------------------------

    def _event(self, local: localpod.LocalPod, reason: str, message: str) -> None:
        self._record(f"{local.key} [{local.role}]: {reason}: {message}")

    def _record(self, line: str) -> None:
        stamped = f"{_now()} {line}"
        self.events.append(stamped)
        log.info("%s", stamped)


def selects(service: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether `service`'s selector picks `pod` (a Service without a selector picks none)."""
    chosen = service["spec"].get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    return bool(chosen) and all(labels.get(k) == v for k, v in chosen.items())


def service_targets(service: dict[str, Any], pod: dict[str, Any]) -> dict[str, int]:
    """`<svc>.<ns>.svc.cluster.local:<port>` -> the Ray container's port, for each port of `service` that reaches
    `pod` (a targetPort by number, or by the name of a container port): what cluster DNS and kube-proxy would do."""
    if not selects(service, pod):
        return {}
    named = {p.get("name"): p["containerPort"] for p in podspec.ray_container(pod).get("ports") or []}
    name, namespace = service["metadata"]["name"], pod["metadata"]["namespace"]
    found = {}
    for port in service["spec"].get("ports") or []:
        target = port.get("targetPort", port["port"])
        number = named.get(target) if isinstance(target, str) else target
        if number is not None:
            found[f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}:{port['port']}"] = int(number)
    return found


def _is_head(pod: dict[str, Any]) -> bool:
    return (pod["metadata"].get("labels") or {}).get(podspec.NODE_TYPE_LABEL) == "head"


def _now() -> str:
    """As the API server writes condition times: to the second."""
    return timestamps.now(timespec="seconds")


def _terminate(local: localpod.LocalPod, grace: float) -> None:
    """SIGTERM to every process of the pod; once its `ray start` (the container's main process) has exited, or
    `grace` seconds have passed (at once when 0), SIGKILL to whatever is left until none is, as a container runtime
    ends a container whose main process exited; then reaps its `ray start`."""
    if grace > 0:
        localpod.signal_pod(local.uid, local.process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _container_runs(local):
            time.sleep(0.2)
    localpod.kill_all(local.uid, local.process)
    if local.process is not None:
        try:
            local.process.wait(10)
            local.exit_code = local.process.returncode
        except subprocess.TimeoutExpired:
            pass


def _container_runs(local: localpod.LocalPod) -> bool:
    """While the pod's `ray start` runs (without one: while any of its processes does)."""
    if local.process is not None:
        return local.process.poll() is None
    return bool(localpod.pod_processes(local.uid))
