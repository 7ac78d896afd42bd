"""The pod runner's containers: the pods bound to the bed's container nodes, and with the runner's
`ray_in_containers` KubeRay's Ray pods, run as real podman containers (runc), as a kubelet runs them; otherwise Ray
pods are local processes (localpod.py). A TEST COMPONENT.

Who uses it: `podrunner.PodRunner` (it calls `sync` on every pass with the pods bound to its container nodes and
`stop` when it stops), `chaos` (a hung container) and the tests (a pod's container: `find`).

    kube-scheduler binds a pod to a container node; the node's kwok sets it Running with a pod IP, not ready
      └── ContainerPods.sync (every pass of the pod runner)
          ├── start    ──> once the runner can name the pod's hosts (`hosts`: a Ray worker waits for its head),
          │                the pod's volumes made once: emptyDir a 0777 directory (medium Memory: a tmpfs, podman's
          │                --shm-size at /dev/shm); a PVC its PV's directory (`claim_directory`); projected the
          │                ServiceAccount token (TokenRequest, bound to the pod), the namespace's kube-root-ca.crt
          │                (the API server's CA, published by the controller manager), the namespace
          │                (containerspec.py); a Ray container's /tmp/ray a directory of the pod's
          │                (RAY_TMP_VOLUME); the images checked (never pulled); the init containers one after
          │                another, each to exit 0, then the pod's container; each `podman run --rm` left
          │                attached, so that its exit is the container's, on podman's bridge: a network
          │                namespace and IP of its own, the hosts as --add-host, and KUBERNETES_SERVICE_HOST/PORT
          │                the bed's relay to the API server (podnet.py); Running once podman wrote the container
          │                id, with the container's IP as the pod's podIP, and Ready then unless a readiness probe
          │                says otherwise; the kubelet's events (Pulled, Created, Started)
          ├── probes   ──> a thread per probe of the running container, as a kubelet's (probes.py): httpGet at the
          │                pod's IP and the probe's container port, exec by `podman exec`; a failed liveness
          │                verdict: events Unhealthy and Killing, `podman stop` (SIGTERM, SIGKILL after the grace)
          ├── exits    ──> the termination becomes lastState.terminated; restarted under restartPolicy Always (or
          │                OnFailure after a failure): the first restart at once, then after 10 s, 20 s, ... up
          │                to 300 s (CrashLoopBackOff), restartCount + 1; else phase Failed/Succeeded
          └── endings  ──> pod deleted: its preStop exec hook (`podman exec`; none with grace 0), then `podman
                           stop`, both within its grace period (capped by `grace_cap`; a hook that used it up
                           leaves 2 s), then the final delete; node deleted: killed at once; `stop()`: every
                           container removed, and the relay stopped

Every container is labelled with its pod (io.kubernetes.pod.*) and with the pid of the process that runs this
runner (RUNNER_LABEL): a later runner removes containers whose runner is gone (a test process killed outright;
normally `podman run` gets SIGTERM with its parent and passes it on). Standard library only, plus this
directory's modules.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import components
import containerruntime
import containerspec
import fakenodes
import kubeapi
import localpod
import podnet
import podspec
import podstatus
import probes
import provisioner
from trainingrun_runtime import timestamps

log = logging.getLogger(__name__)

RUNNER_LABEL = "dev.trainingrun.testbed.runner"
PRE_STOP_EXTENSION_S = 2.0
PODMAN_EXEC_SLACK_S = 3.0
"""Added to an exec probe's timeoutSeconds: `podman exec` itself takes a while to start on a loaded machine (the
kubelet's timeout covers only the command; KubeRay's probes allow 1-2 s)."""
RAY_TMP_VOLUME = "ray-tmp"
"""A Ray container's /tmp/ray (Ray's session: logs, sockets) is this directory of the pod's on this machine, so that
the tests read a driver's log after its head is gone, as a cluster's log collection would keep it. The bed's one
addition to a Ray pod."""
LIVE_STATES = ("creating", "running", "backoff")


@dataclass(frozen=True)
class Stage:
    """One container of a pod as it will run: its spec, its environment and its mounts' host directories."""

    spec: dict[str, Any]
    env: dict[str, str]
    binds: list[tuple[Path, containerspec.Mount]]


