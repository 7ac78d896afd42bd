"""Harness of the operator's cluster tests (`tests/integration/test_operator_*.py`): the operator in-process,
and a test double that plays KubeRay.

`KubeRayDouble` is a test double for what cannot run in these fast tests: the KubeRay controller bringing up a
Ray cluster in containers. It does only what KubeRay 1.5 does to the objects the operator watches: it creates
the attempt's head (and worker) pods from the RayJob's templates, with KubeRay's labels, owned by the RayJob,
on a kwok node; it sets the RayJob's status (Initializing, Running, Complete/Failed with KubeRay's reasons and
Ray's job message); and when told, it evicts a pod or preempts the head, or marks the driver failed. Like KubeRay
1.5, it leaves the RayJob `Running` when the head pod is evicted. Unlike KubeRay, it does not recreate a lost
worker pod (nothing here needs the replacement). Everything else is real: the API server,
admission (our CRD's schema and CEL), RBAC, the garbage collector that removes the pods of a deleted RayJob,
kwok playing the kubelet, and the operator's own code.

The full loop with the real KubeRay operator is another issue's test (tests/e2e).
"""

from __future__ import annotations

import asyncio
import copy
import pathlib
import shlex
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import kubernetes.client
import pytest
import yaml

from support import waiting
from trainingrun_operator import cli
from trainingrun_operator.kube import apiclient, metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
T = TypeVar("T")


def eventually(probe: Callable[[], T | None], timeout: float = 45.0, what: str = "condition") -> T:
    """`waiting.wait` with this file's defaults (a double's reactions take well under a second)."""
    return waiting.wait(probe, timeout=timeout, what=what, interval=0.1)


def args_of(job: dict[str, Any]) -> dict[str, str]:
    """The driver's `--flag value` pairs from a RayJob's entrypoint."""
    argv = shlex.split(job["spec"]["entrypoint"])
    return dict(zip(argv[3::2], argv[4::2], strict=True))


def phase_is(cluster: Cluster, run: str, phase: str) -> dict[str, Any] | None:
    status = cluster.status(run)
    return status if status.get("phase") == phase else None


