"""The repository's example TrainingRuns shaped for the test bed (shorter runs, the bed's nodes), and their PVC.

Who uses it: the full-loop tests (tests/e2e) and the goodput benchmark (bench/bench_goodput.py).

    tiny_run(name, ...)           manifests/examples/tiny.yaml: everything on the head
    cluster_run(bed, name, ...)   the same, shaped like manifests/examples/cluster.yaml: the head on the bed's node,
                                  a worker group "generation" on the bed's worker node, and with `trainers=N` a
                                  worker group "trainer" (role trainer) of N pods there, one trainer rank each
"""

from __future__ import annotations

from typing import Any

import yaml

import binaries
import fullloop

TINY = binaries.REPO_ROOT / "manifests" / "examples" / "tiny.yaml"


def tiny_run(
    name: str = "tiny", *, claim: str | None = None, checkpoint: dict[str, Any] | None = None, **trainer: Any
) -> dict[str, Any]:
    """manifests/examples/tiny.yaml as shipped, renamed, with `trainer` and `checkpoint` fields overridden (shorter
    runs for the chaos tests), and with 8 logical CPUs for the head's Ray unless the example sets num-cpus: KubeRay
    derives num-cpus=2 from the example's CPU limit, and the driver's TransferQueue needs 3 slots (1 controller + 2
    storage units), so the example as shipped fails with DataPlaneError on a real cluster."""
    run = next(d for d in yaml.safe_load_all(TINY.read_text()) if d and d.get("kind") == "TrainingRun")
    run["metadata"]["name"] = name
    head = run["spec"]["ray"]["head"]
    head["rayStartParams"] = {"num-cpus": "8", **(head.get("rayStartParams") or {})}
    run["spec"]["checkpoint"].update(checkpoint or {})
    run["spec"]["trainer"].update(trainer)
    if claim:
        run["spec"]["checkpoint"]["pvc"]["claimName"] = claim
    return dict(run)


def checkpoints_pvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def cluster_run(
    bed: fullloop.FullLoopBed,
    name: str,
    *,
    workers: int = 2,
    trainers: int = 0,
    claim: str | None = None,
    **trainer: Any,
) -> dict[str, Any]:
    """The tiny example shaped like manifests/examples/cluster.yaml: the head on the bed's node, and a worker
    group "generation" of `workers` replicas on the bed's worker node (they alone tolerate its taint), one
    generation worker per replica. The head keeps 4 logical CPUs: 3 for TransferQueue, 1 to spare. With `trainers`,
    `trainerWorkers` is that many, and they run one a pod in a worker group "trainer" of role trainer, there too."""
    if trainers:
        trainer["trainerWorkers"] = trainers
    run = tiny_run(name, claim=claim, generationWorkers=workers, **trainer)
    ray = run["spec"]["ray"]
    ray["head"]["rayStartParams"] = {"num-cpus": "4"}
    ray["head"]["nodeSelector"] = {"kubernetes.io/hostname": bed.node}
    ray["workers"] = [
        {"name": "generation", "replicas": workers, **_on_worker_node()},
        *([{"name": "trainer", "role": "trainer", "replicas": trainers, **_on_worker_node()}] if trainers else []),
    ]
    return run


def _on_worker_node() -> dict[str, Any]:
    return {
        "rayStartParams": {"num-cpus": "1"},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "nodeSelector": dict(fullloop.WORKER_LABEL),
        "tolerations": [{"operator": "Equal", **fullloop.WORKER_TAINT}],
    }