@dataclass(eq=False)
class ContainerPod:
    """One pod this runner runs as a container: its identity, what it was given, and its current instance."""

    uid: str
    namespace: str
    name: str
    node: str
    container: str
    image: str
    restart_policy: str
    grace_seconds: float
    directory: Path  # volumes, logs, container ids
    pod: dict[str, Any]  # the pod as it was when the runner started it (its spec does not change)
    # What each container is given, init containers first, the pod's container last: its spec, environment, and
    # the host directory of each of its mounts (in `stage` order).
    stages: list[Stage] = field(default_factory=list)
    stage: int = 0  # the container that runs now (or next): an init container while stage < len(stages) - 1
    hosts: dict[str, str] = field(default_factory=dict)  # --add-host entries, fixed at the pod's start
    image_id: str = ""
    container_id: str = ""
    pod_ip: str = ""  # the current instance's address on the bridge (reported as the pod's IP)
    process: subprocess.Popen[bytes] | None = None  # the attached `podman run --rm` of the current instance
    # creating (podman run started) -> running (podman wrote the id) -> backoff -> creating ... (a restart), or
    # -> exited (not restarted; also a pod that could not start); any state -> killing -> killed
    state: str = "pending"
    restarts: int = 0
    started_at: str = ""
    ready: bool = False
    last_terminated: dict[str, Any] | None = None
    restart_after: float = 0.0
    probes_stop: threading.Event = field(default_factory=threading.Event)  # set when the instance ends

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def current(self) -> str:
        """The name of the container that runs now (an init container's until they have all succeeded)."""
        return str(self.stages[self.stage].spec["name"]) if self.stages else self.container

    @property
    def initializing(self) -> bool:
        return self.stage < len(self.stages) - 1

    @property
    def instance(self) -> str:
        """The current container's name, as the kubelet's dockershim named them (one per restart)."""
        return f"k8s_{self.current}_{self.name}_{self.namespace}_{self.uid[:8]}_{self.restarts}"

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.current}-{self.restarts}.log"

    @property
    def cid_file(self) -> Path:
        return self.directory / f"{self.current}-{self.restarts}.cid"

    def job_driver_logs(self) -> dict[str, str]:
        """A Ray head's per-job driver logs (`job-driver-<submission id>.log`), by file name: Ray's /tmp/ray is a
        directory of the pod's on this machine (RAY_TMP_VOLUME), so they outlive the container."""
        return localpod.job_driver_logs(self.directory / "volumes" / RAY_TMP_VOLUME)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        return components.tail(self.log_path, lines)


