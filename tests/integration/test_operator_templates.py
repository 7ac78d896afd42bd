"""Pod templates (spec.ray.head.template, spec.ray.workers[].template) on a real API server.

A TrainingRun with templates is admitted as written (nothing pruned); the RayJob the operator builds carries them
and passes a strict server-side validation against KubeRay's installed RayJob CRD; the pods made from its
templates (by the KubeRay test double) pass the API server's own Pod validation and admission. A template that
sets what the operator owns, or has a typo, is rejected by `kubectl apply` naming the field: the CRD's CEL rules
and KubeRay's PodTemplateSpec schema, generated into our CRD by operator/sync_manifests.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from support import templates
from support.operator_double import Cluster, InProcessOperator, KubeRayDouble, eventually
from trainingrun_operator.core import model, rayjob

pytestmark = pytest.mark.cluster


def apply(control_plane: Any, namespace: str, doc: dict[str, Any]) -> Any:
    """`kubectl apply` as a user runs it (strict field validation, kubectl's default)."""
    return control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)


def test_a_run_with_pod_templates_is_admitted_and_its_rayjob_and_pods_carry_them(
    control_plane: Any, cluster: Cluster, kuberay: KubeRayDouble, operator: InProcessOperator
) -> None:
    ns = cluster.namespace
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": 1000}
    control_plane.apply({**priority, "metadata": {"name": templates.PRIORITY_CLASS}})
    control_plane.kubectl("create", "serviceaccount", templates.WORKER_SERVICE_ACCOUNT, "-n", ns)
    doc = templates.with_templates(head=templates.HEAD, worker=templates.WORKER)
    doc["spec"]["ray"]["head"]["shmSize"] = "2Gi"

    result = apply(control_plane, ns, doc)
    assert result.returncode == 0, result.stderr
    stored = cluster.run("tiny")["spec"]["ray"]
    assert stored["head"]["template"] == templates.HEAD, "admitted as written: no field pruned"
    assert stored["workers"][0]["template"] == templates.WORKER

    job = eventually(lambda: cluster.rayjob("tiny-a1"), what="RayJob tiny-a1")
    run = cluster.run("tiny")
    spec = model.TrainingRunSpec.model_validate(run["spec"])
    built = rayjob.build_rayjob("tiny", ns, run["metadata"]["uid"], 1, None, spec)
    stored_cluster, built_cluster = job["spec"]["rayClusterSpec"], built["spec"]["rayClusterSpec"]
    assert stored_cluster["headGroupSpec"] == built_cluster["headGroupSpec"], "KubeRay's schema pruned nothing"
    assert stored_cluster["workerGroupSpecs"][0]["template"] == built_cluster["workerGroupSpecs"][0]["template"]
    dry = copy.deepcopy(built)
    dry["metadata"]["name"] = "tiny-dry-run"
    strict = control_plane.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-n", ns, "-f", "-", input=json.dumps(dry), check=False
    )
    assert strict.returncode == 0, strict.stderr

    kuberay.start("tiny-a1")
    head = cluster.core.read_namespaced_pod(kuberay.head("tiny-a1"), ns)
    assert head.spec.service_account_name == "tiny-driver"
    assert head.spec.priority_class_name == templates.PRIORITY_CLASS and head.spec.priority == 1000
    assert [c.name for c in head.spec.containers] == ["ray-head", "checkpoint-sync"]
    env = {e.name: e for e in head.spec.containers[0].env}
    assert env["HF_TOKEN"].value_from.secret_key_ref.name == "hf"
    shm = next(v for v in head.spec.volumes if v.name == "dev-shm")
    assert (shm.empty_dir.medium, shm.empty_dir.size_limit) == ("Memory", "2Gi")
    assert head.metadata.labels["team"] == "research" and head.metadata.labels["trainingrun.dev/attempt"] == "1"
    assert head.spec.image_pull_secrets[0].name == "registry"
    (worker,) = cluster.pods("ray.io/node-type=worker")
    assert worker.spec.service_account_name == templates.WORKER_SERVICE_ACCOUNT
    assert worker.spec.automount_service_account_token is False
    assert worker.spec.containers[0].lifecycle.pre_stop._exec.command == ["sleep", "1"]


