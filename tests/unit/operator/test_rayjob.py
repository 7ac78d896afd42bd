"""The RayJob builder and the per-run identity: their output, and its validity against KubeRay's real CRD."""

from __future__ import annotations

import json
import pathlib
import shlex
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import yaml

from trainingrun_operator import identity, model, rayjob
from trainingrun_runtime.config import RuntimeConfig

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples"


def spec_of(example: str) -> model.TrainingRunSpec:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d and d["kind"] == "TrainingRun"]
    return model.TrainingRunSpec.model_validate(docs[0]["spec"])


_VALIDATORS: dict[int, Any] = {}


def rayjob_validator(crd: dict[str, Any], convert: Callable[..., Any]) -> Any:
    """A JSON Schema validator for RayJob objects (built once: the CRD's schema is large)."""
    if id(crd) not in _VALIDATORS:
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schema = convert(v1["schema"]["openAPIV3Schema"], closed=True)
        _VALIDATORS[id(crd)] = jsonschema.Draft7Validator(schema)
    return _VALIDATORS[id(crd)]


@pytest.mark.parametrize("example", ["tiny.yaml", "cluster.yaml"])
def test_rayjob_validates_against_kuberays_v1_5_0_crd_schema(
    example: str, kuberay_rayjob_crd: dict[str, Any], openapi_to_jsonschema: Callable[..., Any]
) -> None:
    body = rayjob.build_rayjob("tiny", "ns", "uid-1", 2, 15, spec_of(example))
    rayjob_validator(kuberay_rayjob_crd, openapi_to_jsonschema).validate(body)


def test_the_schema_check_catches_a_misspelled_rayjob_field(
    kuberay_rayjob_crd: dict[str, Any], openapi_to_jsonschema: Callable[..., Any]
) -> None:
    body = rayjob.build_rayjob("tiny", "ns", "uid-1", 1, None, spec_of("tiny.yaml"))
    body["spec"]["shutdownAfterJobFinished"] = body["spec"].pop("shutdownAfterJobFinishes")
    with pytest.raises(jsonschema.ValidationError, match="shutdownAfterJobFinished"):
        rayjob_validator(kuberay_rayjob_crd, openapi_to_jsonschema).validate(body)


def test_rayjob_is_named_from_run_and_attempt_owned_labelled_and_never_retried_by_kuberay() -> None:
    body = rayjob.build_rayjob("tiny", "ns", "uid-1", 3, 15, spec_of("tiny.yaml"))
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"]) == ("tiny-a3", "ns")
    assert meta["labels"]["trainingrun.dev/run"] == "tiny" and meta["labels"]["trainingrun.dev/attempt"] == "3"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "trainingrun.dev/v1alpha1",
            "kind": "TrainingRun",
            "name": "tiny",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        },
    ]
    spec = body["spec"]
    assert (spec["backoffLimit"], spec["shutdownAfterJobFinishes"], spec["submissionMode"]) == (0, True, "HTTPMode")


def test_entrypoint_runs_the_driver_with_run_attempt_resume_root_and_config() -> None:
    spec = spec_of("cluster.yaml")
    argv = shlex.split(rayjob.build_rayjob("reverse-digits", "team-a", "u", 4, 150, spec)["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "trainingrun_runtime"]
    args = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert args["--run"] == "reverse-digits" and args["--namespace"] == "team-a"
    assert (args["--attempt"], args["--resume"], args["--reporter"]) == ("4", "150", "kubernetes")
    assert args["--root"] == "/checkpoints/trainingruns"
    config = RuntimeConfig.model_validate(json.loads(args["--config-json"]))
    assert config.trainer.steps == 2000
    assert (config.checkpoint.save_period, config.checkpoint.keep_last, config.checkpoint.keep_every) == (50, 3, 500)


def test_entrypoint_says_latest_when_there_is_no_recorded_step() -> None:
    argv = shlex.split(rayjob.entrypoint("tiny", "ns", 1, None, spec_of("tiny.yaml")))
    assert argv[argv.index("--resume") + 1] == "latest"
    assert argv[argv.index("--root") + 1] == "/checkpoints"


def test_the_driver_claims_the_run_directory_with_the_runs_uid_and_attempt() -> None:
    body = rayjob.build_rayjob("tiny", "ns", "7f3c-uid", 4, 30, spec_of("tiny.yaml"))
    argv = shlex.split(body["spec"]["entrypoint"])
    assert argv[argv.index("--run-uid") + 1] == "7f3c-uid" and argv[argv.index("--attempt") + 1] == "4"


def test_every_pod_mounts_the_checkpoint_pvc_and_only_the_head_gets_the_run_identity() -> None:
    body = rayjob.build_rayjob("reverse-digits", "ns", "u", 1, None, spec_of("cluster.yaml"))
    cluster = body["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    (workers,) = cluster["workerGroupSpecs"]
    assert head["serviceAccountName"] == "reverse-digits-driver"
    assert workers["template"]["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in workers["template"]["spec"]
    for pod in (head, workers["template"]["spec"]):
        assert pod["volumes"] == [
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "reverse-digits-checkpoints"}}
        ]
        assert pod["containers"][0]["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/checkpoints"}]
    assert (workers["replicas"], workers["minReplicas"], workers["maxReplicas"]) == (2, 2, 2)
    assert workers["template"]["spec"]["tolerations"][0]["key"] == "cloud.google.com/gke-spot"
    assert cluster["headGroupSpec"]["template"]["metadata"]["labels"]["trainingrun.dev/attempt"] == "1"


def test_driver_role_allows_get_and_patch_on_this_runs_status_only() -> None:
    role = identity.build_role("tiny", "ns", "u")
    assert role["rules"] == [
        {
            "apiGroups": ["trainingrun.dev"],
            "resources": ["trainingruns/status"],
            "resourceNames": ["tiny"],
            "verbs": ["get", "patch"],
        },
    ]
    binding = identity.build_role_binding("tiny", "ns", "u")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tiny-driver"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tiny-driver", "namespace": "ns"}]
    sa = identity.build_service_account("tiny", "ns", "u")
    assert sa["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_the_longest_run_name_the_crd_allows_still_fits_kuberays_rayjob_name_limit() -> None:
    from trainingrun_operator import naming

    assert len(naming.rayjob_name("r" * 40, 99_999)) <= 47
