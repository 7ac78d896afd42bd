"""The driver's per-run identity: a ServiceAccount, a Role and a RoleBinding. Pure builders.

The Role allows `get` and `patch` on `trainingruns/status` of this one TrainingRun (`resourceNames`), and
nothing else: a driver can report its checkpoints into its own run's `status.runtime` and cannot touch any
other run, secret or pod. All three are owned by the TrainingRun, so they go when it goes.
"""

from __future__ import annotations

from typing import Any

from trainingrun_operator import model, naming
from trainingrun_operator.rayjob import owner_reference

__all__ = ["build_role", "build_role_binding", "build_service_account"]


def _metadata(run: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "name": naming.identity_name(run),
        "namespace": namespace,
        "labels": {naming.LABEL_RUN: run, naming.LABEL_MANAGED_BY: naming.MANAGED_BY},
        "ownerReferences": [owner_reference(run, uid)],
    }


def build_service_account(run: str, namespace: str, uid: str) -> dict[str, Any]:
    """The ServiceAccount the RayJob's head pod (where the driver runs) uses."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(run, namespace, uid)}


def build_role(run: str, namespace: str, uid: str) -> dict[str, Any]:
    """get + patch on this run's status subresource only."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(run, namespace, uid),
        "rules": [
            {
                "apiGroups": [model.GROUP],
                "resources": [f"{model.PLURAL}/status"],
                "resourceNames": [run],
                "verbs": ["get", "patch"],
            }
        ],
    }


def build_role_binding(run: str, namespace: str, uid: str) -> dict[str, Any]:
    """Binds the Role to the ServiceAccount."""
    name = naming.identity_name(run)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(run, namespace, uid),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
