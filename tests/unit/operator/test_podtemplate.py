"""A group's pod template: the user's fragment merged into the operator's, and what a fragment may not set,
refused naming the field, by the operator's own check with the same words as the CRD's CEL rules."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from support import templates
from trainingrun_operator.core import model, podtemplate, rayjob, validation

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples"
LABELS = {"trainingrun.dev/run": "r", "trainingrun.dev/attempt": "2", "app.kubernetes.io/managed-by": "x"}


def ours(group: podtemplate.Group = "head", shm_size: int | str | None = None) -> dict[str, Any]:
    return podtemplate.base(group, "img:1", "IfNotPresent", LABELS, {"limits": {"cpu": "4"}}, "claim", shm_size)


def containers(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in template["spec"]["containers"]}


# ------------------------------------------------------------------------------------------------ merge


def test_the_ray_container_gets_the_fragments_env_mounts_and_security_context_and_keeps_the_operators() -> None:
    pod = podtemplate.merged(ours(), templates.HEAD)
    ray = pod["spec"]["containers"][0]
    assert ray["name"] == "ray-head", "KubeRay runs Ray in containers[0]"
    assert (ray["image"], ray["imagePullPolicy"], ray["resources"]) == (
        "img:1",
        "IfNotPresent",
        {"limits": {"cpu": "4"}},
    )
    assert ray["env"][:2] == [
        {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "0"},  # ours first: a later entry of theirs wins
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ]
    assert ray["envFrom"] == [{"configMapRef": {"name": "settings"}}]
    assert ray["volumeMounts"] == [
        {"name": "checkpoints", "mountPath": "/checkpoints"},
        {"name": "dev-shm", "mountPath": "/dev/shm"},
        {"name": "cache", "mountPath": "/cache"},
    ]
    assert ray["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def test_other_containers_of_the_fragment_are_sidecars_after_the_ray_container() -> None:
    pod = podtemplate.merged(ours(), templates.HEAD)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["ray-head", "checkpoint-sync"]
    assert containers(pod)["checkpoint-sync"]["volumeMounts"] == [
        {"name": "checkpoints", "mountPath": "/data", "readOnly": True}
    ]


def test_volumes_are_the_operators_then_the_fragments() -> None:
    pod = podtemplate.merged(ours(), templates.HEAD)
    assert pod["spec"]["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "claim"}},
        {"name": "dev-shm", "emptyDir": {"medium": "Memory"}},
        {"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}},
    ]


def test_labels_and_annotations_are_added_beside_the_run_and_attempt_labels() -> None:
    pod = podtemplate.merged(ours(), templates.HEAD)
    assert pod["metadata"] == {
        "labels": {**LABELS, "team": "research"},
        "annotations": {"example.com/owner": "research-infra"},
    }


def test_scheduling_and_security_fields_of_the_fragment_reach_the_pod() -> None:
    spec = podtemplate.merged(ours(), templates.HEAD)["spec"]
    given = templates.HEAD["spec"]
    for field in ("affinity", "tolerations", "imagePullSecrets", "priorityClassName"):
        assert spec[field] == given[field], field
    assert spec["securityContext"] == {**given["securityContext"], "runAsNonRoot": True}, "over the restricted one"


def test_a_list_or_map_both_give_keeps_the_operators_items_first() -> None:
    base = ours()
    base["spec"]["tolerations"] = [{"key": "spot", "operator": "Exists"}]
    base["spec"]["nodeSelector"] = {"pool": "a"}
    fragment = {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeSelector": {"disk": "ssd"}}}
    spec = podtemplate.merged(base, fragment)["spec"]
    assert spec["tolerations"] == [{"key": "spot", "operator": "Exists"}, {"key": "gpu", "operator": "Exists"}]
    assert spec["nodeSelector"] == {"pool": "a", "disk": "ssd"}


def test_merging_changes_neither_the_fragment_nor_the_operators_template() -> None:
    base, fragment = ours(), copy.deepcopy(templates.HEAD)
    before = (copy.deepcopy(base), copy.deepcopy(fragment))
    pod = podtemplate.merged(base, fragment)
    pod["spec"]["containers"][0]["env"].append({"name": "X", "value": "1"})
    pod["spec"]["volumes"].clear()
    assert (base, fragment) == before


def test_no_fragment_leaves_the_operators_template_with_the_restricted_security_contexts() -> None:
    restricted = copy.deepcopy(ours())
    restricted["spec"]["securityContext"] = dict(podtemplate.RESTRICTED_POD)
    restricted["spec"]["containers"][0]["securityContext"] = dict(podtemplate.RESTRICTED_CONTAINER)
    assert podtemplate.merged(ours(), None) == restricted == podtemplate.merged(ours(), {})


# ------------------------------------------------------------------------------------- restricted by default


def _restricted_profile_problems(pod: dict[str, Any]) -> list[str]:
    """What Pod Security Admission's `restricted` profile (its securityContext checks) refuses in a pod spec: each
    container and init container must, itself or through the pod, run as non-root with a RuntimeDefault or
    Localhost seccomp profile, not as UID 0; and itself disallow privilege escalation, drop ALL and add nothing
    but NET_BIND_SERVICE."""
    found = []
    pod_context = pod.get("securityContext") or {}
    for kind in ("containers", "initContainers"):
        for c in pod.get(kind) or []:
            context = c.get("securityContext") or {}
            effective = {**pod_context, **context}
            capabilities = context.get("capabilities") or {}
            checks = {
                "runAsNonRoot": effective.get("runAsNonRoot") is True,
                "runAsUser": effective.get("runAsUser") != 0,
                "seccompProfile": (effective.get("seccompProfile") or {}).get("type")
                in ("RuntimeDefault", "Localhost"),
                "allowPrivilegeEscalation": context.get("allowPrivilegeEscalation") is False,
                "capabilities.drop": "ALL" in (capabilities.get("drop") or []),
                "capabilities.add": set(capabilities.get("add") or []) <= {"NET_BIND_SERVICE"},
                "privileged": context.get("privileged") is not True,
            }
            found += [f"{kind}/{c['name']}: {name}" for name, ok in checks.items() if not ok]
    return found


def _built(head: dict[str, Any] | None = None, worker: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The pod specs of the head and of the worker group (one, with a wait-gcs-ready init container as KubeRay
    adds it: the Ray container's security context copied) of the RayJob the operator builds."""
    doc = templates.with_templates(head=head, worker=worker if worker is not None else {})
    body = rayjob.build_rayjob("tiny", "ns", "u", 1, None, model.TrainingRunSpec.model_validate(doc["spec"]))
    cluster = body["spec"]["rayClusterSpec"]
    head_pod, worker_pod = (t["spec"] for t in (cluster["headGroupSpec"]["template"], *(
        g["template"] for g in cluster["workerGroupSpecs"])))  # fmt: skip
    wait = {"name": "wait-gcs-ready", "securityContext": copy.deepcopy(worker_pod["containers"][0]["securityContext"])}
    worker_pod["initContainers"] = [wait, *worker_pod.get("initContainers", [])]
    return [head_pod, worker_pod]