@dataclass(eq=False)
class ContainerPods:
    """Runs the pods bound to the container nodes as podman containers (see the module docstring)."""

    api: kubeapi.KubeApi
    workdir: Path
    record: Callable[[str], None]  # the pod runner's event list
    remove: Callable[[dict[str, Any]], None]  # the kubelet's final delete of a pod object
    grace_cap: float = 10.0
    # Where PVC (namespace, claim)'s data lives on this machine (its PV's directory); None: no claim is mounted.
    claim_directory: Callable[[str, str], Path] | None = None
    # name -> IP that `pod` resolves without cluster DNS (its RayCluster's head Service), None while a name it
    # needs has no address yet (its head not running): the pod waits for a later pass.
    hosts: Callable[[dict[str, Any]], dict[str, str] | None] | None = None
    # Variables added to the environment of `pod`'s own container (the runner's `add_env`: a test's crash points).
    extra_env: Callable[[dict[str, Any]], dict[str, str]] | None = None
    pods: dict[str, ContainerPod] = field(init=False, default_factory=dict)
    _lock: threading.RLock = field(init=False, default_factory=threading.RLock)
    _not_ready: set[str] = field(init=False, default_factory=set)  # pods whose volume was reported not ready
    network: podnet.PodNetwork = field(init=False)  # the bridge and the relay to the API server, started lazily

    def __post_init__(self) -> None:
        host, _, port = self.api.server.removeprefix("https://").rpartition(":")
        self.network = podnet.PodNetwork((host, int(port)))
        sweep_orphans()

    # -- what the runner, chaos and the tests use ------------------------------------------------------------

    def find(self, namespace: str, name: str) -> ContainerPod | None:
        with self._lock:
            found = [p for p in self.pods.values() if p.namespace == namespace and p.name == name]
        return found[-1] if found else None

    def running(self) -> list[ContainerPod]:
        """The pods whose container runs now (the pod's own container, not an init container)."""
        with self._lock:
            pods = list(self.pods.values())
        return [p for p in pods if p.state == "running" and not p.initializing]

    def describe(self) -> list[str]:
        with self._lock:
            pods = list(self.pods.values())
        return [
            f"--- {p.key} (container {p.instance}, {p.state}, restarts {p.restarts}) {p.log_path}\n{p.log_tail(15)}"
            for p in pods
        ]

    def stop(self) -> None:
        """Removes every container this runner started (SIGKILL) and waits for its `podman run` to return."""
        with self._lock:
            pods = list(self.pods.values())
        for local in pods:
            local.probes_stop.set()
            if local.alive():
                containerruntime.podman("rm", "--force", "--time", "0", local.instance, check=False, timeout=60)
            _reap(local)
            local.state = "killed"
        leftovers = containerruntime.podman(
            "ps", "-aq", "--filter", f"label={RUNNER_LABEL}={os.getpid()}", check=False
        ).stdout.split()
        if leftovers:
            containerruntime.podman("rm", "--force", "--time", "0", *leftovers, check=False, timeout=60)
        self.network.stop()

    # -- the pass ----------------------------------------------------------------------------------------

    def sync(self, pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any]]) -> None:
        """One level-triggered look at the pods bound to the container nodes: start, tend or end each one."""
        seen = set()
        for pod in pods:
            meta = pod["metadata"]
            seen.add(meta["uid"])
            with self._lock:
                local = self.pods.get(meta["uid"])
            node = nodes.get(pod["spec"].get("nodeName") or "")
            deleted = bool(meta.get("deletionTimestamp"))
            if deleted and (local is None or local.state in ("exited", "killed")):
                if fakenodes.kubelet_up(node):
                    self.remove(pod)  # nothing of it runs (any more): the kubelet's final delete
            elif local is not None and local.state in ("killing", "killed"):
                continue
            elif local is None:
                status = pod.get("status") or {}
                if fakenodes.kubelet_up(node) and status.get("phase") == "Running" and status.get("podIP"):
                    hosts = {} if self.hosts is None else self.hosts(pod)
                    if hosts is not None:
                        self._start(pod, hosts)
            elif node is None:
                self._kill(local, f"node {local.node} deleted", grace=0.0)
            elif not fakenodes.node_ready(node):
                continue  # the kubelet cannot post status; the container runs on
            elif deleted:
                grace = min(float(meta.get("deletionGracePeriodSeconds") or local.grace_seconds), self.grace_cap)
                self._kill(local, "pod deleted", grace=grace, remove=pod)
            else:
                self._tend(local)
        with self._lock:
            gone = [p for uid, p in self.pods.items() if uid not in seen and p.state not in ("killing", "killed")]
        for local in gone:
            self._kill(local, "pod gone", grace=local.grace_seconds)

    # -- starting ------------------------------------------------------------------------------------------

    def _start(self, pod: dict[str, Any], hosts: dict[str, str]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        containers = spec["containers"]
        local = ContainerPod(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            node=spec["nodeName"],
            container=containers[0]["name"],
            image=containers[0]["image"],
            restart_policy=spec.get("restartPolicy", "Always"),
            grace_seconds=float(min(spec.get("terminationGracePeriodSeconds", 30), self.grace_cap)),
            directory=self.workdir / "containers" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}",
            pod=pod,
            hosts=hosts,
        )
        try:
            if len(containers) != 1:
                raise probes.Unsupported("only pods of one container (and its init containers) are run")
            self._prepare(local)
        except containerspec.VolumeNotReady as err:
            if local.uid not in self._not_ready:  # the kubelet retries the mount; so does the next pass
                self._not_ready.add(local.uid)
                self._event(local, "Warning", "FailedMount", str(err))
            return
        except (probes.Unsupported, containerruntime.PodmanError, OSError) as err:
            with self._lock:
                self.pods[local.uid] = local
            local.state = "exited"
            never_pull = isinstance(err, containerruntime.PodmanError) and "is not present" in str(err)
            reason = "ErrImageNeverPull" if never_pull else "CreateContainerError"
            self._event(local, "Warning", "Failed", f"{reason}: {err}")
            self._report(local, {"waiting": {"reason": reason, "message": str(err)[:500]}})
            return
        with self._lock:
            self.pods[local.uid] = local
        self._launch(local)

    def _prepare(self, local: ContainerPod) -> None:
        """The pod's volumes and each container's environment, and the image's id (the image must be here: the bed
        pulls none)."""
        pod, container = local.pod, local.pod["spec"]["containers"][0]
        everyone = [*(pod["spec"].get("initContainers") or []), container]
        for each in everyone:
            policy = each.get("imagePullPolicy", "IfNotPresent")
            if policy == "Always":
                raise probes.Unsupported(f"imagePullPolicy Always for {each['image']}: the test bed pulls no image")
            found = containerruntime.podman("image", "inspect", "--format", "{{.Id}}", each["image"], check=False)
            if found.returncode != 0:
                message = f'Container image "{each["image"]}" is not present with pull policy of {policy}'
                raise containerruntime.PodmanError(message)
            local.image_id = found.stdout.strip()  # the last one: the pod's container
        for kind in ("livenessProbe", "readinessProbe"):
            probes.read(container, kind)  # one the runner cannot play refuses the pod now, not once it runs
        if container.get("startupProbe"):
            raise probes.Unsupported(f"{local.container}.startupProbe: not played")
        if pod["spec"].get("hostNetwork"):
            raise probes.Unsupported("hostNetwork: the bed gives every container pod a network namespace of its own")
        api_host, api_port = self.network.api_address()  # the relay on the bridge's gateway (started once)
        stages = []
        for each in everyone:
            binds = [(self._volume(local, mount), mount) for mount in containerspec.mounts(pod, each)]
            if podspec.plays(pod) and each is container:
                ray_tmp = containerspec.Mount(RAY_TMP_VOLUME, "emptyDir", "/tmp/ray", read_only=False)
                binds.append((self._volume(local, ray_tmp), ray_tmp))
            env = containerspec.environment(pod, each, self._lookup, api_host=api_host, api_port=api_port)
            if each is container and self.extra_env is not None:
                env.update(self.extra_env(pod))
            stages.append(Stage(each, env, binds))
        local.stages = stages
        local.directory.mkdir(parents=True, exist_ok=True)
        self._event(local, "Normal", "Pulled", f'Container image "{local.image}" already present on machine')

    def _volume(self, local: ContainerPod, mount: containerspec.Mount) -> Path:
        """The host directory behind `mount` (made once per pod and volume): a PVC's PV directory (and subPath), a
        projected volume's files, an emptyDir's directory; a memory emptyDir has none (podman makes its tmpfs)."""
        pod = local.pod
        if mount.kind == "persistentVolumeClaim":
            if self.claim_directory is None:
                raise probes.Unsupported(f"volume {mount.volume!r}: this runner mounts no claim")
            try:
                source = self.claim_directory(local.namespace, mount.claim)
            except provisioner.ClaimNotMountable as err:  # not bound yet: the kubelet retries the mount, as we do
                raise containerspec.VolumeNotReady(str(err)) from err
            if mount.sub_path:
                source = source / mount.sub_path
                source.mkdir(parents=True, exist_ok=True)
            return source
        source = local.directory / "volumes" / mount.volume
        if mount.kind == "projected":
            files = containerspec.projected_files(
                pod, mount.volume, token=lambda audience, ttl: self._token(pod, audience, ttl), config_map=self._key
            )
            _write_files(source, files)
        elif mount.kind == "emptyDir" and not source.is_dir():
            source.mkdir(parents=True, exist_ok=True)
            source.chmod(0o777)  # as the kubelet makes an emptyDir: any user of the pod may write it
        return source

    def _launch(self, local: ContainerPod) -> None:
        """Starts the current instance (of an init container, or of the pod's container once they have all
        succeeded): `podman run --rm`, attached, its output into the instance's log."""
        stage = local.stages[local.stage]
        container = stage.spec
        labels = {
            "io.kubernetes.pod.name": local.name,
            "io.kubernetes.pod.namespace": local.namespace,
            "io.kubernetes.pod.uid": local.uid,
            "io.kubernetes.container.name": local.current,
            RUNNER_LABEL: str(os.getpid()),
        }
        options = containerspec.run_options(
            local.pod,
            container,
            name=local.instance,
            env=stage.env,
            binds=stage.binds,
            labels=labels,
            network=self.network.run_options(),
            hosts=local.hosts,
        )
        command = containerruntime.command(
            "run", "--rm", "--cidfile", str(local.cid_file), *options, local.image, *containerspec.args(container)
        )
        local.probes_stop = threading.Event()
        local.cid_file.unlink(missing_ok=True)
        with open(local.log_path, "wb") as log_file:
            local.process = subprocess.Popen(
                command,
                env=containerruntime.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=components.die_with_parent(signal.SIGTERM),  # podman passes it on to the container
            )
        local.state, local.container_id, local.ready = "creating", "", False
        local.pod_ip = ""
        self.record(f"{local.key} [container]: Creating: {local.instance}")

    # -- running -------------------------------------------------------------------------------------------

    def _tend(self, local: ContainerPod) -> None:
        if local.state == "backoff":
            if time.monotonic() >= local.restart_after:
                local.restarts += 1
                self._launch(local)
            return
        if local.state not in ("creating", "running") or local.process is None:
            return
        code = local.process.poll()
        if code is not None and local.initializing:
            self._init_exited(local, code)
        elif code is not None:
            self._exited(local, code)
        elif local.initializing:
            return  # the kubelet reports an init container's progress in initContainerStatuses; the bed does not
        elif local.state == "creating" and _read(local.cid_file):
            # The container's address on the bridge: podman writes the id when it creates the container and sets
            # up its network namespace when it starts it; until then (or if it is gone already), the next pass.
            local.pod_ip = self.network.pod_ip(local.instance)
            if not local.pod_ip:
                return
            local.container_id = _read(local.cid_file)
            local.state, local.started_at = "running", _now()
            readiness = probes.read(local.pod["spec"]["containers"][0], "readinessProbe")
            local.ready = readiness is None  # without a readiness probe, the kubelet calls it ready at once
            self._event(local, "Normal", "Created", f"Created container {local.container}")
            self._event(local, "Normal", "Started", f"Started container {local.container} ({local.instance})")
            self._report(local, {"running": {"startedAt": local.started_at}})
            for kind in ("livenessProbe", "readinessProbe"):
                probe = probes.read(local.pod["spec"]["containers"][0], kind)
                if probe is not None:
                    threading.Thread(
                        target=self._probe, args=(local, probe, local.probes_stop, local.instance, local.pod_ip),
                        name=f"{kind}-{local.name}", daemon=True,
                    ).start()  # fmt: skip

    def _init_exited(self, local: ContainerPod, code: int) -> None:
        """An init container's `podman run` returned: on success the next container starts at once; a failure is
        retried with the pod's restart backoff (restartPolicy Never: the pod fails), as the kubelet does."""
        self._event(local, "Normal", "Exited", f"{local.instance} (init): exit code {code}")
        if code == 0:
            local.stage += 1
            self._launch(local)
        elif local.restart_policy == "Never":
            local.state = "exited"
            terminated = {"exitCode": code, "reason": "Init:Error", "finishedAt": _now()}
            self._report(local, {"terminated": terminated}, phase="Failed")
        else:
            delay = min(10.0 * 2**local.restarts, 300.0)
            local.state, local.restart_after = "backoff", time.monotonic() + delay
            self._event(local, "Warning", "BackOff", f"back-off {delay:g}s restarting failed init container")

    def _exited(self, local: ContainerPod, code: int) -> None:
        """The instance's `podman run` returned `code` (the container's exit code; 125-127: podman could not run
        it): record the termination, and restart later if the restart policy says so."""
        local.probes_stop.set()
        now = _now()
        reason = "Error" if code else "Completed"
        local.last_terminated = {
            "exitCode": code,
            "reason": reason,
            "startedAt": local.started_at or now,
            "finishedAt": now,
            "containerID": f"podman://{local.container_id}" if local.container_id else None,
        }
        local.ready = False
        self._event(local, "Normal", "Exited", f"{local.instance}: exit code {code}; log tail:\n{local.log_tail(8)}")
        if local.restart_policy == "Always" or (local.restart_policy == "OnFailure" and code != 0):
            delay = 0.0 if local.restarts == 0 else min(10.0 * 2 ** (local.restarts - 1), 300.0)
            local.state, local.restart_after = "backoff", time.monotonic() + delay
            if delay:
                message = f"back-off {delay:g}s restarting failed container={local.container} pod={local.name}"
                self._event(local, "Warning", "BackOff", message)
                self._report(local, {"waiting": {"reason": "CrashLoopBackOff", "message": message}})
        else:
            local.state = "exited"
            self._report(local, {"terminated": dict(local.last_terminated)}, phase="Failed" if code else "Succeeded")

    def _probe(
        self, local: ContainerPod, probe: probes.Probe, stop: threading.Event, instance: str, pod_ip: str
    ) -> None:
        """One probe of one instance (at its IP, `pod_ip`), as the kubelet's prober worker: from
        initialDelaySeconds on, a check every periodSeconds until the instance ends; a failed liveness verdict stops
        the container (and the pass restarts it), a readiness verdict turns the pod Ready or not."""
        label = "Liveness" if probe.kind == "livenessProbe" else "Readiness"
        tally = probes.Tally(probe)
        if stop.wait(probe.initial_delay):
            return
        due = time.monotonic()
        while not stop.is_set():
            if probe.command:
                ok, detail = probes.check_exec(
                    probe, lambda command, timeout: _exec(instance, command, timeout + PODMAN_EXEC_SLACK_S)
                )
            else:
                ok, detail = probes.check(probe, pod_ip)
            if stop.is_set():
                return
            verdict = tally.record(ok)
            if not ok:
                self._event(local, "Warning", "Unhealthy", f"{label} probe failed: {detail}")
            if probe.kind == "livenessProbe" and verdict is False:
                grace = min(probe.termination_grace or local.grace_seconds, self.grace_cap)
                self._event(
                    local, "Normal", "Killing", f"Container {local.container} failed liveness probe, will be restarted"
                )
                stop.set()
                _stop_container(instance, grace)
                return
            if verdict is not None and probe.kind == "readinessProbe" and local.state == "running":
                local.ready = verdict
                self._report(local, {"running": {"startedAt": local.started_at}})
            due += probe.period
            stop.wait(max(0.0, due - time.monotonic()))

    # -- stopping ------------------------------------------------------------------------------------------

    def _kill(self, local: ContainerPod, why: str, *, grace: float, remove: dict[str, Any] | None = None) -> None:
        """Stops the container in a thread, as the kubelet does (a deleted pod's preStop exec hook first, then
        SIGTERM, SIGKILL once `grace` seconds have passed in all), then deletes the pod object `remove` for good."""
        with self._lock:
            if local.state in ("killing", "killed"):
                return
            local.state = "killing"
        local.probes_stop.set()
        self._event(local, "Normal", "Killing", f"Stopping container {local.container}: {why}, grace {grace:g} s")

        def finish() -> None:
            hook = podspec.pre_stop_command(local.pod["spec"]["containers"][0])
            started = time.monotonic()
            # A deleted pod's hook runs in its own container (not an init container's); grace 0: no hook.
            ran_hook = remove is not None and grace > 0 and local.alive() and not local.initializing
            if ran_hook and hook is not None:
                code, output = _exec(local.instance, hook, grace)
                self.record(f"{local.key} [container]: PreStop: exit {code}: {output.strip()[-300:]}")
            if local.alive():
                left = grace - (time.monotonic() - started)
                if ran_hook and hook is not None and left <= 0:
                    left = PRE_STOP_EXTENSION_S  # a hook that used the grace up: the kubelet's one-off extension
                _stop_container(local.instance, max(0.0, left))
            _reap(local)
            local.state = "killed"
            self.record(f"{local.key} [container]: Killed: {why}")
            if remove is not None:
                self.remove(remove)

        threading.Thread(target=finish, name=f"kill-{local.name}", daemon=True).start()

    # -- the API: status, events, tokens, keys ---------------------------------------------------------------

    def _report(self, local: ContainerPod, state: dict[str, Any], *, phase: str | None = None) -> None:
        body = podstatus.container(
            name=local.container,
            image=local.image,
            image_id=local.image_id,
            container_id=f"podman://{local.container_id}" if local.container_id else "",
            restarts=local.restarts,
            ready=local.ready and "running" in state,
            state=state,
            last_terminated=local.last_terminated,
            when=_now(),
            pod_ip=local.pod_ip or None,
        )
        if phase:
            body["status"]["phase"] = phase
        self.api.patch_pod_status(local.namespace, local.name, body, content_type=podstatus.PATCH_CONTENT_TYPE)

    def _event(self, local: ContainerPod, kind: str, reason: str, message: str) -> None:
        """An Event on the pod, as the kubelet posts it (`kubectl describe pod` shows it), and a line in the
        runner's own list."""
        self.record(f"{local.key} [container]: {reason}: {message}")
        now = timestamps.now(timespec="seconds")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{local.name}.", "namespace": local.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": local.namespace,
                "name": local.name,
                "uid": local.uid,
                "fieldPath": f"spec.containers{{{local.container}}}",
            },
            "reason": reason,
            "message": message[:1000],
            "type": kind,
            "source": {"component": "kubelet", "host": local.node},
            "reportingComponent": "kubelet",
            "reportingInstance": local.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        status, answer = self.api.request("POST", f"/api/v1/namespaces/{local.namespace}/events", event)
        if status != 201:
            log.warning("posting event %s on %s returned %s: %s", reason, local.key, status, answer)

    def _token(self, pod: dict[str, Any], audience: str | None, ttl: int) -> str:
        try:
            return kubeapi.service_account_token(
                self.api,
                pod["metadata"]["namespace"],
                pod["spec"].get("serviceAccountName") or "default",
                expiration_seconds=ttl,
                audiences=[audience] if audience else None,
                bound_pod=pod,
            )
        except kubeapi.TokenRequestFailed as err:  # the ServiceAccount not made yet: the kubelet retries too
            raise containerspec.VolumeNotReady(str(err)) from err

    def _key(self, namespace: str, name: str, key: str) -> str | None:
        status, obj = self.api.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        return str(obj["data"][key]) if status == 200 and key in (obj.get("data") or {}) else None

    def _lookup(self, namespace: str, kind: str, name: str, key: str) -> str | None:
        if kind == "configmaps":
            return self._key(namespace, name, key)
        raise probes.Unsupported(f"env from {kind}/{name}: only ConfigMap keys and fieldRefs are resolved")


