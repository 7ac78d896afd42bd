"""KubeRay's Ray pods as real containers: the full-loop bed with `ray_in_containers`, where the pod runner runs every
Ray pod as a podman container from the run's image (`localhost/trainingrun-runtime:<IMAGE_TAG or dev>`) instead of
local processes (hack/testbed/containerpods.py):

    KubeRay's generated command and environment as they are (`ulimit -n 65536; ray start --head ... --block`),
    the checkpoint PVC bind-mounted from its PV's directory, the memory-backed /dev/shm as podman's --shm-size,
    KubeRay's exec probes run inside the container (`podman exec`), the head's preStop hook likewise, the pod's own
    network namespace and IP on podman's bridge, the head's Services as --add-host entries, KubeRay reaching the
    dashboard through the forward proxy at the head container's address, and the driver reaching the API server
    through the bed's relay with the per-run ServiceAccount's projected token (in-cluster configuration).

Against it: exact resume across two preemptions of the head, one in the middle of a save (support/journeys.py: every
attempt resumes from a recorded step, and the final weights equal those of the configuration the RayJob gave its driver,
run uninterrupted on a local Ray; a failure report prints the seed of its random moments), with what only containers
show: KubeRay's own command in the run's image, the checkpoint written to the PVC as the image's user (UID 1000), the
driver's log outliving its evicted container; and a worker group's pod (KubeRay's init container, the head found by its
Service name, the generation worker in it). The user's journey itself (one eviction, `kubectl wait`, the printer
columns) runs against the chart's operator in test_chart_operator.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

import containerpods
import controlplane
import fullloop
from support import containers, journeys

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py
    from support.uninterrupted import References

pytestmark = [pytest.mark.e2e, pytest.mark.containers]

IMAGE_USER = 1000  # runtime/Dockerfile: `useradd --uid 1000 ray`, `USER 1000`


@pytest.fixture(scope="module")
def full_loop(control_plane: controlplane.ControlPlane) -> Iterator[fullloop.FullLoopBed]:
    """This module's bed: Ray pods as containers (conftest.py's `full_loop` runs them as processes)."""
    containers.image("runtime")  # rebuilt first if its inputs changed since it was built
    with fullloop.FullLoopBed.running(control_plane, ray_in_containers=True) as bed:
        yield bed


def test_a_worker_container_waits_in_kuberays_init_container_reaches_its_head_by_service_name_and_generates(
    loop: Loop, namespace: str
) -> None:
    run = loop.cluster_run("gen", workers=1, claim="gen-checkpoints", steps=20)
    run["spec"]["image"] = containers.image("runtime")
    loop.plane.apply(loop.checkpoints_pvc("gen-checkpoints"), run, namespace=namespace)
    final = loop.wait_phase(namespace, "gen", "Succeeded", timeout=600)
    assert [a["reason"] for a in final["attempts"]] == ["Succeeded"], final["attempts"]

    keeper = loop.bed.runner.containers
    assert keeper is not None
    (worker,) = [p for p in keeper.pods.values() if p.namespace == namespace and "-worker-" in p.name]
    init, ray = worker.stages
    assert init.spec["name"] == "wait-gcs-ready", init.spec  # KubeRay's, run to its end before Ray started
    assert "ray start" in " ".join(ray.spec.get("args") or []) and "--address" in " ".join(ray.spec["args"])
    head_service = next(h for h in worker.hosts if h.endswith(".svc.cluster.local"))
    assert head_service.split(".")[0] in " ".join(ray.spec["args"]) + json.dumps(ray.env), (head_service, ray.env)
    (head,) = [p for p in keeper.pods.values() if p.namespace == namespace and "-head-" in p.name]
    assert worker.hosts[head_service] == head.pod_ip, worker.hosts
    # The generation worker ran in the worker's container: Ray names each actor's log `:actor_name:<class>`.
    ray_tmp = worker.directory / "volumes" / containerpods.RAY_TMP_VOLUME
    actors = [p.read_text(errors="replace") for p in ray_tmp.glob("session_*/logs/worker-*.out")]
    assert any(":actor_name:Generator" in text for text in actors), [t[:80] for t in actors]


def test_two_preemptions_one_during_a_save_end_with_the_weights_of_an_uninterrupted_run_and_write_as_the_images_user(
    loop: Loop, namespace: str, uninterrupted: References, chaos_seed: int
) -> None:
    image = containers.image("runtime")
    journeys.preemptions_end_with_the_weights_of_an_uninterrupted_run(
        loop, namespace, uninterrupted, seed=chaos_seed, image=image
    )

    keeper = loop.bed.runner.containers
    assert keeper is not None
    heads = [p for p in keeper.pods.values() if p.namespace == namespace and "-head-" in p.name]
    assert len(heads) == 3, [p.key for p in keeper.pods.values()]  # one per attempt, the two evicted included
    for head in heads:
        ray = head.stages[-1].spec
        assert head.image == image and ray["image"] == image
        assert "ray start --head" in " ".join(ray.get("args") or []), ray  # KubeRay's command, not rewritten
        assert any(m.kind == "persistentVolumeClaim" and m.target == "/checkpoints" for _, m in head.stages[-1].binds)
    (first,) = [h for h in heads if h.name.startswith("rp-a1-")]
    logged = "".join(first.job_driver_logs().values())
    assert journeys.STEP_LOG.search(logged), "attempt 1's driver log did not outlive its evicted container"
    assert not loop.bed.runner.pods, "no Ray pod ran as a local process"

    volume = loop.bed.runner.claim_directory(namespace, "rp-checkpoints")
    written = [p for p in volume.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in written), sorted(map(str, written))[:20]
    owners = {p.stat().st_uid for p in written}
    assert owners == {IMAGE_USER}, {str(p): p.stat().st_uid for p in written if p.stat().st_uid != IMAGE_USER}
