"""The real Kueue controller on the test bed: the binary `make testbed` built (sigs.k8s.io/kueue/cmd/kueue at
KUEUE_VERSION), its CRDs from its Go module, with only the `ray.io/rayjob` integration, no leader election and no
webhooks (no webhook configuration is installed, so the API server never calls it: the operator creates its RayJobs
suspended and labelled, as Kueue's mutating webhook would).

Who uses it: tests/integration/test_operator_kueue.py.

    Kueue's CRDs (server-side apply) ──> namespace kueue-system ──> kueue --config <workdir>/kueue/config.yaml
        in a private mount namespace (unshare -m, root, like the test bed's pods): with its own certificate
        management off, Kueue reads its metrics certificate from the fixed path /etc/kueue/metrics/certs, so /etc
        is overlaid there (the host's /etc untouched) with a self-signed certificate; the webhook server, which it
        always starts, gets one in its certDir; both listen on loopback ports nobody calls
    ready: GET /readyz on its health port

`queue()` creates a ResourceFlavor, a ClusterQueue with the given quota and a LocalQueue in a namespace;
`priority_class()` a WorkloadPriorityClass. `stop()` stops the process: while Kueue runs it suspends again any
labelled RayJob that a test unsuspends itself (test_operator_queueing.py plays Kueue), so a test module that starts
it stops it when done. Standard
library, plus pyyaml (a core dependency of the project) for the configuration.
"""

from __future__ import annotations

import shlex
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import binaries
import components
import controlplane
import errors

KUEUE_NAMESPACE = "kueue-system"
API = "kueue.x-k8s.io/v1beta2"


def self_signed(directory: Path, name: str) -> Path:
    """tls.crt and tls.key (self-signed, a day) in `directory`; returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(directory / "tls.key"),
            "-out",
            str(directory / "tls.crt"),
        ],
        check=True,
        capture_output=True,
    )
    return directory


def configuration(*, health_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration: RayJob only, no leader election, no certificate management, no visibility server,
    loopback ports."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["ray.io/rayjob"]},
        # Its on-demand visibility API server wants a certificate at the fixed path /visibility: not needed here.
        "featureGates": {"VisibilityOnDemand": False},
    }


def in_private_etc(command: list[str], metrics_certs: Path, scratch: Path) -> list[str]:
    """`command` in a private mount namespace whose /etc is the host's overlaid (writes stay in a tmpfs at
    `scratch`), with `metrics_certs` copied to /etc/kueue/metrics/certs."""
    s, certs = shlex.quote(str(scratch)), shlex.quote(str(metrics_certs))
    script = [
        f"mount -t tmpfs tmpfs {s}",
        f"mkdir {s}/upper {s}/work",
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={s}/upper,workdir={s}/work /etc",
        "mkdir -p /etc/kueue/metrics/certs",
        f"cp {certs}/tls.crt {certs}/tls.key /etc/kueue/metrics/certs/",
        "exec " + shlex.join(command),
    ]
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", "; ".join(script)]


@dataclass(eq=False)
class KueueController(components.OneProcess):
    """`start()` installs the CRDs and starts Kueue (stopped with the control plane); `queue()` makes a queue."""

    plane: controlplane.ControlPlane
    kueue: binaries.Kueue = field(default_factory=binaries.Kueue.locate)
    process: components.Process | None = field(init=False, default=None)
    health_port: int = field(init=False, default=0)

    def start(self, timeout: float = 60.0) -> KueueController:
        self.plane.install_crds(self.kueue.crd_paths)
        self.plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}})
        home = self.plane.workdir / "kueue"
        (home / "etc").mkdir(parents=True, exist_ok=True)
        self.health_port = components.free_port()
        config = home / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                configuration(
                    health_port=self.health_port,
                    webhook_port=components.free_port(),
                    cert_dir=self_signed(home / "webhook-certs", "kueue-webhook"),
                )
            )
        )
        command = [str(self.kueue.binary), f"--config={config}", "--zap-log-level=2"]
        env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(home), "KUBECONFIG": str(self.plane.kubeconfig)}
        self.process = self.plane.spawn(
            "kueue",
            "kueue",
            [],
            env=env,
            command=in_private_etc(command, self_signed(home / "metrics-certs", "kueue-metrics"), home / "etc"),
        )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        while True:
            assert self.process is not None
            if not self.process.alive():
                raise errors.TestbedError(f"kueue exited with {self.process.popen.returncode}:\n{self.log_tail(40)}")
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise errors.TestbedError(f"kueue not ready after {timeout:.0f}s ({url}):\n{self.log_tail(40)}")
            time.sleep(0.2)

    def queue(
        self,
        namespace: str,
        name: str,
        quota: dict[str, str],
        *,
        cluster_queue: str | None = None,
        preempt_lower_priority: bool = False,
    ) -> None:
        """A ResourceFlavor `default`, a ClusterQueue (`cluster_queue`, default `<namespace>-cq`) whose nominal
        quota is `quota` (resource -> quantity, every resource a pod asks for), and LocalQueue `name` in
        `namespace` pointing at it. No cohort; no preemption unless `preempt_lower_priority` (then a workload may
        evict a lower-priority one of the same ClusterQueue)."""
        cq = cluster_queue or f"{namespace}-cq"
        flavor = {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": "default"}}
        resources = [{"name": resource, "nominalQuota": amount} for resource, amount in sorted(quota.items())]
        clusterqueue = {
            "apiVersion": API,
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {"coveredResources": sorted(quota), "flavors": [{"name": "default", "resources": resources}]}
                ],
            },
        }
        if preempt_lower_priority:
            clusterqueue["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
        localqueue = {
            "apiVersion": API,
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cq},
        }
        self.plane.apply(flavor, clusterqueue, localqueue)

    def priority_class(self, name: str, value: int) -> None:
        """A WorkloadPriorityClass (what the kueue.x-k8s.io/priority-class label names)."""
        self.plane.apply(
            {"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value}
        )