def _write_files(directory: Path, files: dict[str, str]) -> None:
    """A projected volume's files, readable by any user (the kubelet's defaultMode 0644)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    for relative, content in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(0o644)


def _exec(instance: str, command: list[str], timeout: float) -> tuple[int | None, str]:
    """`podman exec` of `command` in the running container `instance` (a probe, a preStop hook): its exit code and
    output, None for the code when `timeout` seconds passed first (the command is left to die with the container)."""
    try:
        done = subprocess.run(
            containerruntime.command("exec", instance, *command),
            env=containerruntime.environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=max(timeout, 0.1),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, ""
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


def _stop_container(instance: str, grace: float) -> None:
    """`podman stop`: SIGTERM, SIGKILL after `grace` seconds; a container that outlives that is removed by force."""
    stopped = containerruntime.podman("stop", "--time", str(int(grace)), instance, check=False, timeout=grace + 60)
    if stopped.returncode != 0 and "no such container" not in stopped.stderr.lower():
        containerruntime.podman("rm", "--force", "--time", "0", instance, check=False, timeout=60)


def _reap(local: ContainerPod) -> None:
    """Waits for the instance's `podman run` to return (it does once the container is gone)."""
    if local.process is None:
        return
    try:
        local.process.wait(30)
    except subprocess.TimeoutExpired:
        local.process.kill()
        local.process.wait(10)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _now() -> str:
    return timestamps.now(timespec="seconds")


def sweep_orphans() -> list[str]:
    """Removes the containers of runners whose process is gone (a test process killed outright); returns their
    names. A bed without podman has none."""
    template = '{{.Names}} {{index .Labels "' + RUNNER_LABEL + '"}}'
    try:
        listed = containerruntime.podman("ps", "-a", "--filter", f"label={RUNNER_LABEL}", "--format", template)
    except containerruntime.PodmanError:
        return []
    orphans = []
    for line in listed.stdout.splitlines():
        name, _, pid = line.partition(" ")
        if pid.isdigit() and not _process_exists(int(pid)):
            orphans.append(name)
    if orphans:
        containerruntime.podman("rm", "--force", "--time", "0", *orphans, check=False, timeout=60)
    return orphans


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