def test_every_ray_pod_passes_the_restricted_profile_without_a_fragment() -> None:
    pods = _built()
    assert [_restricted_profile_problems(pod) for pod in pods] == [[], []]
    for pod in pods:
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": podtemplate.RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert pod["containers"][0]["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }


def test_sidecars_and_init_containers_of_a_fragment_are_restricted_too() -> None:
    init = {"spec": {"initContainers": [{"name": "fetch", "image": "busybox:1.36"}]}}
    head, worker = _built(head=templates.HEAD, worker={**templates.WORKER, **init})
    assert _restricted_profile_problems(head) == _restricted_profile_problems(worker) == []
    assert [c["name"] for c in worker["initContainers"]] == ["wait-gcs-ready", "fetch"]


def test_a_fragment_may_add_to_the_restricted_contexts_but_never_undo_them() -> None:
    fragment = {
        "spec": {
            "securityContext": {"runAsUser": 2000, "fsGroup": 2000, "seccompProfile": {"type": "Localhost",
                                "localhostProfile": "ray.json"}},
            "containers": [{"name": "ray-worker", "securityContext": {"capabilities": {"drop": ["ALL", "NET_RAW"]},
                            "readOnlyRootFilesystem": True}}],
        }
    }  # fmt: skip
    assert validation.run_problems(templates.with_templates(worker=fragment)) == []
    _, worker = _built(worker=fragment)
    assert worker["securityContext"] == {
        "runAsUser": 2000,
        "fsGroup": 2000,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "ray.json"},
        "runAsNonRoot": True,
    }
    assert worker["containers"][0]["securityContext"] == {
        "capabilities": {"drop": ["ALL", "NET_RAW"]},
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
    }
    assert _restricted_profile_problems(worker) == []


