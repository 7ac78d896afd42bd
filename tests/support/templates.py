"""Pod template fragments for the tests of spec.ray.head.template and spec.ray.workers[].template.

`HEAD` and `WORKER` use what a platform team asks for (env from secrets, volumes and mounts, a sidecar,
affinity, tolerations, imagePullSecrets, a priority class, security contexts, labels and annotations). `REFUSED`
lists fragments that set what the operator owns, each with the field the refusal must name and words of the
reason. The unit tests feed `REFUSED` to the operator's own check (`validation.py`) and the cluster tests to a real
API server (`kubectl apply`, the CRD's CEL rules), so that both layers are held to the same table.
"""

from __future__ import annotations

import copy
import pathlib
import re
from dataclasses import dataclass
from typing import Any

import yaml

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "manifests" / "examples" / "tiny.yaml"

PRIORITY_CLASS = "trainingrun-test-training"
WORKER_SERVICE_ACCOUNT = "generation"

HEAD: dict[str, Any] = {
    "metadata": {"labels": {"team": "research"}, "annotations": {"example.com/owner": "research-infra"}},
    "spec": {
        "containers": [
            {
                "name": "ray-head",
                "env": [
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                    {"name": "LOG_LEVEL", "value": "debug"},
                ],
                "envFrom": [{"configMapRef": {"name": "settings"}}],
                "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            },
            {
                "name": "checkpoint-sync",
                "image": "busybox:1.36",
                "args": ["sh", "-c", "sleep infinity"],
                "volumeMounts": [{"name": "checkpoints", "mountPath": "/data", "readOnly": True}],
            },
        ],
        "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}
                    ]
                }
            }
        },
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}],
        "imagePullSecrets": [{"name": "registry"}],
        "priorityClassName": PRIORITY_CLASS,
        "securityContext": {"runAsUser": 1000, "fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
    },
}

WORKER: dict[str, Any] = {
    "metadata": {"labels": {"team": "research", "role": "generation"}},
    "spec": {
        "serviceAccountName": WORKER_SERVICE_ACCOUNT,
        "containers": [
            {
                "name": "ray-worker",
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}},
            }
        ],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "imagePullSecrets": [{"name": "registry"}],
    },
}


