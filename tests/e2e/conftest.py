"""Full-loop fixtures: the real KubeRay operator, the pod runner and proxy, and our operator as its own process.

    control_plane (tests/conftest.py: etcd, kube-apiserver, controller manager, scheduler, kwok)
      └── full_loop (module, hack/testbed/fullloop.py): forward proxy + pod runner (plays the kubelet for Ray
            pods) + KubeRay operator (its own ServiceAccount and ClusterRole from its module's config/rbac;
            HTTP_PROXY = the proxy)
      └── trainingrun_operator (module): `trainingrun operator` in its own process group, authenticated as the
            chart's ServiceAccount (RBAC rendered from charts/trainingrun by helm, applied as is)
      └── chart_operator (module): instead, charts/trainingrun installed by `helm install` with the operator image
            (`make images`); its pod runs as a podman container that the pod runner plays (chartrelease.py).
            Never in the same module as `trainingrun_operator`: each acts on every namespace's runs

Module scope, not session scope: while the bed is up, KubeRay acts on every RayJob and the other nodes are
cordoned, which the operator's own cluster tests (with their KubeRay test double) must not see. Starting the bed
takes a few seconds; the Ray pods are what costs. Each test gets a fresh namespace (`namespace`,
tests/conftest.py). On failure, the tests print what the pod runner saw and the logs of KubeRay and our operator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

import chartrelease
import controlplane
import examples
import fullloop
import ourop
from support import containers, waiting

OPERATOR_NAMESPACE = "trainingrun-system"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
T = TypeVar("T")


@pytest.fixture(scope="module")
def full_loop(control_plane: controlplane.ControlPlane) -> Iterator[fullloop.FullLoopBed]:
    with fullloop.FullLoopBed.running(control_plane) as bed:
        yield bed


@pytest.fixture(scope="module")
def trainingrun_operator(
    control_plane: controlplane.ControlPlane, full_loop: fullloop.FullLoopBed
) -> Iterator[ourop.OperatorProcess]:
    process = ourop.start(control_plane)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def chart_operator(
    request: pytest.FixtureRequest, control_plane: controlplane.ControlPlane, full_loop: fullloop.FullLoopBed
) -> Iterator[chartrelease.ChartRelease]:
    both = [
        item.name
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and "trainingrun_operator" in getattr(item, "fixturenames", ())
    ]
    if both:
        pytest.fail(f"{both} ask for the process operator in a module with the chart's: two operators", pytrace=False)
    containers.image("operator")  # rebuilt first if its inputs changed since it was built
    release = chartrelease.ChartRelease(control_plane, full_loop)
    try:
        yield release.install()
    finally:
        release.uninstall()


@pytest.fixture
def operator(trainingrun_operator: ourop.OperatorProcess) -> ourop.OperatorProcess:
    """Our operator, alive at the start of the test (restarted if an earlier test killed it)."""
    if not trainingrun_operator.alive():
        trainingrun_operator.start()
    return trainingrun_operator


@dataclass(eq=False)
class Loop:
    """What a full-loop test works with: the cluster, the bed, our operator, and polling with diagnostics."""

    plane: controlplane.ControlPlane
    bed: fullloop.FullLoopBed
    operator: ourop.OperatorProcess | chartrelease.ChartRelease | None = None

    def diagnostics(self) -> str:
        ours = f"\n--- trainingrun operator log\n{self.operator.log_tail()}" if self.operator else ""
        return f"{self.bed.describe()}{ours}"

    def wait(self, probe: Callable[[], T | None], *, timeout: float, what: str) -> T:
        """`waiting.wait` with this loop's diagnostics (the pod runner, KubeRay and our operator) on a timeout."""
        return waiting.wait(probe, timeout=timeout, what=what, diagnostics=self.diagnostics, interval=0.25)

    def tiny_run(
        self, name: str = "tiny", *, claim: str | None = None, checkpoint: dict[str, Any] | None = None, **trainer: Any
    ) -> dict[str, Any]:
        return examples.tiny_run(name, claim=claim, checkpoint=checkpoint, **trainer)

    def cluster_run(
        self, name: str, *, workers: int = 2, trainers: int = 0, claim: str | None = None, **trainer: Any
    ) -> dict[str, Any]:
        return examples.cluster_run(self.bed, name, workers=workers, trainers=trainers, claim=claim, **trainer)

    def checkpoints_pvc(self, name: str) -> dict[str, Any]:
        return examples.checkpoints_pvc(name)

    def run_status(self, namespace: str, name: str) -> dict[str, Any]:
        run = self.plane.get(f"/apis/trainingrun.dev/v1alpha1/namespaces/{namespace}/trainingruns/{name}")
        return dict((run or {}).get("status") or {})

    def rayjobs(self, namespace: str) -> list[dict[str, Any]]:
        return list((self.plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs") or {}).get("items") or [])

    def events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        items = (self.plane.get(f"/api/v1/namespaces/{namespace}/events") or {}).get("items") or []
        return [e for e in items if e.get("reason") == reason]

    def wait_events(self, namespace: str, reason: str, *, timeout: float = 60) -> list[dict[str, Any]]:
        """The namespace's events of `reason` once there is one (our operator posts events after the status patch
        that a test saw, so asserting them at once races the operator)."""
        return self.wait(lambda: self.events(namespace, reason) or None, timeout=timeout, what=f"a {reason} event")

    def status_unless_failed(self, namespace: str, name: str) -> dict[str, Any]:
        """The run's status; the test fails at once, with diagnostics, if the run has Failed (a wait for anything
        else would otherwise run to its timeout)."""
        status = self.run_status(namespace, name)
        if status.get("phase") == "Failed":
            pytest.fail(
                f"run {name} Failed: {status.get('reason')}: {status.get('message')}\n"
                f"attempts: {status.get('attempts')}\n{self.diagnostics()}",
                pytrace=False,
            )
        return status

    def wait_phase(self, namespace: str, name: str, phase: str, *, timeout: float) -> dict[str, Any]:
        """Waits for `phase`; fails at once (with diagnostics) if the run ends Failed instead."""

        def reached() -> dict[str, Any] | None:
            status = (
                self.run_status(namespace, name) if phase == "Failed" else self.status_unless_failed(namespace, name)
            )
            return status if status.get("phase") == phase else None

        return self.wait(reached, timeout=timeout, what=f"run {name} {phase}")


def clean_up(plane: controlplane.ControlPlane, namespace: str) -> None:
    """Deletes the test's TrainingRuns and RayJobs while our operator and KubeRay still run to remove their
    finalizers; otherwise the namespace would hang in Terminating, and later tests' operators would find them."""
    for kind in ("trainingruns.trainingrun.dev", "rayjobs.ray.io"):
        plane.kubectl(
            "delete",
            kind,
            "--all",
            "-n",
            namespace,
            "--wait=true",
            "--timeout=90s",
            "--ignore-not-found",
            check=False,
            timeout=120,
        )


@pytest.fixture
def loop(
    control_plane: controlplane.ControlPlane,
    full_loop: fullloop.FullLoopBed,
    operator: ourop.OperatorProcess,
    namespace: str,
) -> Iterator[Loop]:
    yield Loop(control_plane, full_loop, operator)
    if not operator.alive():
        operator.start()
    clean_up(control_plane, namespace)


@pytest.fixture
def chart_loop(
    control_plane: controlplane.ControlPlane,
    full_loop: fullloop.FullLoopBed,
    chart_operator: chartrelease.ChartRelease,
    namespace: str,
) -> Iterator[Loop]:
    """The loop with the chart's operator (a container) instead of the process."""
    yield Loop(control_plane, full_loop, chart_operator)
    clean_up(control_plane, namespace)


@pytest.fixture
def harness(
    control_plane: controlplane.ControlPlane, full_loop: fullloop.FullLoopBed, namespace: str
) -> Iterator[Loop]:
    """The bed without our operator (the KubeRay self-test does not need it)."""
    yield Loop(control_plane, full_loop)
    clean_up(control_plane, namespace)
