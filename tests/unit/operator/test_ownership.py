"""What is a run's, by owner references rather than by its label: which pods and RayJobs a pass takes for the
run's (`observation.of_run`, `observation.run_rayjobs`), and which object found under one of the run's names it
may adopt (`identity.refusal`). A reconcile pass with these rules is tested in test_reconciler.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainingrun_operator.core import identity, observation

OWNER = {"apiVersion": "trainingrun.dev/v1alpha1", "kind": "TrainingRun", "name": "tiny", "uid": "u-1"}


def job(name: str = "tiny-a1", owners: list[dict[str, Any]] | None = None, cluster: str = "tiny-a1-x7k2p") -> Any:
    meta = {"name": name, "uid": f"uid-{name}", "ownerReferences": [OWNER] if owners is None else owners}
    return {"metadata": meta, "status": {"rayClusterName": cluster} if cluster else {}}


def owner(kind: str = "RayCluster", name: str = "tiny-a1-x7k2p", uid: str = "c-1", api: str = "ray.io/v1") -> Any:
    return observation.Owner(api_version=api, kind=kind, name=name, uid=uid)


# ------------------------------------------------------------------------------------------- RayJobs


@pytest.mark.parametrize(
    ("owners", "owned"),
    [
        ([OWNER], True),
        ([{**OWNER, "controller": True}], True),
        ([], False),
        ([{**OWNER, "uid": "u-other"}], False),
        ([{**OWNER, "kind": "Deployment"}], False),
        ([{**OWNER, "apiVersion": "example.com/v1"}], False),
    ],
)
def test_a_rayjob_is_the_run_s_only_if_an_owner_reference_names_the_run_s_uid(
    owners: list[dict[str, Any]], owned: bool
) -> None:
    assert bool(observation.run_rayjobs([job(owners=owners)], "u-1")) is owned


def test_no_rayjob_is_the_run_s_when_the_run_s_uid_is_unknown() -> None:
    assert observation.run_rayjobs([job(owners=[{**OWNER, "uid": ""}])], "") == []


# ---------------------------------------------------------------------------------------------- pods


def test_a_pod_is_the_attempt_s_when_its_controller_is_the_raycluster_its_rayjob_names() -> None:
    jobs = {"tiny-a1": job()}
    assert observation.of_run(owner(), "tiny", "1", jobs)
    assert not observation.of_run(owner(name="tiny-a1-other"), "tiny", "1", jobs), "another cluster of that name"
    assert not observation.of_run(owner(), "tiny", "2", jobs), "its attempt label and its cluster disagree"
    assert not observation.of_run(owner(), "victim", "1", {"victim-a1": job("victim-a1", cluster="victim-a1-q9w8e")})


def test_a_pod_owned_by_the_rayjob_itself_counts_by_that_rayjob_s_uid() -> None:
    jobs = {"tiny-a1": job()}
    assert observation.of_run(owner("RayJob", "tiny-a1", "uid-tiny-a1"), "tiny", "1", jobs)
    assert not observation.of_run(owner("RayJob", "tiny-a1", "uid-forged"), "tiny", "1", jobs)


@pytest.mark.parametrize(
    "forged",
    [None, owner(api="ray.io/v9"), owner(kind="ReplicaSet"), owner(kind="Job", name="tiny-a1")],
)
def test_a_pod_with_no_controller_or_another_kind_of_controller_is_not_the_run_s(forged: Any) -> None:
    assert not observation.of_run(forged, "tiny", "1", {"tiny-a1": job()})
    assert not observation.of_run(forged, "tiny", "1", {}), "nor once the RayJob is gone"


def test_a_pod_of_a_rayjob_that_names_no_cluster_yet_is_not_the_run_s() -> None:
    assert not observation.of_run(owner(), "tiny", "1", {"tiny-a1": job(cluster="")})


def test_once_the_attempt_s_rayjob_is_gone_its_cluster_s_pods_are_known_by_kuberay_s_cluster_name() -> None:
    assert observation.of_run(owner(name="tiny-a1-x7k2p"), "tiny", "1", {})
    assert observation.of_run(owner("RayJob", "tiny-a1"), "tiny", "1", {})
    assert not observation.of_run(owner(name="tiny-a12-x7k2p"), "tiny", "1", {}), "attempt 12's, not 1's"
    assert not observation.of_run(owner(name="tiny-a1-x7k2p"), "tiny", "", {}), "no attempt label"


def test_a_pod_observation_keeps_the_pod_s_controller() -> None:
    ref = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "tiny-a1-x7k2p", "uid": "c-1", "controller": True}
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "c-2"}
    pod = {"metadata": {"name": "p", "ownerReferences": [other, ref]}, "spec": {}, "status": {}}
    assert observation.pod_observation(pod, None).owner == owner()
    assert observation.pod_observation({"metadata": {"name": "p"}}, None).owner is None


# ---------------------------------------------------------------------------- adopting what a 409 found


def built(kind: str) -> dict[str, Any]:
    builders = {
        "ServiceAccount": identity.build_service_account,
        "Role": identity.build_role,
        "RoleBinding": identity.build_role_binding,
    }
    return builders[kind]("tiny", "ns", "u-1")


@pytest.mark.parametrize("kind", ["ServiceAccount", "Role", "RoleBinding"])
def test_an_identity_object_the_operator_wrote_for_this_run_is_adopted(kind: str) -> None:
    assert identity.refusal(built(kind), built(kind), "u-1") is None


@pytest.mark.parametrize("kind", ["ServiceAccount", "Role", "RoleBinding"])
def test_an_identity_object_of_an_earlier_run_of_the_same_name_is_refused_naming_its_owner_and_the_fix(
    kind: str,
) -> None:
    found = identity.build_service_account("tiny", "ns", "u-old") if kind == "ServiceAccount" else built(kind)
    found["metadata"]["ownerReferences"][0]["uid"] = "u-old"
    said = identity.refusal(found, built(kind), "u-1")
    assert said == (
        f"{kind} ns/tiny-driver exists and is owned by TrainingRun tiny (uid u-old), not by this TrainingRun "
        f"(uid u-1); the operator does not adopt it: delete it (kubectl delete {kind.lower()} -n ns tiny-driver) "
        "or give the run another name"
    )


def test_an_object_made_by_hand_under_the_run_s_name_is_owned_by_nobody() -> None:
    found = built("ServiceAccount")
    del found["metadata"]["ownerReferences"]
    assert "is owned by nobody (it has no owner references)" in (identity.refusal(found, found, "u-1") or "")


def test_a_rolebinding_as_the_api_server_returns_it_is_the_one_the_operator_wrote() -> None:
    """The API server writes the core group of a ServiceAccount subject as an absent apiGroup, or an empty one."""
    found = copy.deepcopy(built("RoleBinding"))
    found["subjects"][0]["apiGroup"] = ""
    found["metadata"]["resourceVersion"] = "7"
    assert identity.refusal(found, built("RoleBinding"), "u-1") is None


def test_a_rolebinding_this_run_owns_that_binds_its_service_account_to_another_role_is_refused() -> None:
    found = built("RoleBinding")
    found["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"}
    said = identity.refusal(found, built("RoleBinding"), "u-1") or ""
    assert said.startswith("RoleBinding ns/tiny-driver is owned by this TrainingRun but it binds ClusterRole admin")
    assert "not Role tiny-driver to ServiceAccount ns/tiny-driver" in said and "creates it anew" in said


def test_a_role_this_run_owns_that_grants_more_is_refused() -> None:
    found = built("Role")
    found["rules"][0]["verbs"] = ["get", "patch", "delete"]
    said = identity.refusal(found, built("Role"), "u-1") or ""
    assert "but it grants get,patch,delete on trainingruns/status named tiny, not get,patch on" in said


def test_a_refusal_stays_short_however_many_owners_or_subjects_the_object_holds() -> None:
    found = built("RoleBinding")
    found["subjects"] = [{"kind": "ServiceAccount", "name": f"sa-{n}", "namespace": "ns"} for n in range(500)]
    said = identity.refusal(found, built("RoleBinding"), "u-1") or ""
    assert "ServiceAccount ns/sa-2 and 497 more" in said and len(said) < 400
    found = built("ServiceAccount")
    found["metadata"]["ownerReferences"] = [{**OWNER, "uid": f"u-{n}"} for n in range(500)]
    assert len(identity.refusal(found, built("ServiceAccount"), "u-1") or "") < 400
