"""Harness self-test: the real KubeRay operator runs RayJobs on the test bed, with the pod runner playing the Ray
pods and the forward proxy carrying KubeRay's dashboard calls (HTTPMode) to the local Ray head. If this fails, every
other full-loop test would fail for a reason that is not ours.
"""

from __future__ import annotations

import ast
import time
from typing import TYPE_CHECKING, Any

import pytest

import chaos
import localpod

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py (the `harness` and `loop` fixtures)

pytestmark = pytest.mark.e2e

# KubeRay submits as soon as the head is ready; the worker joins when it joins. The entrypoint waits for it.
PRINT_RESOURCES = (
    'python -c "import ray, time; ray.init(); deadline = time.time() + 120\n'
    "while ray.cluster_resources().get('CPU', 0) < 2 and time.time() < deadline: time.sleep(0.5)\n"
    "print('RESOURCES', dict(ray.cluster_resources()))\""
)
FAIL = "python -c \"import sys; print('about to fail with 3'); sys.exit(3)\""


def rayjob(name: str, entrypoint: str, *, workers: int) -> dict[str, Any]:
    def template(container: str) -> dict[str, Any]:
        return {
            "spec": {
                "containers": [
                    {
                        "name": container,
                        "image": "rayproject/ray:2.60.0",
                        "resources": {
                            "requests": {"cpu": "1", "memory": "1Gi"},
                            "limits": {"cpu": "1", "memory": "1Gi"},
                        },
                    }
                ]
            }
        }

    cluster: dict[str, Any] = {
        "rayVersion": "2.60.0",
        "headGroupSpec": {"rayStartParams": {}, "template": template("ray-head")},
    }
    if workers:
        cluster["workerGroupSpecs"] = [
            {
                "groupName": "w",
                "replicas": workers,
                "minReplicas": workers,
                "maxReplicas": workers,
                "rayStartParams": {},
                "template": template("ray-worker"),
            }
        ]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": entrypoint,
            "submissionMode": "HTTPMode",
            "backoffLimit": 0,
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": cluster,
        },
    }


def test_rayjobs_reach_complete_and_failed_through_the_real_kuberay(harness: Loop, namespace: str) -> None:
    started = time.monotonic()
    harness.plane.apply(
        rayjob("resources", PRINT_RESOURCES, workers=1), rayjob("failing", FAIL, workers=0), namespace=namespace
    )
    path = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs"

    def finished(name: str) -> dict[str, Any] | None:
        job = harness.plane.get(f"{path}/{name}")
        status = (job or {}).get("status", {})
        return job if status.get("jobDeploymentStatus") in ("Complete", "Failed") else None

    done = harness.wait(lambda: finished("resources"), timeout=300, what="RayJob resources to finish")
    failed = harness.wait(lambda: finished("failing"), timeout=120, what="RayJob failing to finish")
    elapsed = time.monotonic() - started

    assert done["status"]["jobDeploymentStatus"] == "Complete", harness.diagnostics()
    assert done["status"]["jobStatus"] == "SUCCEEDED"
    heads = [p for p in harness.bed.runner.pods.values() if p.namespace == namespace and p.role == "head"]
    logs = "".join(text for head in heads for text in head.job_driver_logs().values())
    line = next((ln for ln in logs.splitlines() if ln.startswith("RESOURCES ")), None)
    assert line is not None, f"no RESOURCES line in the driver logs:\n{logs[-2000:]}"
    resources = ast.literal_eval(line.removeprefix("RESOURCES "))
    assert resources["CPU"] == 2.0  # the head's num-cpus=1 (from its limits, by KubeRay) and the worker's

    assert failed["status"]["jobDeploymentStatus"] == "Failed"
    assert failed["status"]["reason"] == "AppFailed"
    assert failed["status"]["jobStatus"] == "FAILED"
    assert "about to fail with 3" in failed["status"].get("message", ""), failed["status"]

    # shutdownAfterJobFinishes: KubeRay deletes the clusters, and the runner kills every process they had.
    clusters = f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters"
    harness.wait(
        lambda: not (harness.plane.get(clusters) or {}).get("items"), timeout=60, what="the RayClusters deleted"
    )
    played = [p for p in harness.bed.runner.pods.values() if p.namespace == namespace]
    assert {p.role for p in played} == {"head", "worker"}
    harness.wait(
        lambda: all(p.state == "killed" and not localpod.pod_processes(p.uid) for p in played),
        timeout=60,
        what="every Ray process of both clusters gone",
    )
    print(f"harness self-test: two RayJobs finished in {elapsed:.1f}s")


def test_a_driver_killed_alone_fails_its_rayjob_while_its_head_pod_stays_up(harness: Loop, namespace: str) -> None:
    harness.plane.apply(
        rayjob("victim", "python -c \"import time; print('driver up'); time.sleep(600)\"", workers=0),
        namespace=namespace,
    )
    runner = harness.bed.runner
    head = harness.wait(
        lambda: next(
            (p for p in runner.pods.values() if p.namespace == namespace and p.role == "head" and p.state == "ready"),
            None,
        ),
        timeout=180,
        what="the head's Ray to answer",
    )
    killed = chaos.kill_driver(runner, namespace, head.name, pattern="time.sleep(600)", timeout=180)
    assert killed
    path = f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs/victim"
    failed = harness.wait(
        lambda: (
            (j := harness.plane.get(path))
            and j.get("status", {}).get("jobDeploymentStatus") in ("Failed", "Complete")
            and j
        ),
        timeout=120,
        what="the RayJob to end",
    )
    assert failed["status"]["jobDeploymentStatus"] == "Failed" and failed["status"]["reason"] == "AppFailed"
    assert "exit code 137" in failed["status"]["message"], failed["status"]  # 128 + SIGKILL
    # Only the driver died: Ray on the head pod ran on until KubeRay shut the cluster down. Two more passes of the
    # runner (each would have seen an exited `ray start`) before saying that none was seen.
    passes = runner.completed_passes + 2
    harness.wait(lambda: runner.completed_passes >= passes, timeout=30, what="two more passes of the pod runner")
    assert head.restarts == 0 and not [e for e in runner.events if head.name in e and "Exited" in e]
