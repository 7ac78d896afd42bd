"""The driver's per-run identity: a ServiceAccount, a Role and a RoleBinding. Pure builders.

The Role allows `get` and `patch` on `trainingruns/status` of this one TrainingRun (`resourceNames`), and
nothing else: a driver can report its checkpoints into its own run's `status.runtime` and cannot touch any
other run, secret or pod. All three are owned by the TrainingRun, so they go when it goes.

The names are fixed, so a create may find an object there already (409). `refusal` says whether it may be
adopted: only if it is this run's own (an owner reference with the TrainingRun's uid) and, for the Role and the
RoleBinding, grants and binds exactly what the builders here write. Anything else (another run's object, one
that someone made by hand, a binding of the run's ServiceAccount to another Role) is refused, never patched:
a run never starts with an identity it did not make. The same rule serves an attempt's RayJob and the run's
NetworkPolicy (`netpolicy.py`; the reconciler sets the spec of the run's own back to what the operator writes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainingrun_operator.core import model, naming, observation
from trainingrun_operator.core.rayjob import owner_reference

__all__ = ["build_role", "build_role_binding", "build_service_account", "refusal"]


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


def refusal(existing: Mapping[str, Any], wanted: Mapping[str, Any], uid: str) -> str | None:
    """Why `existing`, found under the name of `wanted` (the object the operator would create), cannot be adopted
    by the TrainingRun whose uid is `uid`; None if it can. The message names the object, its owner and the fix."""
    meta = wanted["metadata"]
    kind, namespace, name = str(wanted["kind"]), str(meta["namespace"]), str(meta["name"])
    what = f"{kind} {namespace}/{name}"
    if not observation.owned_by_run(existing, uid):
        return (
            f"{what} exists and is {_owners(existing)}, not by this TrainingRun (uid {uid}); the operator does not "
            f"adopt it: delete it (kubectl delete {kind.lower()} -n {namespace} {name}) or give the run another name"
        )
    differs = _difference(existing, wanted)
    if differs is None:
        return None
    return (
        f"{what} is owned by this TrainingRun but {differs}; the operator does not adopt it: delete it "
        f"(kubectl delete {kind.lower()} -n {namespace} {name}) and the operator creates it anew"
    )


def _few(items: list[str], most: int = 3) -> str:
    """The first `most` of `items`, and how many more (a message stays short whatever the object holds)."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


def _owners(obj: Mapping[str, Any]) -> str:
    """`owned by <kind> <name> (uid <uid>), ...`, or `owned by nobody` (no owner references)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    named = [f"{ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')})" for ref in refs if isinstance(ref, Mapping)]
    return f"owned by {_few(named)}" if named else "owned by nobody (it has no owner references)"


def _rules(obj: Mapping[str, Any]) -> list[dict[str, list[str]]]:
    """A Role's rules with empty fields left out (the API server drops them)."""
    return [{k: list(v) for k, v in rule.items() if v} for rule in obj.get("rules") or [] if isinstance(rule, Mapping)]


def _ref(ref: Any) -> tuple[str, str, str, str]:
    """(apiGroup, kind, name, namespace) of a roleRef or subject; a missing apiGroup is the core group ("")."""
    ref = ref if isinstance(ref, Mapping) else {}
    group, kind, name, namespace = (str(ref.get(k) or "") for k in ("apiGroup", "kind", "name", "namespace"))
    return group, kind, name, namespace


def _grants(obj: Mapping[str, Any]) -> str:
    """`<verbs> on <resources> [named <names>]` for each of a Role's rules."""
    said = [
        f"{','.join(r.get('verbs', []))} on {','.join(r.get('resources', []) or r.get('nonResourceURLs', []))}"
        + (f" named {','.join(r['resourceNames'])}" if r.get("resourceNames") else "")
        for r in _rules(obj)
    ]
    return _few(said) or "nothing"


def _binding(obj: Mapping[str, Any]) -> str:
    role = _ref(obj.get("roleRef"))
    subjects = [f"{s[1]} {s[3]}/{s[2]}" for s in map(_ref, obj.get("subjects") or [])]
    return f"{role[1]} {role[2]} to {_few(subjects) or 'no subject'}"


def _difference(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
    """How `existing` grants or binds otherwise than `wanted` (a Role's rules, a RoleBinding's roleRef and
    subjects); None when it does not, or is of a kind whose content the operator does not own."""
    if wanted["kind"] == "Role" and _rules(existing) != _rules(wanted):
        return f"it grants {_grants(existing)}, not {_grants(wanted)}"
    if wanted["kind"] == "RoleBinding" and (
        _ref(existing.get("roleRef")) != _ref(wanted.get("roleRef"))
        or sorted(map(_ref, existing.get("subjects") or [])) != sorted(map(_ref, wanted.get("subjects") or []))
    ):
        return f"it binds {_binding(existing)}, not {_binding(wanted)}"
    return None
