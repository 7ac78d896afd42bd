"""charts/trainingrun installed for real: `helm install` into the full-loop bed, the locally built operator image,
and the pod that kube-controller-manager makes run as a podman container by the pod runner.

Who uses it: the chart-operator tests (tests/e2e/test_chart_operator.py).

    helm install <release> charts/trainingrun -n <namespace> --create-namespace --wait -f values.yaml
      values: image localhost/trainingrun-operator:<IMAGE_TAG or dev>, pullPolicy Never (no registry here);
              the bed's container node (its pool label and taint: nodeSelector, tolerations); the chart's own
              ports (the container has a network namespace of its own: podnet.py)
      └── Deployment ──(kube-controller-manager)──> ReplicaSet ──> Pod ──(kube-scheduler)──> the container node
            └── the pod runner (containerpods.py): `podman run` as the pod spec says, its probes, its restarts

Only one operator may act on TrainingRuns at a time: the chart's watches every namespace (watchNamespaces empty),
so nothing else (ourop.OperatorProcess) may run while a release is installed. The release name differs from the
process operator's RBAC (ourop.py: `trainingrun`), so the two never own the same cluster-scoped objects.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

import components
import containerpods
import containerruntime
import controlplane
import errors
import fullloop
import ourop

RELEASE = "chart-e2e"
NAMESPACE = "trainingrun-chart"


@dataclass(eq=False)
class ChartRelease:
    """The chart installed by helm on a full-loop bed (`install`, `uninstall`), and its operator pod."""

    plane: controlplane.ControlPlane
    bed: fullloop.FullLoopBed
    image: str = field(default_factory=lambda: containerruntime.image_ref("operator"))
    release: str = RELEASE
    namespace: str = NAMESPACE
    install_seconds: float = field(init=False, default=0.0)

    @property
    def selector(self) -> str:
        """The operator pods' label selector (the chart's `trainingrun.selector`)."""
        return f"app.kubernetes.io/name=trainingrun,app.kubernetes.io/instance={self.release}"

    def values(self) -> dict[str, Any]:
        repository, _, tag = self.image.rpartition(":")
        return {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "nodeSelector": dict(fullloop.CONTAINER_LABEL),
            "tolerations": [{"operator": "Equal", **fullloop.CONTAINER_TAINT}],
        }

    def install(self, timeout: float = 180) -> ChartRelease:
        """`helm install --wait`: returns once the Deployment is available (its pod's container runs)."""
        node = self.bed.add_container_node()
        values = self.plane.workdir / f"values-{self.release}.yaml"
        values.write_text(yaml.safe_dump(self.values()))
        started = time.monotonic()
        self.helm(
            "install", self.release, str(ourop.CHART), "--namespace", self.namespace, "--create-namespace",
            "--values", str(values), "--wait", "--timeout", f"{int(timeout)}s", timeout=timeout + 30,
        )  # fmt: skip
        self.install_seconds = time.monotonic() - started
        pod = self.pod()
        if pod["spec"].get("nodeName") != node:
            raise errors.TestbedError(f"the operator pod landed on {pod['spec'].get('nodeName')}, not on {node}")
        return self

    def uninstall(self, timeout: float = 90) -> None:
        """`helm uninstall --wait`, then until the operator pods are gone (the pod runner stops their containers and
        deletes them for good), so that no operator outlives the release."""
        self.helm(
            "uninstall", self.release, "--namespace", self.namespace, "--wait", "--timeout", f"{int(timeout)}s",
            check=False, timeout=timeout + 30,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while self.pods() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.plane.kubectl("delete", "namespace", self.namespace, "--wait=false", "--ignore-not-found", check=False)

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The pinned helm against the bed as admin, with its caches in the control plane's directory."""
        home = self.plane.workdir / "helm"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.plane.kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        command = [str(self.plane.binaries.path("helm")), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if check and result.returncode != 0:
            raise errors.TestbedError(f"helm {' '.join(args[:2])} exited {result.returncode}: {result.stderr[-3000:]}")
        return result

    def pods(self) -> list[dict[str, Any]]:
        body = self.plane.get(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={self.selector}")
        return list((body or {}).get("items") or [])

    def pod(self) -> dict[str, Any]:
        """The one live operator pod."""
        live = [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]
        if len(live) != 1:
            raise errors.TestbedError(f"expected one live operator pod, found {[p['metadata']['name'] for p in live]}")
        return live[0]

    def port(self, name: str) -> int:
        """The operator container's port called `name` (the chart's: health, metrics)."""
        (container,) = self.pod()["spec"]["containers"]
        (port,) = [p["containerPort"] for p in container.get("ports") or [] if p.get("name") == name]
        return int(port)

    def pod_ip(self) -> str:
        """The operator pod's IP, as the pod runner reported it (the container's address on podman's bridge)."""
        return str(self.pod()["status"].get("podIP") or "")

    def container(self) -> containerpods.ContainerPod:
        """The pod runner's record of the operator pod's container."""
        meta = self.pod()["metadata"]
        containers = self.bed.runner.containers
        found = containers.find(meta["namespace"], meta["name"]) if containers is not None else None
        if found is None:
            raise errors.TestbedError(f"the pod runner does not run {meta['namespace']}/{meta['name']}")
        return found

    def manifest(self) -> list[dict[str, Any]]:
        """What helm installed (`helm get manifest`), as objects."""
        text = self.helm("get", "manifest", self.release, "--namespace", self.namespace).stdout
        return [d for d in yaml.safe_load_all(text) if d]

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.helm("status", self.release, "-n", self.namespace, "-o", "json").stdout))

    def log_tail(self, lines: int = 60) -> str:
        """The operator container's log (the current instance's, and the previous one's after a restart)."""
        try:
            local = self.container()
        except errors.TestbedError as err:
            return str(err)
        previous = local.directory / f"{local.container}-{local.restarts - 1}.log"
        before = f"--- previous instance\n{components.tail(previous, lines)}\n" if local.restarts else ""
        return f"{before}--- {local.instance}\n{local.log_tail(lines)}"
