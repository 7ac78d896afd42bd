"""The cluster admin's allow-list (the chart's podSecurity.allow): what the operator's own check lets through with
an allowance and refuses without one, the flags that carry it, the CRD without the two allowable rules, and the
chart's ValidatingAdmissionPolicy (the lists in its expressions) and binding that carry it to the API server (the
default render; tests/integration/test_operator_pod_security.py runs the policy on a real API server)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from support import templates
from trainingrun_operator.core import allowance, model, podtemplate, validation

REPO = pathlib.Path(__file__).resolve().parents[3]
RENDERED = REPO / "manifests" / "deploy" / "trainingrun-operator.yaml"
CRD = REPO / "manifests" / "crd" / "trainingrun.dev_trainingruns.yaml"
RDMA = allowance.parse(["IPC_LOCK"], ["/dev/infiniband"])
_CAPABILITIES = "spec.ray.workers.0.template.spec.containers.0.securityContext.capabilities.add"


def adding(*capabilities: str) -> dict[str, Any]:
    """The tiny example with a worker group whose Ray container adds `capabilities`."""
    context = {"capabilities": {"drop": ["ALL"], "add": list(capabilities)}}
    return templates.with_templates(
        worker={"spec": {"containers": [{"name": "ray-worker", "securityContext": context}]}}
    )


def mounting(path: str, group: str = "worker") -> dict[str, Any]:
    """The tiny example with a hostPath volume of `path` in the group's template (and the Ray container's mount)."""
    fragment = {
        "spec": {
            "volumes": [{"name": "devices", "hostPath": {"path": path, "type": "Directory"}}],
            "containers": [{"name": f"ray-{group}", "volumeMounts": [{"name": "devices", "mountPath": path}]}],
        }
    }
    return templates.with_templates(**{group: fragment})


# ----------------------------------------------------------------------------------- the operator's check


def test_an_allowance_of_ipc_lock_lets_it_through_but_still_refuses_sys_admin_naming_the_field() -> None:
    assert validation.run_problems(adding("IPC_LOCK"), RDMA) == []
    (problem,) = validation.run_problems(adding("IPC_LOCK", "SYS_ADMIN"), RDMA)
    assert problem.path == _CAPABILITIES
    assert problem.message == (
        "SYS_ADMIN is not in the cluster's allow-list (podSecurity.allow.capabilities in the chart's values): "
        "remove it, or ask your cluster admin to allow it"
    )
    spec = model.TrainingRunSpec.model_validate(adding("IPC_LOCK", "SYS_ADMIN")["spec"])
    assert validation.spec_problem(spec, RDMA) == f"{_CAPABILITIES}: {problem.message}", "the operator fails it so"
    assert validation.spec_problem(model.TrainingRunSpec.model_validate(adding("IPC_LOCK")["spec"]), RDMA) is None


def test_every_capability_the_allowance_lacks_is_named_once() -> None:
    found = validation.run_problems(adding("NET_ADMIN", "IPC_LOCK", "SYS_ADMIN"), RDMA)
    assert [(p.path, p.message.split()[0]) for p in found] == [
        (_CAPABILITIES, "NET_ADMIN"),
        (_CAPABILITIES, "SYS_ADMIN"),
    ]


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/dev/infiniband", True),
        ("/dev/infiniband/", True),
        ("/dev/infiniband/uverbs0", True),
        ("/", False),
        ("/dev", False),
        ("/dev/infinibandX", False),
        ("/dev/infiniband/../../etc", False),
        ("/etc/dev/infiniband", False),
    ],
)
def test_a_host_path_is_allowed_at_or_under_an_allowed_directory_component_by_component(
    path: str, allowed: bool
) -> None:
    found = validation.run_problems(mounting(path), RDMA)
    if allowed:
        assert found == []
        return
    (problem,) = found
    assert problem.path == "spec.ray.workers.0.template.spec.volumes.0.hostPath.path"
    assert problem.message.startswith(f"{path} is not at or under a path in the cluster's allow-list (podSecurity.")


@pytest.mark.parametrize("case", templates.NOT_ALLOWED, ids=[c.id for c in templates.NOT_ALLOWED])
def test_without_an_allowance_an_added_capability_and_a_host_path_are_refused_as_before(
    case: templates.Refused,
) -> None:
    (problem,) = validation.run_problems(case.run())
    assert (problem.path, case.says in problem.explained) == (case.path, True), problem
    spec = model.TrainingRunSpec.model_validate(case.run()["spec"])
    assert validation.spec_problem(spec) == f"{case.path}: {problem.message}"


def test_an_allowance_allows_nothing_else_the_crd_refuses() -> None:
    everything = allowance.parse(["IPC_LOCK", "SYS_ADMIN"], ["/dev", "/etc"])
    for case in templates.REFUSED:
        assert validation.run_problems(case.run(), everything) != [], case.id


@pytest.mark.parametrize(
    ("capabilities", "host_paths", "says"),
    [
        (["ALL"], [], "capability 'ALL'"),
        (["ipc_lock"], [], "capability 'ipc_lock'"),
        ([], ["/"], "host path '/'"),
        ([], ["dev/infiniband"], "host path 'dev/infiniband'"),
        ([], ["/dev/../etc"], "host path '/dev/../etc'"),
        ([], ["/dev//infiniband"], "host path '/dev//infiniband'"),
        ([], ["/dev/in finiband"], "host path '/dev/in finiband'"),
    ],
)
def test_an_allow_list_entry_that_cannot_be_one_is_refused_naming_it(
    capabilities: list[str], host_paths: list[str], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        allowance.parse(capabilities, host_paths)


# ------------------------------------------------------------------------------------------------ the CRD


def _template_rules(node: Any) -> list[dict[str, str]]:
    """Every x-kubernetes-validations rule under `node`."""
    if isinstance(node, list):
        return [r for item in node for r in _template_rules(item)]
    if not isinstance(node, dict):
        return []
    own = list(node.get("x-kubernetes-validations", []))
    return own + [r for key, value in node.items() if key != "x-kubernetes-validations" for r in _template_rules(value)]


def test_the_generated_crd_no_longer_carries_the_two_allowable_rules_while_the_others_remain() -> None:
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    ray = schema["properties"]["spec"]["properties"]["ray"]["properties"]
    for group, node in (("head", ray["head"]), ("worker", ray["workers"]["items"])):
        rules = _template_rules(node["properties"]["template"])
        texts = " ".join(r["rule"] for r in rules)
        assert "capabilities.add" not in texts and "hostPath" not in texts, group
        messages = {r["message"] for r in rules}
        escalations = {e.message for e in podtemplate.ESCALATIONS if group in e.groups}
        assert escalations <= messages, "every other escalation stays the CRD's"
        assert any("privileged: true is refused" in m for m in messages)


# ---------------------------------------------------------------------------------------------- the chart


def _rendered() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RENDERED.read_text()) if d]


def test_the_chart_ships_the_allow_list_policy_and_binding_and_gives_the_operator_the_same_lists() -> None:
    docs = _rendered()
    (policy,) = [
        d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and "pod-security" in d["metadata"]["name"]
    ]
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    assert "paramKind" not in policy["spec"] and "paramRef" not in binding["spec"], "the lists are in the policy"
    lists = {
        v["name"]: v["expression"] for v in policy["spec"]["variables"] if v["name"] in ("capabilities", "hostPaths")
    }
    assert lists == {
        "capabilities": "''.split(',').filter(c, c != '')",
        "hostPaths": "''.split(',').filter(p, p != '')",
    }, "empty by default: nothing allowed"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert [r["resources"] for r in policy["spec"]["matchConstraints"]["resourceRules"]] == [["trainingruns"]]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--allow-capabilities=" in args
    assert "--allow-host-paths=" in args


def test_the_policy_says_what_the_operator_says_and_checks_every_container_list() -> None:
    (policy,) = [
        d for d in _rendered() if d["kind"] == "ValidatingAdmissionPolicy" and "pod-security" in d["metadata"]["name"]
    ]
    text = " ".join(v["expression"] for v in policy["spec"]["variables"])
    for allowable in allowance.ALLOWABLE:
        said = allowable.message("VALUE").removeprefix("VALUE ")
        assert f'" {said}"' in text, f"the policy's words for {allowable.values} drifted from allowance.py"
        assert f"].{'.'.join(allowable.path)}: '" in text, "the field it names"
    assert str(list(podtemplate.CONTAINER_LISTS)) in text
    assert "oldObject == null || oldObject.spec != object.spec" in text, "a metadata-only update is not checked"
