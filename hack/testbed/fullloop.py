"""The full-loop bed: the forward proxy, the pod runner and the real KubeRay operator on a running control plane,
and a kwok node of their own for the Ray pods. Also the command that starts everything for a person:

    .venv/bin/python hack/testbed/fullloop.py up [--nodes N]

which starts the control plane and this bed, prints the admin kubeconfig, and stops everything on Ctrl-C.

Who uses it: the full-loop fixtures (tests/e2e/conftest.py, `FullLoopBed.running`) and people (`up`).

    ControlPlane (controlplane.py)
      └── FullLoopBed.start()
            ├── proxy.ForwardProxy          <svc>.<ns>.svc.cluster.local:<port> -> a head's local port
            ├── podrunner.PodRunner         plays the kubelet for KubeRay's pods
            ├── a kwok node "fullloop-…"    with KWOK_POD_STAGES (pods start Running but not Ready); the other
            │                               schedulable nodes are cordoned while the bed is up
            ├── a kwok node "fullloop-workers-…", the same but tainted WORKER_TAINT: only pods that tolerate
            │                               it land there (a cluster-shaped run's worker groups), each node with
            │                               a kwok of its own, so that one can stop heartbeating alone
            ├── kuberay.KubeRayOperator     HTTP_PROXY = the proxy
            └── on demand (`add_container_node`): a kwok node "fullloop-system-…" tainted CONTAINER_TAINT, whose
                                            pods the pod runner runs as podman containers (the chart's operator,
                                            chartrelease.py)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import binaries
import components
import controlplane
import errors
import fakenodes
import kuberay
import podrunner
import proxy

# kwok's default pod stages with two changes. A pod turns Running with its IP but NOT Ready; the pod runner reports
# Ready once Ray answers (as a kubelet does after the readiness probe). With kwok's default (Ready at once), KubeRay
# sees a ready head before Ray listens, calls the dashboard, fails, and backs off exponentially. And a deleted Ray
# pod is not deleted for good by kwok at once: the pod runner runs its preStop hook, ends its processes within its
# grace period and then deletes it, as a kubelet does (a head in its grace period is what the preemption notice
# relies on).
RUNNING_NOT_READY_STAGE = """\
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
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
        ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      phase: Running
      startTime: {{ $now | Quote }}
"""
RAY_NODE_DELETE_STAGE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: '.metadata.deletionTimestamp', operator: Exists}
    - {key: '.metadata.labels["ray.io/node-type"]', operator: DoesNotExist}
  next:
    finalizers: {empty: true}
    delete: true
"""
KWOK_POD_STAGES = f"{RUNNING_NOT_READY_STAGE}---\n{RAY_NODE_DELETE_STAGE}"
# The container node's pods: Running but not Ready at once (the pod runner reports the container), and no delete
# stage: the runner stops the container and deletes the pod for good, as the kubelet does.
CONTAINER_NODE_STAGES = RUNNING_NOT_READY_STAGE


GRACE_CAP_SECONDS = 35.0
"""The bed's pods get the grace period their spec asks for, up to this: the head's default (30 s) in full, so that
the driver's save on the preemption notice has the time it plans with (a pod's processes end as soon as its
`ray start` exits, so a pod that goes quietly does not wait for it)."""

WORKER_TAINT = {"key": "trainingrun.dev/testbed-workers", "value": "true", "effect": "NoSchedule"}
"""On the bed's worker node: a run's worker groups tolerate it (and select WORKER_LABEL), nothing else lands there."""
WORKER_LABEL = {"trainingrun.dev/testbed-pool": "workers"}
"""The bed's worker node carries it, as a cloud's node pool labels its nodes; a replacement node carries it too."""
CONTAINER_TAINT = {"key": "trainingrun.dev/testbed-containers", "value": "true", "effect": "NoSchedule"}
"""On the bed's container node: only pods that tolerate it (the chart's operator, by the chart's values) land there."""
CONTAINER_LABEL = {"trainingrun.dev/testbed-pool": "system"}
"""The container node's pool label, for a nodeSelector (a cluster's system pool, where operators run)."""
CONTAINER_GRACE_CAP = 10.0
"""A container's stop (a failed liveness probe, the pod's deletion) sends SIGKILL after at most this many seconds:
a hung operator ignores SIGTERM, and the chart's 30 s default would add 20 s of nothing to the liveness test; a
healthy kopf stops in about a second."""


