"""Full-loop fixtures: the real KubeRay operator, the pod runner and proxy, and our operator as its own process.

    control_plane (tests/conftest.py: etcd, kube-apiserver, controller manager, scheduler, kwok)
      └── full_loop (module, hack/testbed/fullloop.py): forward proxy + pod runner (plays the kubelet for Ray
            pods) + KubeRay operator (its own ServiceAccount and ClusterRole from its module's config/rbac;
            HTTP_PROXY = the proxy)
      └── trainingrun_operator (module): `trainingrun operator` in its own process group, authenticated as the
            chart's ServiceAccount (RBAC rendered from charts/trainingrun by helm, applied as is)

Module scope, not session scope: while the bed is up, KubeRay acts on every RayJob and the other nodes are
cordoned, which the operator's own cluster tests (with their KubeRay test double) must not see. Starting the bed
takes a few seconds; the Ray pods are what costs. Each test gets a fresh namespace (`namespace`,
tests/conftest.py). On failure, the tests print what the pod runner saw and the logs of KubeRay and our operator.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

import chaos
import components
import controlplane
import fullloop
import podrunner
from support import waiting

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trainingrun"
TINY = REPO / "manifests" / "examples" / "tiny.yaml"
OPERATOR_NAMESPACE = "trainingrun-system"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
T = TypeVar("T")


@pytest.fixture(scope="module")
def full_loop(control_plane: controlplane.ControlPlane) -> Iterator[fullloop.FullLoopBed]:
    with fullloop.FullLoopBed.running(control_plane) as bed:
        yield bed


@dataclass(eq=False)
class OperatorProcess:
    """`trainingrun operator` as the chart runs it, but as a local process with the chart's identity."""

    plane: controlplane.ControlPlane
    kubeconfig: Path
    log_path: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    starts: int = field(default=0, init=False)

    def start(self) -> OperatorProcess:
        env = {
            "PATH": f"{podrunner.VENV_BIN}:/usr/bin:/bin",
            "HOME": str(self.plane.workdir),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "INFO",
        }
        liveness = f"http://127.0.0.1:{components.free_port()}/healthz"
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"\n===== start {self.starts + 1} =====\n".encode())
            log_file.flush()
            self.popen = subprocess.Popen(
                [
                    str(podrunner.VENV_BIN / "trainingrun"),
                    "operator",
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--liveness",
                    liveness,
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.plane.workdir,
                start_new_session=True,
            )
        self.starts += 1
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> int:
        """SIGKILL, as a node or the OOM killer would; returns the pid."""
        assert self.popen is not None
        return chaos.kill_process(self.popen)

    def stop(self) -> None:
        if self.alive():
            assert self.popen is not None
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                chaos.kill_process(self.popen)

    def log_tail(self, lines: int = 60) -> str:
        return components.tail(self.log_path, lines)


def install_chart_rbac(plane: controlplane.ControlPlane, namespace: str) -> str:
    """Renders charts/trainingrun with helm and applies its RBAC objects (not the Deployment: the operator runs
    here as a local process). Returns the operator's ServiceAccount name."""
    rendered = subprocess.run(
        [
            str(plane.binaries.path("helm")),
            "template",
            "trainingrun",
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            plane.binaries.versions["K8S_VERSION"],
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if rendered.returncode != 0:
        pytest.fail(f"helm template {CHART} failed: {rendered.stderr}", pytrace=False)
    objects = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc and doc.get("kind") in RBAC_KINDS]
    accounts = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    if len(accounts) != 1:
        pytest.fail(f"expected one ServiceAccount in the chart, found {accounts}", pytrace=False)
    for obj in objects:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"].setdefault("namespace", namespace)
    plane.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        *objects,
        field_manager="trainingrun-e2e",
    )
    return str(accounts[0])


@pytest.fixture(scope="module")
def trainingrun_operator(
    control_plane: controlplane.ControlPlane, full_loop: fullloop.FullLoopBed
) -> Iterator[OperatorProcess]:
    account = install_chart_rbac(control_plane, OPERATOR_NAMESPACE)
    kubeconfig = control_plane.service_account_kubeconfig(OPERATOR_NAMESPACE, account, expiration_seconds=6 * 3600)
    process = OperatorProcess(control_plane, kubeconfig, control_plane.workdir / "trainingrun-operator.log").start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def operator(trainingrun_operator: OperatorProcess) -> OperatorProcess:
    """Our operator, alive at the start of the test (restarted if an earlier test killed it)."""
    if not trainingrun_operator.alive():
        trainingrun_operator.start()
    return trainingrun_operator


@dataclass(eq=False)
class Loop:
    """What a full-loop test works with: the cluster, the bed, our operator, and polling with diagnostics."""

    plane: controlplane.ControlPlane
    bed: fullloop.FullLoopBed
    operator: OperatorProcess | None = None

    def diagnostics(self) -> str:
        ours = f"\n--- trainingrun operator log\n{self.operator.log_tail()}" if self.operator else ""
        return f"{self.bed.describe()}{ours}"

    def wait(self, probe: Callable[[], T | None], *, timeout: float, what: str) -> T:
        """`waiting.wait` with this loop's diagnostics (the pod runner, KubeRay and our operator) on a timeout."""
        return waiting.wait(probe, timeout=timeout, what=what, diagnostics=self.diagnostics, interval=0.25)

    def tiny_run(
        self, name: str = "tiny", *, claim: str | None = None, checkpoint: dict[str, Any] | None = None, **trainer: Any
    ) -> dict[str, Any]:
        return tiny_run(name, claim=claim, checkpoint=checkpoint, **trainer)

    def checkpoints_pvc(self, name: str) -> dict[str, Any]:
        return checkpoints_pvc(name)

    def run_status(self, namespace: str, name: str) -> dict[str, Any]:
        run = self.plane.get(f"/apis/trainingrun.dev/v1alpha1/namespaces/{namespace}/trainingruns/{name}")
        return dict((run or {}).get("status") or {})

    def rayjobs(self, namespace: str) -> list[dict[str, Any]]:
        return list((self.plane.get(f"/apis/ray.io/v1/namespaces/{namespace}/rayjobs") or {}).get("items") or [])

    def wait_phase(self, namespace: str, name: str, phase: str, *, timeout: float) -> dict[str, Any]:
        """Waits for `phase`; fails at once (with diagnostics) if the run ends Failed instead."""

        def reached() -> dict[str, Any] | None:
            status = self.run_status(namespace, name)
            if status.get("phase") == "Failed" and phase != "Failed":
                pytest.fail(
                    f"run {name} Failed: {status.get('reason')}: {status.get('message')}\n"
                    f"attempts: {status.get('attempts')}\n{self.diagnostics()}",
                    pytrace=False,
                )
            return status if status.get("phase") == phase else None

        return self.wait(reached, timeout=timeout, what=f"run {name} {phase}")


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
    control_plane: controlplane.ControlPlane, full_loop: fullloop.FullLoopBed, operator: OperatorProcess, namespace: str
) -> Iterator[Loop]:
    yield Loop(control_plane, full_loop, operator)
    if not operator.alive():
        operator.start()
    clean_up(control_plane, namespace)


@pytest.fixture
def harness(
    control_plane: controlplane.ControlPlane, full_loop: fullloop.FullLoopBed, namespace: str
) -> Iterator[Loop]:
    """The bed without our operator (the KubeRay self-test does not need it)."""
    yield Loop(control_plane, full_loop)
    clean_up(control_plane, namespace)
