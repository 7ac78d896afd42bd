"""KubeRay's Ray pods as real containers: the full-loop bed with `ray_in_containers`, where the pod runner runs every
Ray pod as a podman container from the run's image (`localhost/trainingrun-runtime:<IMAGE_TAG or dev>`) instead of
local processes (hack/testbed/containerpods.py):

    KubeRay's generated command and environment as they are (`ulimit -n 65536; ray start --head ... --block`),
    the checkpoint PVC bind-mounted from its PV's directory, the memory-backed /dev/shm as podman's --shm-size,
    KubeRay's exec probes run inside the container (`podman exec`), the head's preStop hook likewise, the pod's own
    network namespace and IP on podman's bridge, the head's Services as --add-host entries, KubeRay reaching the
    dashboard through the forward proxy at the head container's address, and the driver reaching the API server
    through the bed's relay with the per-run ServiceAccount's projected token (in-cluster configuration).

Against it: the user's journey (support/journeys.py: the head evicted, attempt 2 resumes, Succeeded), and what
only containers show: the checkpoint written to the PVC as the image's user (UID 1000).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

import controlplane
import fullloop
from support import containers, journeys

if TYPE_CHECKING:
    from conftest import Loop  # tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.containers]

IMAGE_USER = 1000  # runtime/Dockerfile: `useradd --uid 1000 ray`, `USER 1000`


@pytest.fixture(scope="module")
def full_loop(control_plane: controlplane.ControlPlane) -> Iterator[fullloop.FullLoopBed]:
    """This module's bed: Ray pods as containers (conftest.py's `full_loop` runs them as processes)."""
    containers.image("runtime")  # rebuilt first if its inputs changed since it was built
    with fullloop.FullLoopBed.running(control_plane, ray_in_containers=True) as bed:
        yield bed


def test_the_journey_runs_on_ray_pods_that_are_containers_of_the_runtime_image_and_writes_as_its_user(
    loop: Loop, namespace: str
) -> None:
    image = containers.image("runtime")
    figures = journeys.evicted_head_is_survived(loop, namespace, image=image)

    keeper = loop.bed.runner.containers
    assert keeper is not None
    heads = [p for p in keeper.pods.values() if p.namespace == namespace and "-head-" in p.name]
    assert len(heads) == 2, [p.key for p in keeper.pods.values()]  # attempt 1's (evicted) and attempt 2's
    for head in heads:
        ray = head.stages[-1].spec
        assert head.image == image and ray["image"] == image
        assert "ray start --head" in " ".join(ray.get("args") or []), ray  # KubeRay's command, not rewritten
        assert any(m.kind == "persistentVolumeClaim" and m.target == "/checkpoints" for _, m in head.stages[-1].binds)
        assert figures["driver_logged_step_before_eviction"] is not None, "the driver's log outlived its container"
    assert not loop.bed.runner.pods, "no Ray pod ran as a local process"

    volume = loop.bed.runner.claim_directory(namespace, "tiny-checkpoints")
    written = [p for p in volume.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in written), sorted(map(str, written))[:20]
    owners = {p.stat().st_uid for p in written}
    assert owners == {IMAGE_USER}, {str(p): p.stat().st_uid for p in written if p.stat().st_uid != IMAGE_USER}
