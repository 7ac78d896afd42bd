"""Chaos controls for the full-loop tests: the ways a cluster takes a Ray pod (or our operator) away.

Who calls it: tests/e2e (the journey, repeated preemption, zombie and operator-kill tests) and the pod-runner
tests. It is a TEST COMPONENT. Each control does what the real cause does to the API objects, and the pod runner
(`podrunner.PodRunner`, playing the kubelet; a pod's processes are `localpod.LocalPod`'s) does what it does to the
processes:

    evict(...)                 the Eviction API (what `kubectl drain` and the node-pressure path use)
    disrupt_and_delete(...)    a DisruptionTarget condition, then a delete (what the scheduler's preemption and
                               the taint manager do)
    fail_node(...)             the node's kubelet stops (its kwok process), the node turns NotReady, and every
                               process of its pods is SIGKILLed (the machine is gone)
    lapse_node(...)            the node's kubelet stops and the node turns NotReady; its processes run on
    kill_driver(...)           SIGKILL to the Ray job's driver process only; the pod and Ray stay up
    freeze_driver(...)         SIGSTOP to the driver and its controller actor (the train loop): a hung driver whose
                               pod and Ray stay up
    partition(...)             the pod is force-deleted but its processes keep running, optionally frozen until
                               `thaw` (a zombie attempt)
    kill_process(...)          SIGKILL a whole process group (our operator)
    hang_container(...)        SIGSTOP to a pod's container's main process (the chart's operator hung: its
                               liveness endpoint accepts connections and never answers)

Standard library only, plus this directory's modules and `trainingrun_runtime.timestamps`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import components
import containerruntime
import controlplane
import localpod
import podrunner
import podstatus
from trainingrun_runtime import timestamps


class ChaosError(RuntimeError):
    """A chaos control could not act (nothing to kill, the API refused); the message says what was missing."""


def pods(plane: controlplane.ControlPlane, namespace: str, selector: str) -> list[dict[str, Any]]:
    status, body = plane.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")
    if status != 200:
        raise ChaosError(f"listing pods {selector} in {namespace}: {status} {body}")
    return list(body.get("items") or [])


def head_pod(plane: controlplane.ControlPlane, namespace: str, selector: str = "") -> dict[str, Any]:
    """The one live head pod matching `selector` (labels, comma-separated) in `namespace`."""
    query = ",".join(filter(None, ["ray.io/node-type=head", selector]))
    live = [p for p in pods(plane, namespace, query) if not p["metadata"].get("deletionTimestamp")]
    if len(live) != 1:
        raise ChaosError(
            f"expected one live head pod for {query!r} in {namespace}, found {[p['metadata']['name'] for p in live]}"
        )
    return live[0]


def evict(plane: controlplane.ControlPlane, namespace: str, pod: str, grace_seconds: int | None = None) -> None:
    """Evicts `pod` through the Eviction API (policy/v1); raises unless the API server accepted it (201).
    `grace_seconds` overrides the pod's termination grace period (0: the processes get SIGKILL at once, as when
    a spot VM is reclaimed without notice)."""
    eviction: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
    }
    if grace_seconds is not None:
        eviction["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
    status, body = plane.request("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", eviction)
    if status != 201:
        raise ChaosError(f"eviction of {namespace}/{pod} returned {status}: {body}")


def disrupt_and_delete(
    plane: controlplane.ControlPlane,
    namespace: str,
    pod: str,
    reason: str = "PreemptionByScheduler",
    message: str = "testbed chaos: preempted to make room for a higher-priority pod",
) -> None:
    """Sets the pod's DisruptionTarget condition (as the scheduler does before a preemption), then deletes it."""
    now = timestamps.now(timespec="seconds")
    status, body = plane.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{pod}/status",
        {
            "status": {
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now,
                    }
                ]
            }
        },
        content_type=podstatus.PATCH_CONTENT_TYPE,
    )
    if status != 200:
        raise ChaosError(f"setting DisruptionTarget on {namespace}/{pod} returned {status}: {body}")
    status, body = plane.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod}")
    if status not in (200, 202):
        raise ChaosError(f"deleting {namespace}/{pod} returned {status}: {body}")


def fail_node(
    plane: controlplane.ControlPlane, runner: podrunner.PodRunner, node: str, kubelet: components.Process
) -> list[localpod.LocalPod]:
    """The node dies: its kubelet stops posting status (`lapse_node`) and every process of its pods is SIGKILLed
    (the machine is gone). Returns the pods killed."""
    lapse_node(plane, node, kubelet)
    return runner.kill_node(node)


