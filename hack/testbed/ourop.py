"""Our operator as the chart runs it, but as a local process: the chart's RBAC applied, its ServiceAccount's token.

Who uses it: the full-loop tests (tests/e2e/conftest.py) and the goodput benchmark (bench/bench_goodput.py), which
run `trainingrun operator` against the test bed beside the real KubeRay.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import binaries
import chaos
import components
import controlplane
import errors
import podrunner

CHART = binaries.REPO_ROOT / "charts" / "trainingrun"
OPERATOR_NAMESPACE = "trainingrun-system"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@dataclass(eq=False)
class OperatorProcess:
    """`trainingrun operator` as the chart runs it, but as a local process with the chart's identity."""

    plane: controlplane.ControlPlane
    kubeconfig: Path
    log_path: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, init=False)
    starts: int = field(default=0, init=False)
    metrics_port: int = field(default=0, init=False)
    """Where this start serves /metrics (a free loopback port: never the chart's fixed one, which another
    operator on this machine may hold)."""

    def start(self) -> OperatorProcess:
        env = {
            "PATH": f"{podrunner.VENV_BIN}:/usr/bin:/bin",
            "HOME": str(self.plane.workdir),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "INFO",
        }
        liveness = f"http://127.0.0.1:{components.free_port()}/healthz"
        self.metrics_port = components.free_port()
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
                    "--metrics-address",
                    f"127.0.0.1:{self.metrics_port}",
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
        raise errors.TestbedError(f"helm template {CHART} failed: {rendered.stderr}")
    objects = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc and doc.get("kind") in RBAC_KINDS]
    accounts = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    if len(accounts) != 1:
        raise errors.TestbedError(f"expected one ServiceAccount in the chart, found {accounts}")
    for obj in objects:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"].setdefault("namespace", namespace)
    plane.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        *objects,
        field_manager="trainingrun-e2e",
    )
    return str(accounts[0])


def start(plane: controlplane.ControlPlane) -> OperatorProcess:
    """The chart's RBAC in OPERATOR_NAMESPACE, then our operator running with its ServiceAccount's token."""
    account = install_chart_rbac(plane, OPERATOR_NAMESPACE)
    kubeconfig = plane.service_account_kubeconfig(OPERATOR_NAMESPACE, account, expiration_seconds=6 * 3600)
    return OperatorProcess(plane, kubeconfig, plane.workdir / "trainingrun-operator.log").start()