def with_templates(
    name: str = "tiny", head: dict[str, Any] | None = None, worker: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The tiny example named `name`, with a head template and, if given, one worker group with a template."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name}
    if head is not None:
        doc["spec"]["ray"]["head"]["template"] = copy.deepcopy(head)
    if worker is not None:
        doc["spec"]["ray"]["workers"] = [{"name": "gen", "replicas": 1, "template": copy.deepcopy(worker)}]
    return doc


@dataclass(frozen=True)
class Refused:
    """A fragment that sets what the operator owns: for the head or the worker group, the field the refusal must
    name (as the API server writes it) and words of the reason."""

    id: str
    group: str
    fragment: dict[str, Any]
    field: str
    says: str

    def run(self, name: str = "tiny") -> dict[str, Any]:
        return with_templates(name, **{self.group: self.fragment})

    @property
    def path(self) -> str:
        """The field as the operator's own check writes it (list indexes as path parts)."""
        return re.sub(r"\[(\d+)\]", r".\1", self.field)


def _ray(group: str, **container: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": f"ray-{group}", **container}]}}


_HEAD = "spec.ray.head.template"
_WORKER = "spec.ray.workers[0].template"
REFUSED = [
    Refused(
        "the head's ServiceAccount",
        "head",
        {"spec": {"serviceAccountName": "x"}},
        f"{_HEAD}.spec.serviceAccountName",
        "<run>-driver",
    ),
    Refused(
        "the head's token",
        "head",
        {"spec": {"automountServiceAccountToken": False}},
        f"{_HEAD}.spec.automountServiceAccountToken",
        "report",
    ),
    Refused(
        "a grace period",
        "worker",
        {"spec": {"terminationGracePeriodSeconds": 5}},
        f"{_WORKER}.spec.terminationGracePeriodSeconds",
        "spec.ray.workers[].terminationGracePeriodSeconds",
    ),
    Refused(
        "the attempt label",
        "head",
        {"metadata": {"labels": {"trainingrun.dev/attempt": "9"}}},
        f"{_HEAD}.metadata.labels",
        "trainingrun.dev/attempt",
    ),
    Refused(
        "the checkpoint volume",
        "head",
        {"spec": {"volumes": [{"name": "checkpoints", "emptyDir": {}}]}},
        f"{_HEAD}.spec.volumes[0].name",
        "spec.checkpoint.pvc",
    ),
    Refused(
        "the /dev/shm volume",
        "worker",
        {"spec": {"volumes": [{"name": "dev-shm", "emptyDir": {}}]}},
        f"{_WORKER}.spec.volumes[0].name",
        "shmSize",
    ),
    Refused("the image", "head", _ray("head", image="evil:latest"), f"{_HEAD}.spec.containers[0].image", "spec.image"),
    Refused(
        "the command",
        "worker",
        _ray("worker", command=["bash"]),
        f"{_WORKER}.spec.containers[0].command",
        "KubeRay starts Ray",
    ),
    Refused(
        "the resources",
        "head",
        _ray("head", resources={"limits": {"cpu": "1"}}),
        f"{_HEAD}.spec.containers[0].resources",
        "spec.ray.head.resources",
    ),
    Refused(
        "the preStop hook",
        "head",
        _ray("head", lifecycle={"preStop": {"exec": {"command": ["true"]}}}),
        f"{_HEAD}.spec.containers[0].lifecycle",
        "save a checkpoint",
    ),
    Refused(
        "the checkpoint mount",
        "head",
        {
            "spec": {
                "volumes": [{"name": "other", "emptyDir": {}}],
                "containers": [{"name": "ray-head", "volumeMounts": [{"name": "other", "mountPath": "/checkpoints"}]}],
            }
        },
        f"{_HEAD}.spec.containers[0].volumeMounts[0].mountPath",
        "checkpoint volume",
    ),
    Refused(
        "/dev/shm in a sidecar",
        "worker",
        {
            "spec": {
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
                "containers": [
                    {"name": "side", "image": "busybox", "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
                ],
            }
        },
        f"{_WORKER}.spec.containers[0].volumeMounts[0].mountPath",
        "shmSize",
    ),
    Refused(
        "the other group's container name",
        "head",
        {"spec": {"containers": [{"name": "ray-worker", "image": "busybox"}]}},
        f"{_HEAD}.spec.containers[0].name",
        "the head's is ray-head",
    ),
    Refused(
        "a Ray container by another name",
        "head",
        {"spec": {"containers": [{"name": "main", "env": [{"name": "A", "value": "1"}]}]}},
        f"{_HEAD}.spec.containers[0].image",
        "name the entry ray-head",
    ),
    # Escalations (`podtemplate.ESCALATIONS`): what would let a run's pod harm the node or another run. Added
    # capabilities and hostPath volumes are refused unless the admin allows them, by the chart's admission policy
    # and not the CRD: `NOT_ALLOWED` below.
    Refused(
        "a privileged Ray container",
        "worker",
        _ray("worker", securityContext={"privileged": True}),
        f"{_WORKER}.spec.containers[0].securityContext.privileged",
        "unprivileged",
    ),
    Refused(
        "an allowPrivilegeEscalation",
        "head",
        _ray("head", securityContext={"allowPrivilegeEscalation": True}),
        f"{_HEAD}.spec.containers[0].securityContext.allowPrivilegeEscalation",
        "gain privileges",
    ),
    Refused(
        "root in an init container",
        "worker",
        {"spec": {"initContainers": [{"name": "setup", "image": "busybox", "securityContext": {"runAsUser": 0}}]}},
        f"{_WORKER}.spec.initContainers[0].securityContext.runAsUser",
        "non-root",
    ),
    Refused("the node's PID namespace", "worker", {"spec": {"hostPID": True}}, f"{_WORKER}.spec.hostPID", "process"),
    Refused("the node's network", "head", {"spec": {"hostNetwork": True}}, f"{_HEAD}.spec.hostNetwork", "network"),
    Refused(
        "a projected token",
        "worker",
        {"spec": {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]}},
        f"{_WORKER}.spec.volumes[0].projected.sources[0].serviceAccountToken",
        "serviceAccountToken",
    ),
    Refused(
        "another run's driver account",
        "worker",
        {"spec": {"serviceAccountName": "victim-driver"}},
        f"{_WORKER}.spec.serviceAccountName",
        "driver ServiceAccount",
    ),
    Refused(
        "a mount under /checkpoints",
        "worker",
        {
            "spec": {
                "volumes": [{"name": "c", "emptyDir": {}}],
                "containers": [
                    {"name": "side", "image": "busybox", "volumeMounts": [{"name": "c", "mountPath": "/checkpoints/"}]}
                ],
            }
        },
        f"{_WORKER}.spec.containers[0].volumeMounts[0].mountPath",
        "/checkpoints",
    ),
]


def _volume(path: str) -> dict[str, Any]:
    return {"spec": {"volumes": [{"name": "devices", "hostPath": {"path": path}}]}}


NOT_ALLOWED = [
    # What the cluster admin's allow-list (the chart's podSecurity.allow, `allowance.ALLOWABLE`) refuses when empty:
    # refused by the operator (`validation.py`) and by the chart's ValidatingAdmissionPolicy, not by the CRD.
    Refused(
        "an added capability",
        "head",
        _ray("head", securityContext={"capabilities": {"add": ["IPC_LOCK"]}}),
        f"{_HEAD}.spec.containers[0].securityContext.capabilities.add",
        "IPC_LOCK is not in the cluster's allow-list (podSecurity.allow.capabilities",
    ),
    Refused(
        "a capability in a worker's init container",
        "worker",
        {"spec": {"initContainers": [{"name": "setup", "image": "b:1", "securityContext": {
            "capabilities": {"add": ["SYS_ADMIN"]}}}]}},
        f"{_WORKER}.spec.initContainers[0].securityContext.capabilities.add",
        "SYS_ADMIN is not in the cluster's allow-list",
    ),
    Refused(
        "a hostPath of /",
        "worker",
        _volume("/"),
        f"{_WORKER}.spec.volumes[0].hostPath.path",
        "/ is not at or under a path in the cluster's allow-list (podSecurity.allow.hostPaths",
    ),
    Refused(
        "a device hostPath",
        "head",
        _volume("/dev/infiniband"),
        f"{_HEAD}.spec.volumes[0].hostPath.path",
        "persistentVolumeClaim",
    ),
]  # fmt: skip