def lapse_node(plane: controlplane.ControlPlane, node: str, kubelet: components.Process) -> None:
    """The node stops heartbeating while its processes keep running (a kubelet or network blip): its kubelet (a
    kwok process that manages only this node) stops, and its Ready condition turns Unknown at once (the node
    lifecycle controller would do the same after its grace period, then mark its pods not Ready)."""
    kubelet.stop(timeout=5)
    now = timestamps.now(timespec="seconds")
    status, body = plane.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        {
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "Unknown",
                        "reason": "NodeStatusUnknown",
                        "message": "testbed chaos: kubelet stopped posting node status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ]
            }
        },
        content_type=podstatus.PATCH_CONTENT_TYPE,
    )
    if status != 200:
        raise ChaosError(f"marking node {node} NotReady returned {status}: {body}")


def driver_processes(runner: podrunner.PodRunner, namespace: str, pod: str, pattern: str) -> list[int]:
    """Processes of `pod` whose command line contains `pattern` (the Ray job driver, started by Ray's job
    supervisor inside the head pod)."""
    local = runner.find(namespace, pod)
    if local is None:
        raise ChaosError(f"the pod runner does not play {namespace}/{pod}")
    found = []
    for pid in localpod.pod_processes(local.uid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pattern in cmdline and "/bin/sh" not in cmdline.split(" ", 1)[0]:
            found.append(pid)
    return found


def kill_driver(
    runner: podrunner.PodRunner, namespace: str, pod: str, pattern: str = "trainingrun_runtime", timeout: float = 60.0
) -> list[int]:
    """SIGKILLs the driver process(es) in `pod` (waiting up to `timeout` for one to exist); Ray and the pod stay."""
    deadline = time.monotonic() + timeout
    while not (pids := driver_processes(runner, namespace, pod, pattern)):
        if time.monotonic() > deadline:
            raise ChaosError(f"no process matching {pattern!r} in {namespace}/{pod} after {timeout:.0f}s")
        time.sleep(0.2)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def freeze_driver(
    runner: podrunner.PodRunner,
    namespace: str,
    pod: str,
    patterns: tuple[str, ...] = ("trainingrun_runtime", "ray::SingleController"),
    timeout: float = 60.0,
) -> list[int]:
    """SIGSTOPs the processes in `pod` matching each of `patterns` (waiting up to `timeout` for all of them): by
    default the driver and the controller actor that runs its train loop and sends its reports, so the attempt
    hangs as a deadlock would while its pod and Ray stay up. Deleting the pod kills them (SIGKILL after the grace
    period). Returns the pids stopped."""
    deadline = time.monotonic() + timeout
    while not all(found := [driver_processes(runner, namespace, pod, p) for p in patterns]):
        if time.monotonic() > deadline:
            raise ChaosError(f"not every one of {patterns} runs in {namespace}/{pod} after {timeout:.0f}s: {found}")
        time.sleep(0.2)
    pids = sorted({pid for group in found for pid in group})
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    return pids


def partition(
    plane: controlplane.ControlPlane, runner: podrunner.PodRunner, namespace: str, pod: str, *, freeze: bool = False
) -> localpod.LocalPod:
    """The pod's node is cut off: the API object is force-deleted (as after a node loss), but its processes keep
    running: a zombie. With `freeze`, they are also stopped (SIGSTOP: a node paused, e.g. a VM live-migrated)
    until `thaw`. Returns the runner's record, whose processes `runner.stop()` (or `end_zombie`) kills."""
    local = runner.find(namespace, pod)
    if local is None:
        raise ChaosError(f"the pod runner does not play {namespace}/{pod}")
    runner.detach(local.uid)
    if freeze:
        localpod.signal_pod(local.uid, local.process, signal.SIGSTOP)
    status, body = plane.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/{pod}",
        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
    )
    if status not in (200, 202, 404):
        raise ChaosError(f"force-deleting {namespace}/{pod} returned {status}: {body}")
    return local


def thaw(local: localpod.LocalPod) -> None:
    """Resumes what `partition(freeze=True)` stopped."""
    localpod.signal_pod(local.uid, local.process, signal.SIGCONT)


def end_zombie(local: localpod.LocalPod) -> None:
    """SIGKILLs what `partition` left running."""
    localpod.kill_all(local.uid, local.process)


def kill_process(popen: subprocess.Popen[Any]) -> int:
    """SIGKILLs a process and its process group (our operator, started in its own session); returns its pid."""
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    popen.wait(10)
    return popen.pid


def hang_container(runner: podrunner.PodRunner, namespace: str, pod: str) -> str:
    """The main process of the pod's container stops (SIGSTOP through the container runtime), as a deadlocked
    process does: the kernel still accepts connections on its sockets, and nothing answers them, so an HTTP probe
    times out. SIGKILL still ends it (the kubelet's kill after the grace period). Returns the container's name."""
    local = runner.containers.find(namespace, pod) if runner.containers is not None else None
    if local is None or local.state != "running":
        raise ChaosError(f"the pod runner runs no container for {namespace}/{pod}")
    result = containerruntime.podman("kill", "--signal", "SIGSTOP", local.instance, check=False)
    if result.returncode != 0:
        raise ChaosError(f"podman kill --signal SIGSTOP {local.instance}: {result.stderr.strip()}")
    return local.instance