def test_every_ray_pod_gets_a_memory_backed_dev_shm_sized_by_shm_size() -> None:
    for group in ("head", "worker"):
        pod = ours(group, "8Gi")
        assert {"name": "dev-shm", "mountPath": "/dev/shm"} in pod["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "dev-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["spec"]["volumes"]
    assert {"name": "dev-shm", "emptyDir": {"medium": "Memory"}} in ours()["spec"]["volumes"], "unset: no sizeLimit"


# ----------------------------------------------------------------------------------------------- refuse


@pytest.mark.parametrize("case", templates.REFUSED, ids=[c.id for c in templates.REFUSED])
def test_a_fragment_that_sets_an_owned_field_is_refused_naming_the_field(case: templates.Refused) -> None:
    (problem,) = validation.run_problems(case.run())
    assert problem.path == case.path
    assert case.says in problem.explained
    spec = model.TrainingRunSpec.model_validate(case.run()["spec"])
    assert validation.spec_problem(spec) == f"{case.path}: {problem.message}", "the operator fails the run so"


def test_the_fragments_a_platform_team_writes_have_no_problem() -> None:
    assert validation.run_problems(templates.with_templates(head=templates.HEAD, worker=templates.WORKER)) == []


def test_a_worker_group_may_set_its_service_account_and_its_ray_containers_lifecycle() -> None:
    fragment = {
        "spec": {
            "serviceAccountName": "gen",
            "containers": [{"name": "ray-worker", "lifecycle": {"preStop": {"exec": {"command": ["true"]}}}}],
        }
    }
    assert podtemplate.problems(fragment, "worker") == []
    assert {r.loc for r in podtemplate.problems(fragment, "head")} == {
        ("spec", "serviceAccountName"),
        ("spec", "containers", 0, "name"),
        ("spec", "containers", 0, "image"),
    }


def test_every_refusal_is_listed_at_once_in_the_fragments_order() -> None:
    fragment = {
        "metadata": {"labels": {"trainingrun.dev/run": "x"}},
        "spec": {
            "serviceAccountName": "x",
            "volumes": [{"name": "checkpoints"}],
            "containers": [{"name": "ray-head", "image": "x", "command": ["x"]}],
        },
    }
    assert [r.loc for r in podtemplate.problems(fragment, "head")] == [
        ("metadata", "labels"),
        ("spec", "serviceAccountName"),
        ("spec", "volumes", 0, "name"),
        ("spec", "containers", 0, "image"),
        ("spec", "containers", 0, "command"),
    ]


def test_a_node_selector_key_the_group_gives_another_value_is_refused() -> None:
    doc = templates.with_templates(head={"spec": {"nodeSelector": {"pool": "b", "disk": "ssd"}}})
    doc["spec"]["ray"]["head"]["nodeSelector"] = {"pool": "a"}
    (problem,) = validation.run_problems(doc)
    assert problem.path == "spec.ray.head.template.spec.nodeSelector"
    assert "pool is 'a' in the group's nodeSelector and 'b' here" in problem.explained
    doc["spec"]["ray"]["head"]["nodeSelector"] = {"pool": "b"}
    assert validation.run_problems(doc) == [], "the same value twice is no conflict"


def test_a_mount_of_a_volume_no_one_defines_is_refused_before_kuberay_meets_it() -> None:
    fragment = _mounting("cahce", volumes=["cache"])
    (problem,) = validation.run_problems(templates.with_templates(worker=fragment))
    assert problem.path == "spec.ray.workers.0.template.spec.containers.0.volumeMounts.0.name"
    assert "no volume is named 'cahce'" in problem.explained
    for name in ("cache", "checkpoints", "dev-shm"):
        assert validation.run_problems(templates.with_templates(worker=_mounting(name, volumes=["cache"]))) == []


def _mounting(name: str, volumes: list[str]) -> dict[str, Any]:
    return {
        "spec": {
            "volumes": [{"name": v, "emptyDir": {}} for v in volumes],
            "containers": [{"name": "ray-worker", "volumeMounts": [{"name": name, "mountPath": "/mnt/x"}]}],
        }
    }


# ----------------------------------------------------------------------------------------- escalations

_H, _W = "spec.ray.head.template.spec", "spec.ray.workers.0.template.spec"
_CACHE = [{"name": "cache", "emptyDir": {}}]


def _in(kind: str, name: str, **fields: Any) -> dict[str, Any]:
    """A fragment with one container `name` in the list `kind` (an image unless it is a Ray container)."""
    image = {} if name.startswith("ray-") else {"image": "busybox:1.36"}
    return {"spec": {"volumes": _CACHE, kind: [{"name": name, **image, **fields}]}}


def _context(**fields: Any) -> dict[str, Any]:
    return {"securityContext": fields}


def _mount(path: str) -> dict[str, Any]:
    return {"volumeMounts": [{"name": "cache", "mountPath": path}]}


ESCALATING = [  # (id, group, fragment, the field the refusal names, words of it)
    ("privileged Ray container", "head", _in("containers", "ray-head", **_context(privileged=True)),
     f"{_H}.containers.0.securityContext.privileged", "privileged: true is refused"),
    ("privileged sidecar", "worker", _in("containers", "sync", **_context(privileged=True)),
     f"{_W}.containers.0.securityContext.privileged", "unprivileged"),
    ("privilege escalation in an init container", "worker",
     _in("initContainers", "setup", **_context(allowPrivilegeEscalation=True)),
     f"{_W}.initContainers.0.securityContext.allowPrivilegeEscalation", "gain privileges"),
    # Without an allowance (`allowance.NONE`, the chart's default): an added capability and a hostPath, as before.
    ("an added capability", "worker", _in("containers", "ray-worker", **_context(capabilities={"add": ["IPC_LOCK"]})),
     f"{_W}.containers.0.securityContext.capabilities.add", "IPC_LOCK is not in the cluster's allow-list"),
    ("a capability in an ephemeral container", "head",
     _in("ephemeralContainers", "debug", **_context(capabilities={"add": ["SYS_ADMIN"]})),
     f"{_H}.ephemeralContainers.0.securityContext.capabilities.add", "remove it, or ask your cluster admin"),
    ("the node's PID namespace", "worker", {"spec": {"hostPID": True}}, f"{_W}.hostPID", "process namespace"),
    ("the node's network", "head", {"spec": {"hostNetwork": True}}, f"{_H}.hostNetwork", "network namespace"),
    ("the node's IPC namespace", "worker", {"spec": {"hostIPC": True}}, f"{_W}.hostIPC", "IPC namespace"),
    ("a hostPath of /", "worker", {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}},
     f"{_W}.volumes.0.hostPath.path", "/ is not at or under a path in the cluster's allow-list"),
    ("a projected ServiceAccount token", "worker",
     {"spec": {"volumes": [{"name": "t", "projected": {"sources": [
         {"configMap": {"name": "c"}}, {"serviceAccountToken": {"path": "token"}}]}}]}},
     f"{_W}.volumes.0.projected.sources.1.serviceAccountToken", "no API token"),
    ("root for the pod", "worker", {"spec": {"securityContext": {"runAsUser": 0}}},
     f"{_W}.securityContext.runAsUser", "0 (root) is refused"),
    ("root for a container", "head", _in("initContainers", "setup", **_context(runAsUser=0)),
     f"{_H}.initContainers.0.securityContext.runAsUser", "non-root"),
    ("root allowed for the pod", "head", {"spec": {"securityContext": {"runAsNonRoot": False}}},
     f"{_H}.securityContext.runAsNonRoot", "false is refused"),
    ("an unconfined pod", "worker", {"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}},
     f"{_W}.securityContext.seccompProfile.type", "Unconfined is refused"),
    ("an unconfined container", "head", _in("containers", "sync", **_context(seccompProfile={"type": "Unconfined"})),
     f"{_H}.containers.0.securityContext.seccompProfile.type", "RuntimeDefault"),
    ("another run's driver ServiceAccount", "worker", {"spec": {"serviceAccountName": "other-run-driver"}},
     f"{_W}.serviceAccountName", "patches that run's status"),
    ("the same by its old name", "worker", {"spec": {"serviceAccount": "tiny-driver"}},
     f"{_W}.serviceAccount", "*-driver is refused"),
    ("a mount at /checkpoints/", "worker", _in("containers", "sync", **_mount("/checkpoints/")),
     f"{_W}.containers.0.volumeMounts.0.mountPath", "/checkpoints and every path under it"),
    ("a mount under /checkpoints", "head", _in("containers", "ray-head", **_mount("/checkpoints/other-run")),
     f"{_H}.containers.0.volumeMounts.0.mountPath", "the operator's"),
    ("a mount at /checkpoints in an init container", "worker", _in("initContainers", "setup", **_mount("/checkpoints")),
     f"{_W}.initContainers.0.volumeMounts.0.mountPath", "checkpoint volume"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("group", "fragment", "path", "says"), [c[1:] for c in ESCALATING], ids=[c[0] for c in ESCALATING]
)
def test_a_fragment_that_escalates_is_refused_naming_the_field(
    group: str, fragment: dict[str, Any], path: str, says: str
) -> None:
    doc = templates.with_templates(**{group: fragment})
    (problem,) = validation.run_problems(doc)
    assert (problem.path, says in problem.explained) == (path, True), problem.explained
    spec = model.TrainingRunSpec.model_validate(doc["spec"])
    assert validation.spec_problem(spec) == f"{path}: {problem.message}", "the operator fails the run so"


NOT_ESCALATING = [
    ("unprivileged and dropping ALL", _in("containers", "ray-worker", **_context(
        privileged=False, allowPrivilegeEscalation=False, capabilities={"drop": ["ALL"], "add": []}, runAsUser=1000,
        runAsNonRoot=True))),
    ("no host namespaces, said", {"spec": {"hostPID": False, "hostNetwork": False, "hostIPC": False}}),
    ("a pod UID and group", {"spec": {"securityContext": {"runAsUser": 1000, "runAsGroup": 0, "fsGroup": 1000}}}),
    ("a projected ConfigMap", {"spec": {"volumes": [{"name": "p", "projected": {"sources": [
        {"configMap": {"name": "c"}}]}}]}}),
    ("a ServiceAccount that only has driver in its name", {"spec": {"serviceAccountName": "driver"}}),
    ("a mount beside /checkpoints", _in("containers", "ray-worker", **_mount("/checkpointsx"))),
    ("the checkpoints volume elsewhere in a sidecar", {"spec": {"containers": [{"name": "sync", "image": "b:1",
        "volumeMounts": [{"name": "checkpoints", "mountPath": "/data", "readOnly": True}]}]}}),
]  # fmt: skip


@pytest.mark.parametrize("fragment", [c[1] for c in NOT_ESCALATING], ids=[c[0] for c in NOT_ESCALATING])
def test_a_fragment_that_asks_for_nothing_more_than_an_unprivileged_pod_is_accepted(fragment: dict[str, Any]) -> None:
    assert validation.run_problems(templates.with_templates(worker=fragment)) == []


def test_the_shipped_examples_pass_and_the_head_still_runs_as_its_own_driver() -> None:
    for example in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(example.read_text()):
            if doc and doc.get("kind") == "TrainingRun":
                assert validation.run_problems(doc) == [], example.name
    doc = templates.with_templates(head=templates.HEAD, worker=templates.WORKER)
    body = rayjob.build_rayjob("tiny", "ns", "u", 1, None, model.TrainingRunSpec.model_validate(doc["spec"]))
    head = body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "tiny-driver", "the operator's own -driver account is not the user's"


# ------------------------------------------------------------------------------------- the CRD's CEL rules


@pytest.mark.parametrize("group", ["head", "worker"])
def test_each_rule_becomes_one_cel_rule_with_the_same_message_and_the_field_it_names(group: podtemplate.Group) -> None:
    rules = podtemplate.cel_rules(group)
    mine = [r for r in podtemplate.RULES if group in r.groups]
    mine_too = [e for e in podtemplate.ESCALATIONS if group in e.groups]
    assert sum(len(v) for v in rules.values()) == len(mine) + len(mine_too)
    refused_words = {r.message for r in podtemplate.problems(_breaking_every_rule(group), group)}
    assert {c["message"] for v in rules.values() for c in v} == refused_words
    assert all(c["fieldPath"].startswith(".") for v in rules.values() for c in v)


def test_no_cel_rule_walks_a_list_so_the_api_servers_cost_estimate_accepts_it() -> None:
    groups: tuple[podtemplate.Group, ...] = ("head", "worker")
    texts = [c["rule"] for g in groups for v in podtemplate.cel_rules(g).values() for c in v]
    assert not [t for t in texts if ".all(" in t or ".exists(" in t or ".map(" in t]


def _breaking_every_rule(group: podtemplate.Group) -> dict[str, Any]:
    """A fragment that breaks every rule and every escalation of `group` once."""
    ray, other = ("ray-head", "ray-worker") if group == "head" else ("ray-worker", "ray-head")
    rules = [r for r in podtemplate.RULES if group in r.groups]
    ray_keys = {r.name: "x" for r in rules if r.node == "ray-container"}
    mounts = [{"name": "v", "mountPath": r.name} for r in rules if r.node == "mount"]
    nodes: dict[str, dict[str, Any]] = {"pod": {}, "container": {}, "volume": {}, "projection": {}}
    bad = {"true": True, "false": False, "zero": 0, "set": {}, "driver": "other-driver"}
    bad["unconfined"] = "Unconfined"
    for escalation in (e for e in podtemplate.ESCALATIONS if group in e.groups):
        node = nodes[escalation.node]
        for key in escalation.path[:-1]:
            node = node.setdefault(key, {})
        node[escalation.path[-1]] = bad[escalation.check]
    return {
        "metadata": {"labels": {r.name: "x" for r in rules if r.node == "labels"}},
        "spec": {
            **{r.name: "x" for r in rules if r.node == "pod"},
            **nodes["pod"],
            "volumes": [
                *({"name": r.name} for r in rules if r.node == "volume"),
                {"name": "p", **nodes["volume"], "projected": {"sources": [nodes["projection"]]}},
            ],
            "containers": [{"name": ray, **ray_keys, **nodes["container"], "volumeMounts": mounts}, {"name": other}],
        },
    }


def test_the_rayjob_builder_merges_each_groups_template() -> None:
    doc = templates.with_templates(head=templates.HEAD, worker=templates.WORKER)
    body = rayjob.build_rayjob("tiny", "ns", "u", 1, None, model.TrainingRunSpec.model_validate(doc["spec"]))
    cluster = body["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]
    (worker,) = [g["template"] for g in cluster["workerGroupSpecs"]]
    assert head["spec"]["serviceAccountName"] == "tiny-driver"
    assert head["spec"]["priorityClassName"] == templates.PRIORITY_CLASS
    assert containers(head)["ray-head"]["lifecycle"]["preStop"]["exec"]["command"][2] == (
        "trainingrun_runtime.sdk.notice"
    )
    assert worker["spec"]["serviceAccountName"] == templates.WORKER_SERVICE_ACCOUNT
    assert worker["spec"]["automountServiceAccountToken"] is False
    assert containers(worker)["ray-worker"]["lifecycle"] == templates.WORKER["spec"]["containers"][0]["lifecycle"]
    assert worker["metadata"]["labels"]["role"] == "generation"
    assert worker["metadata"]["labels"]["trainingrun.dev/attempt"] == "1"