def tiny_run(name: str = "tiny", **spec_overrides: Any) -> dict[str, Any]:
    """The shipped tiny example with fast backoff (tests wait for restarts)."""
    doc = yaml.safe_load((REPO / "manifests" / "examples" / "tiny.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["restartPolicy"] = {
        "failureBudget": 3,
        "backoff": {"initialSeconds": 0.2, "maxSeconds": 1, "factor": 2},
    }
    doc["spec"].update(spec_overrides)
    return dict(doc)


class Cluster:
    """Typed-enough access to the test bed through the kubernetes client (admin unless a kubeconfig is given)."""

    def __init__(self, control_plane: Any, namespace: str, kubeconfig: pathlib.Path | None = None) -> None:
        self.plane = control_plane
        self.namespace = namespace
        self.client = control_plane.api_client(kubeconfig)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        self.core = kubernetes.client.CoreV1Api(self.client)

    def apply_run(self, doc: dict[str, Any]) -> dict[str, Any]:
        return dict(
            self.custom.create_namespaced_custom_object(
                "trainingrun.dev", "v1alpha1", self.namespace, "trainingruns", doc
            )
        )

    def run(self, name: str) -> dict[str, Any]:
        return dict(
            self.custom.get_namespaced_custom_object(
                "trainingrun.dev", "v1alpha1", self.namespace, "trainingruns", name
            )
        )

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.run(name).get("status") or {})

    def rayjobs(self) -> list[dict[str, Any]]:
        items = self.custom.list_namespaced_custom_object("ray.io", "v1", self.namespace, "rayjobs")["items"]
        return sorted(items, key=lambda j: j["metadata"]["name"])

    def rayjob(self, name: str) -> dict[str, Any] | None:
        return next((j for j in self.rayjobs() if j["metadata"]["name"] == name), None)

    def pods(self, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def events(self, run: str) -> list[str]:
        return [reason for reason, _ in self.event_messages(run)]

    def events_with(self, run: str, *reasons: str, timeout: float = 45.0) -> list[str]:
        """The reasons of `run`'s events once all of `reasons` are among them.

        The operator posts an event after the status patch that a test waits for, so a test that asserts an
        event right after seeing the status races it; this waits instead.
        """

        def posted() -> list[str] | None:
            found = self.events(run)
            return found if set(reasons) <= set(found) else None

        return eventually(posted, timeout=timeout, what=f"events {sorted(reasons)} on {run}")

    def event_messages(self, run: str) -> list[tuple[str, str]]:
        """(reason, message) of every event on TrainingRun `run`, oldest first."""
        found = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={run}").items
        return [(e.reason, e.message) for e in sorted(found, key=lambda e: e.metadata.creation_timestamp)]

    def report(self, run: str, attempt: int, step: int, kubeconfig: pathlib.Path | None = None, **extra: Any) -> None:
        """What the driver's kubernetes reporter sends after a checkpoint's rename (merge patch on status)."""
        client = self.plane.api_client(kubeconfig) if kubeconfig else self.client
        body = {
            "status": {
                "runtime": {
                    "attempt": attempt,
                    "step": step,
                    "reward": 0.5,
                    "updated": "2025-01-01T00:00:00Z",
                    "finished": False,
                    "lastCheckpoint": {
                        "step": step,
                        "path": f"/checkpoints/{run}/step_{step}",
                        "attempt": attempt,
                        "replayDigest": "d" * 64,
                        "weightsSha256": "e" * 64,
                        "time": "2025-01-01T00:00:00Z",
                    },
                    **extra,
                }
            }
        }
        kubernetes.client.CustomObjectsApi(client).patch_namespaced_custom_object_status(
            "trainingrun.dev",
            "v1alpha1",
            self.namespace,
            "trainingruns",
            run,
            body,
            _content_type="application/merge-patch+json",
        )


class KubeRayDouble:
    """Plays the KubeRay 1.5 controller for one namespace (see the module docstring for what it does and why)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.node = cluster.plane.node_names[0]

    def _patch_status(self, name: str, status: dict[str, Any]) -> None:
        self.cluster.custom.patch_namespaced_custom_object_status(
            "ray.io",
            "v1",
            self.cluster.namespace,
            "rayjobs",
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    def _pod(
        self, job: dict[str, Any], group: str, node_type: str, template: dict[str, Any], index: int
    ) -> dict[str, Any]:
        name = job["metadata"]["name"]
        cluster_name = f"{name}-raycluster"
        labels = {
            **template.get("metadata", {}).get("labels", {}),
            "ray.io/cluster": cluster_name,
            "ray.io/node-type": node_type,
            "ray.io/group": group,
        }
        spec = copy.deepcopy(template["spec"])
        spec["nodeName"] = self.node
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.head(name) if node_type == "head" else self.worker(name, group, index),
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "ray.io/v1",
                        "kind": "RayJob",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }

    def start(self, name: str) -> None:
        """RayJob -> Initializing, pods created (kwok makes them Running), then Running with the job RUNNING."""
        job = eventually(lambda: self.cluster.rayjob(name), what=f"RayJob {name}")
        self._patch_status(name, {"jobDeploymentStatus": "Initializing", "rayClusterName": f"{name}-raycluster"})
        cluster_spec = job["spec"]["rayClusterSpec"]
        pods = [self._pod(job, "headgroup", "head", cluster_spec["headGroupSpec"]["template"], 0)]
        for group in cluster_spec.get("workerGroupSpecs", []):
            pods += [
                self._pod(job, group["groupName"], "worker", group["template"], i) for i in range(group["replicas"])
            ]
        for pod in pods:
            self.cluster.core.create_namespaced_pod(self.cluster.namespace, pod)
        head = pods[0]["metadata"]["name"]
        eventually(
            lambda: self.cluster.core.read_namespaced_pod(head, self.cluster.namespace).status.phase == "Running",
            what=f"head pod {head} Running (kwok)",
        )
        self._patch_status(name, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "jobId": f"{name}-job"})

    def head(self, name: str) -> str:
        return f"{name}-raycluster-head-0"

    def worker(self, name: str, group: str, index: int) -> str:
        """Worker `index` of `group` (KubeRay names it `<cluster>-<group>-worker-<random>`; here the index)."""
        return f"{name}-raycluster-{group}-worker-{index}"

    def succeed(self, name: str) -> None:
        """The driver exited 0: Complete/SUCCEEDED (shutdownAfterJobFinishes: the cluster goes away)."""
        self._patch_status(
            name, {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "message": "Job finished successfully."}
        )

    def fail(self, name: str, exit_code: int = 1, log: str = "Traceback: boom") -> None:
        """The driver exited non-zero: Ray's message as KubeRay copies it."""
        self._patch_status(
            name,
            {
                "jobDeploymentStatus": "Failed",
                "jobStatus": "FAILED",
                "reason": "AppFailed",
                "message": f"Job entrypoint command failed with exit code {exit_code}, last available logs: {log}",
            },
        )

    def evict_head(self, name: str) -> None:
        """Eviction API on the head (the API server adds DisruptionTarget, then deletes). RayJob stays Running."""
        self.evict(self.head(name))

    def evict(self, pod: str) -> None:
        """Eviction API on `pod` (the API server adds DisruptionTarget, then deletes it)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": self.cluster.namespace},
        }
        self.cluster.core.create_namespaced_pod_eviction(pod, self.cluster.namespace, body)

    def preempt_head(self, name: str) -> None:
        """What the scheduler does to a preemption victim: DisruptionTarget(PreemptionByScheduler), then delete."""
        pod = self.head(name)
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": "preempted by a higher-priority pod",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }
        self.cluster.core.patch_namespaced_pod_status(  # strategic merge: conditions merge by type
            pod,
            self.cluster.namespace,
            {"status": {"conditions": [condition]}},
            _content_type="application/strategic-merge-patch+json",
        )
        self.cluster.core.delete_namespaced_pod(pod, self.cluster.namespace)


class InProcessOperator:
    """`trainingrun operator` run in a thread of the test process, against the test bed. With `metrics_address`
    (`127.0.0.1:0`: a free port), it serves /metrics there; `.exporter.port` says where, once started."""

    def __init__(
        self,
        kubeconfig: pathlib.Path,
        namespace: str,
        api: apiclient.Api | None = None,
        metrics_address: str | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.api = api or apiclient.Api(apiclient.load_configuration(str(kubeconfig)))
        self.metrics_address = metrics_address
        self.exporter = metrics.Exporter()
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="operator", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(
                cli.operate(
                    self.api,
                    namespaces=[self.namespace],
                    stop_flag=self.stop_flag,
                    ready_flag=self.ready_flag,
                    metrics_address=self.metrics_address,
                    exporter=self.exporter,
                )
            )
        except BaseException as exc:  # re-raised by stop()
            self.error = exc

    def start(self) -> InProcessOperator:
        self.thread.start()
        if not self.ready_flag.wait(30):
            pytest.fail(f"operator not ready in 30s: {self.error!r}")
        return self

    def stop(self) -> None:
        """Stops the operator and re-raises whatever ended its thread: a crash of the operator shows as its own
        error in the test that ran it, not only as a time-out of what the test waited for next."""
        self.stop_flag.set()
        self.thread.join(60)
        self.api.close()
        assert not self.thread.is_alive(), "operator did not stop within 60s"
        if self.error is not None:
            raise self.error