@pytest.mark.parametrize("case", templates.REFUSED, ids=[c.id for c in templates.REFUSED])
def test_a_template_that_sets_an_owned_field_is_rejected_by_kubectl_apply_naming_the_field(
    control_plane: Any, namespace: str, case: templates.Refused
) -> None:
    result = apply(control_plane, namespace, case.run())
    assert result.returncode != 0
    assert f"{case.field}: Invalid value" in result.stderr and case.says in result.stderr, result.stderr


_SECRET = {"name": "A", "valueFrom": {"secretKeyRef": {"nme": "hf", "key": "token"}}}


@pytest.mark.parametrize(
    ("fragment", "field"),
    [
        ({"spec": {"priorityClasName": "high"}}, "spec.ray.head.template.spec.priorityClasName"),
        (
            {"spec": {"containers": [{"name": "ray-head", "env": [_SECRET]}]}},
            "spec.ray.head.template.spec.containers[0].env[0].valueFrom.secretKeyRef.nme",
        ),
        ({"spec": {"imagePullSecrets": "registry"}}, "spec.ray.head.template.spec.imagePullSecrets"),
        (
            {"spec": {"tolerations": [{"key": "a", "tolerationSeconds": "soon"}]}},
            "spec.ray.head.template.spec.tolerations[0].tolerationSeconds",
        ),
        ({"metadata": {"name": "my-pod"}}, "spec.ray.head.template.metadata.name"),
        (
            {"spec": {"containers": [{"name": "ray-head", "env": [{"name": "A"}, {"name": "A", "value": "1"}]}]}},
            "spec.ray.head.template.spec.containers[0].env[1]: Duplicate value",
        ),
    ],
    ids=[
        "misspelled field",
        "misspelled secret reference",
        "a string for a list",
        "a string for a number",
        "a pod name",
        "an env variable given twice",
    ],
)
def test_a_template_typo_is_rejected_by_kubectl_apply_naming_the_field(
    control_plane: Any, namespace: str, fragment: dict[str, Any], field: str
) -> None:
    result = apply(control_plane, namespace, templates.with_templates(head=fragment))
    assert result.returncode != 0
    assert field in result.stderr, result.stderr


@pytest.mark.parametrize("example", ["tiny.yaml", "cluster.yaml"])
def test_the_ray_pods_are_admitted_in_a_namespace_that_enforces_the_restricted_pod_security_standard(
    control_plane: Any, namespace: str, example: str
) -> None:
    """The API server's PodSecurity admission (`restricted`) admits the pods of every group the operator builds, as
    they come out of the RayJob's templates (KubeRay adds its own containers' ports and environment, and copies the
    Ray container's securityContext to its init container); the same pod without the operator's securityContext is
    refused, so the namespace does enforce it."""
    control_plane.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    docs = yaml.safe_load_all((templates.EXAMPLE.parent / example).read_text())
    doc = next(d for d in docs if d and d["kind"] == model.KIND)
    spec = model.TrainingRunSpec.model_validate(doc["spec"])
    control_plane.kubectl("create", "serviceaccount", f"{doc['metadata']['name']}-driver", "-n", namespace)
    built = rayjob.build_rayjob(doc["metadata"]["name"], namespace, "uid-1", 1, None, spec)["spec"]["rayClusterSpec"]
    groups = [built["headGroupSpec"], *built.get("workerGroupSpecs", [])]
    for i, group in enumerate(groups):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"psa-{i}"}, "spec": group["template"]["spec"]}
        admitted = control_plane.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod), check=False
        )
        assert admitted.returncode == 0, admitted.stderr
        bare = copy.deepcopy(pod)
        bare["spec"].pop("securityContext", None)
        for container in bare["spec"]["containers"]:
            container.pop("securityContext", None)
        refused = control_plane.kubectl(
            "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(bare), check=False
        )
        assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr
