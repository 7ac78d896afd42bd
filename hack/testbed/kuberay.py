"""The real KubeRay operator on the test bed, with its own identity: the binary `make testbed` built, run as
ServiceAccount kuberay-system/kuberay-operator bound to the ClusterRole from its module's `config/rbac`, with
`HTTP_PROXY` set to the forward proxy (so that the head Services' names reach the local dashboards).

Who uses it: `fullloop.FullLoopBed`. KubeRay's flags are in testbed-facts: without leader election, metrics or
health probes; it needs the rayjobs, rayclusters and rayservices CRDs (the control plane installs all three).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import yaml  # pyyaml: a core dependency of the project

import components
import controlplane
import proxy


class KubeRayError(RuntimeError):
    """The KubeRay operator did not stay up; the message carries its log tail."""


@dataclass(eq=False)
class KubeRayOperator(components.OneProcess):
    """`start()` installs the RBAC and starts the process; `stop()` stops it (the RBAC stays)."""

    plane: controlplane.ControlPlane
    forward_proxy: proxy.ForwardProxy
    namespace: str = "kuberay-system"
    extra_args: tuple[str, ...] = ()

    process: components.Process | None = field(init=False, default=None)

    def install_rbac(self) -> None:
        """The namespace, ServiceAccount, ClusterRole and ClusterRoleBinding from KubeRay's module, applied
        server-side (the binding's subjects pointed at our namespace)."""
        rbac = self.plane.kuberay_module_dir / "config" / "rbac"
        role = yaml.safe_load((rbac / "role.yaml").read_text())
        binding = yaml.safe_load((rbac / "role_binding.yaml").read_text())
        for subject in binding["subjects"]:
            subject["namespace"] = self.namespace
        account = yaml.safe_load((rbac / "service_account.yaml").read_text())
        account["metadata"]["namespace"] = self.namespace
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        self.plane.apply(namespace, account, role, binding, field_manager="trainingrun-testbed")

    def start(self) -> KubeRayOperator:
        self.install_rbac()
        kubeconfig = self.plane.service_account_kubeconfig(
            self.namespace, "kuberay-operator", expiration_seconds=6 * 3600
        )
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.plane.workdir),
            "HTTP_PROXY": self.forward_proxy.url,
            "http_proxy": self.forward_proxy.url,
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
        self.process = self.plane.spawn(
            "kuberay-operator",
            "kuberay-operator",
            [
                "--kubeconfig",
                str(kubeconfig),
                "--enable-leader-election=false",
                "--metrics-addr",
                "0",
                "--health-probe-bind-address",
                "0",
                *self.extra_args,
            ],
            env=env,
        )
        time.sleep(0.5)  # not a synchronisation: a process that cannot start (bad flag, no CRD) exits at once
        if not self.process.alive():
            raise KubeRayError(f"kuberay-operator exited at once:\n{self.process.log_tail()}")
        return self