@dataclass(eq=False)
class FullLoopBed:
    """Proxy, pod runner and KubeRay on a running control plane, plus a node of its own for the Ray pods: kwok
    plays that node with KWOK_POD_STAGES, and the other schedulable nodes are cordoned while the bed is up (so
    that KubeRay's pods, which we do not build, land there). `stop()` undoes all of it."""

    plane: controlplane.ControlPlane
    ray_in_containers: bool = False  # Ray pods as podman containers from their image (podrunner.PodRunner)
    forward_proxy: proxy.ForwardProxy = field(init=False)
    runner: podrunner.PodRunner = field(init=False)
    kuberay_operator: kuberay.KubeRayOperator = field(init=False)
    node: str = field(init=False, default="")
    kubelet: components.Process | None = field(init=False, default=None)
    worker_node: str = field(init=False, default="")
    worker_kubelet: components.Process | None = field(init=False, default=None)
    container_node: str = field(init=False, default="")
    container_kubelet: components.Process | None = field(init=False, default=None)
    cordoned: list[str] = field(init=False, default_factory=list)

    def start(self) -> FullLoopBed:
        try:
            self.forward_proxy = proxy.ForwardProxy().start()
            self.runner = podrunner.PodRunner.for_plane(
                self.plane, self.forward_proxy, ray_in_containers=self.ray_in_containers
            )
            self.runner.grace_cap = GRACE_CAP_SECONDS
            self.runner.start()
            self._start_node()
            self.kuberay_operator = kuberay.KubeRayOperator(self.plane, self.forward_proxy).start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self) -> None:
        """The Ray pods' nodes (the head's, and the worker groups' behind WORKER_TAINT), each played by a kwok of
        its own with KWOK_POD_STAGES; then every other schedulable node cordoned."""
        suffix = uuid.uuid4().hex[:6]
        self.node, self.worker_node = f"fullloop-{suffix}", f"fullloop-workers-{suffix}"
        self.kubelet = self.start_ray_node(self.node)
        self.worker_kubelet = self.start_ray_node(self.worker_node, taints=[WORKER_TAINT], labels=WORKER_LABEL)
        self.plane.wait_nodes_ready([self.node, self.worker_node])
        status, nodes = self.plane.request("GET", "/api/v1/nodes")
        for other in nodes["items"] if status == 200 else []:
            name = other["metadata"]["name"]
            if name not in (self.node, self.worker_node) and not other["spec"].get("unschedulable"):
                self.plane.kubectl("cordon", name)
                self.cordoned.append(name)

    def start_ray_node(
        self, name: str, *, taints: list[dict[str, str]] | None = None, labels: dict[str, str] | None = None
    ) -> components.Process:
        """Creates node `name` for Ray pods and starts the kwok that plays it."""
        self.plane.create_fake_node(
            name, annotations={fakenodes.KWOK_ANNOTATION: name}, taints=taints or [], labels=labels or {}
        )
        return self.start_kubelet(name)

    def replace_worker_node(self) -> str:
        """The cloud replaces the worker machine: its node object goes (the pod GC then deletes the pods bound to it
        and KubeRay makes new ones) and a new node of another name, in the same pool, registers. Returns its name.
        Call it after `chaos.fail_node` (or on a live node: its pods' processes are killed with it)."""
        old = self.worker_node
        self.runner.kill_node(old)
        self.plane.kubectl("delete", "node", old, "--wait=true", timeout=120)
        if self.worker_kubelet is not None:
            self.worker_kubelet.stop(timeout=5)
        self.worker_node = f"fullloop-workers-{uuid.uuid4().hex[:6]}"
        self.worker_kubelet = self.start_ray_node(self.worker_node, taints=[WORKER_TAINT], labels=WORKER_LABEL)
        self.plane.wait_nodes_ready([self.worker_node])
        return self.worker_node

    def add_container_node(self) -> str:
        """The node whose pods the pod runner runs as podman containers (containerpods.py), once; returns its
        name. Only pods that select CONTAINER_LABEL and tolerate CONTAINER_TAINT land there (the chart's operator,
        given them as values); its own kwok sets them Running but not Ready and leaves their deletion to the
        runner."""
        if self.container_node:
            return self.container_node
        name = f"fullloop-system-{uuid.uuid4().hex[:6]}"
        self.plane.create_fake_node(
            name, annotations={fakenodes.KWOK_ANNOTATION: name}, taints=[CONTAINER_TAINT], labels=CONTAINER_LABEL
        )
        stages = self.runner.workdir / "kwok-container-stages.yaml"
        stages.write_text(CONTAINER_NODE_STAGES)
        self.container_kubelet = self.plane.start_kwok(annotation=name, name=f"kwok-{name}", config=stages)
        self.runner.serve_containers(name, grace_cap=CONTAINER_GRACE_CAP)
        self.plane.wait_nodes_ready([name])
        self.container_node = name
        return name

    def start_kubelet(self, name: str) -> components.Process:
        """Starts the kwok that plays Ray node `name` (also: the kubelet of a node that stopped heartbeating, back)."""
        stages = self.runner.workdir / "kwok-stages.yaml"
        stages.write_text(KWOK_POD_STAGES)
        return self.plane.start_kwok(annotation=name, name=f"kwok-{name}", config=stages)

    def stop(self) -> None:
        parts = ("kuberay_operator", "runner", "kubelet", "worker_kubelet", "container_kubelet", "forward_proxy")
        for part in parts:
            thing = getattr(self, part, None)
            if thing is not None:
                thing.stop()
        for name in self.cordoned:
            self.plane.kubectl("uncordon", name, check=False)
        self.cordoned.clear()
        for node in (self.node, self.worker_node, self.container_node):
            if node:
                self.plane.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)

    def describe(self) -> str:
        """A dump for failing tests: the pod runner's view, the node's kwok log and KubeRay's log."""
        kubelet = self.kubelet.log_tail(10) if self.kubelet else ""
        kubelet += (
            f"\n--- kwok for {self.worker_node}\n{self.worker_kubelet.log_tail(10)}" if self.worker_kubelet else ""
        )
        operator = getattr(self, "kuberay_operator", None)
        runner = getattr(self, "runner", None)
        return (
            f"{runner.describe() if runner else ''}\n--- kwok for {self.node}\n{kubelet}"
            f"\n--- kuberay-operator log (last lines, cut at 300 characters)\n"
            f"{operator.log_tail() if operator else ''}"
        )

    @staticmethod
    @contextlib.contextmanager
    def running(plane: controlplane.ControlPlane, *, ray_in_containers: bool = False) -> Iterator[FullLoopBed]:
        bed = FullLoopBed(plane, ray_in_containers=ray_in_containers)
        try:
            yield bed.start()
        finally:
            bed.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="control plane + forward proxy + pod runner + KubeRay, until Ctrl-C")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start everything, print the admin kubeconfig, wait for Ctrl-C")
    up.add_argument("--nodes", type=int, default=1, help="fake kwok nodes besides the Ray pods' own (default 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        located = binaries.Binaries.locate()
    except errors.MissingBinaries as err:
        print(err, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, controlplane.raise_keyboard_interrupt)
    with controlplane.ControlPlane(located, nodes=args.nodes) as plane, FullLoopBed.running(plane) as bed:
        print(plane.kubeconfig, flush=True)
        print(
            f"# export KUBECONFIG={plane.kubeconfig}; proxy {bed.forward_proxy.url}; pods in {bed.runner.workdir}",
            file=sys.stderr,
            flush=True,
        )
        try:
            while bed.kuberay_operator.process is not None and bed.kuberay_operator.process.alive():
                time.sleep(1)
            print(f"kuberay-operator exited:\n{bed.kuberay_operator.log_tail()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
