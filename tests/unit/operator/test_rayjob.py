"""The RayJob builder and the per-run identity: their output, and its validity against KubeRay's real CRD."""

from __future__ import annotations

import json
import pathlib
import shlex
from collections.abc import Callable
from typing import Any

import jsonschema
import pydantic
import pytest
import yaml

from support import templates
from trainingrun_operator.core import identity, model, queueing, rayjob
from trainingrun_runtime import contract, sdk
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


def test_every_ray_pod_gets_a_memory_backed_dev_shm_sized_by_the_groups_shm_size(
    kuberay_rayjob_crd: dict[str, Any], openapi_to_jsonschema: Callable[..., Any]
) -> None:
    spec = spec_of("cluster.yaml").wire()
    spec["ray"]["head"]["shmSize"] = "8Gi"
    spec["ray"]["workers"][0]["shmSize"] = 2**30
    body = rayjob.build_rayjob("r", "ns", "u", 1, None, model.TrainingRunSpec.model_validate(spec))
    rayjob_validator(kuberay_rayjob_crd, openapi_to_jsonschema).validate(body)
    cluster = body["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    assert {"name": "dev-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in head["volumes"]
    assert {"name": "dev-shm", "emptyDir": {"medium": "Memory", "sizeLimit": 2**30}} in worker["volumes"]
    for pod in (head, worker):
        assert {"name": "dev-shm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]


def test_a_rayjob_with_pod_templates_validates_against_kuberays_v1_5_0_crd_schema(
    kuberay_rayjob_crd: dict[str, Any], openapi_to_jsonschema: Callable[..., Any]
) -> None:
    doc = templates.with_templates(head=templates.HEAD, worker=templates.WORKER)
    body = rayjob.build_rayjob("tiny", "ns", "uid-1", 1, None, model.TrainingRunSpec.model_validate(doc["spec"]))
    rayjob_validator(kuberay_rayjob_crd, openapi_to_jsonschema).validate(body)


def test_the_schema_check_catches_a_misspelled_field_in_a_merged_template(
    kuberay_rayjob_crd: dict[str, Any], openapi_to_jsonschema: Callable[..., Any]
) -> None:
    doc = templates.with_templates(head={"spec": {"priorityClasName": "high"}})
    body = rayjob.build_rayjob("tiny", "ns", "uid-1", 1, None, model.TrainingRunSpec.model_validate(doc["spec"]))
    with pytest.raises(jsonschema.ValidationError, match="priorityClasName"):
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
    assert args["--root"] == "/checkpoints/trainingruns/team-a"
    assert args["--legacy-root"] == "/checkpoints/trainingruns"
    config = RuntimeConfig.model_validate(json.loads(args["--config-json"]))
    assert config.trainer.steps == 2000
    assert (config.checkpoint.save_period, config.checkpoint.keep_last, config.checkpoint.keep_every) == (10, 3, 500)


def test_entrypoint_says_latest_when_there_is_no_recorded_step() -> None:
    argv = shlex.split(rayjob.entrypoint("tiny", "ns", 1, None, spec_of("tiny.yaml")))
    assert argv[argv.index("--resume") + 1] == "latest"
    assert argv[argv.index("--root") + 1] == "/checkpoints/ns"


def test_the_driver_is_told_the_older_recorded_steps_to_fall_back_to_only_with_a_pinned_step() -> None:
    body = rayjob.build_rayjob("tiny", "ns", "u", 3, 30, spec_of("tiny.yaml"), fallback=(20, 10))
    argv = shlex.split(body["spec"]["entrypoint"])
    assert argv[argv.index("--fallback") + 1] == "20,10"
    assert "--fallback" not in rayjob.entrypoint("tiny", "ns", 3, 30, spec_of("tiny.yaml"))
    assert "--fallback" not in rayjob.entrypoint("tiny", "ns", 3, None, spec_of("tiny.yaml"), fallback=(20,))


def test_the_driver_is_told_the_recorded_manifest_blake3_of_its_steps_only_with_a_pinned_step() -> None:
    hashes = {20: "a" * 64, 10: "b" * 64}
    body = rayjob.build_rayjob("tiny", "ns", "u", 3, 20, spec_of("tiny.yaml"), (10,), manifest_blake3=hashes)
    argv = shlex.split(body["spec"]["entrypoint"])
    assert argv[argv.index("--manifest-blake3") + 1] == f"10={'b' * 64},20={'a' * 64}"
    assert "--manifest-blake3" not in rayjob.entrypoint("tiny", "ns", 3, None, spec_of("tiny.yaml"), None, (), hashes)
    assert "--manifest-blake3" not in rayjob.entrypoint("tiny", "ns", 3, 20, spec_of("tiny.yaml"))


def test_the_driver_claims_the_run_directory_with_the_runs_uid_and_attempt() -> None:
    body = rayjob.build_rayjob("tiny", "ns", "7f3c-uid", 4, 30, spec_of("tiny.yaml"))
    argv = shlex.split(body["spec"]["entrypoint"])
    assert argv[argv.index("--run-uid") + 1] == "7f3c-uid" and argv[argv.index("--attempt") + 1] == "4"


def test_every_pod_mounts_the_checkpoint_pvc_and_only_the_head_gets_the_run_identity() -> None:
    body = rayjob.build_rayjob("reverse-digits", "ns", "u", 1, None, spec_of("cluster.yaml"))
    cluster = body["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    generation, trainer = cluster["workerGroupSpecs"]
    assert head["serviceAccountName"] == "reverse-digits-driver"
    for workers in (generation, trainer):
        assert workers["template"]["spec"]["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in workers["template"]["spec"]
        assert (workers["replicas"], workers["minReplicas"], workers["maxReplicas"]) == (2, 2, 2)
    for pod in (head, generation["template"]["spec"], trainer["template"]["spec"]):
        assert pod["volumes"] == [
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "reverse-digits-checkpoints"}},
            {"name": "dev-shm", "emptyDir": {"medium": "Memory"}},
        ]
        assert pod["containers"][0]["volumeMounts"] == [
            {"name": "checkpoints", "mountPath": "/checkpoints"},
            {"name": "dev-shm", "mountPath": "/dev/shm"},
        ]
    assert generation["template"]["spec"]["tolerations"][0]["key"] == "cloud.google.com/gke-spot"
    assert "trainingrun_trainer" in trainer["rayStartParams"]["resources"]
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
    from trainingrun_operator.core import naming

    assert len(naming.rayjob_name("r" * 40, 99_999)) <= 47


# ------------------------------------------------------------------------------------------ placement


def kuberay_resources(params: dict[str, str]) -> dict[str, float]:
    """`getResourcesMap` of KubeRay 1.5 (pod.go): surrounding quotes and spaces trimmed, then JSON."""
    value = json.loads(params["resources"].strip("'\"` "))
    assert isinstance(value, dict)
    return value


def with_workers(example: str, *groups: dict[str, Any], **restart_policy: Any) -> model.TrainingRunSpec:
    spec = spec_of(example).wire()
    spec["ray"]["workers"] = list(groups)
    spec["restartPolicy"] = {**spec.get("restartPolicy", {}), **restart_policy}
    return model.TrainingRunSpec.model_validate(spec)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, {"trainingrun_generation": 1000}),
        ('{"spot": 1}', {"spot": 1, "trainingrun_generation": 1000}),
        (" '{\"spot\": 2.5}' ", {"spot": 2.5, "trainingrun_generation": 1000}),
        ('"{"trainingrun_generation": 1}"', {"trainingrun_generation": 1000}),
    ],
    ids=["none given", "JSON given", "quoted as KubeRay allows", "ours wins"],
)
def test_every_worker_group_offers_the_generation_resource_merged_into_the_users_resources(
    given: str | None, expected: dict[str, float]
) -> None:
    group: dict[str, Any] = {"name": "gen", "replicas": 2, "rayStartParams": {"num-cpus": "8"}}
    if given is not None:
        group["rayStartParams"]["resources"] = given
    body = rayjob.build_rayjob("r", "ns", "u", 1, None, with_workers("cluster.yaml", group))
    cluster = body["spec"]["rayClusterSpec"]
    (params,) = [g["rayStartParams"] for g in cluster["workerGroupSpecs"]]
    assert params["resources"].startswith("'{") and params["resources"].endswith("}'"), "as KubeRay writes it"
    assert kuberay_resources(params) == expected
    assert params["num-cpus"] == "8", "the user's other parameters stay"
    assert "resources" not in cluster["headGroupSpec"]["rayStartParams"], "the head offers no generation resource"


def test_a_worker_group_of_role_trainer_offers_one_unit_of_the_trainer_resource_and_none_of_generation() -> None:
    trainer = {"name": "train", "replicas": 2, "role": "trainer", "rayStartParams": {"resources": '{"spot": 1}'}}
    spec = with_workers("cluster.yaml", {"name": "gen", "replicas": 2}, trainer)
    spec = spec.model_copy(update={"trainer": {**spec.trainer, "trainerWorkers": 2}})
    body = rayjob.build_rayjob("r", "ns", "u", 1, None, spec)
    offered = {
        g["groupName"]: kuberay_resources(g["rayStartParams"])
        for g in body["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    }
    assert offered == {"gen": {"trainingrun_generation": 1000}, "train": {"spot": 1, "trainingrun_trainer": 1}}
    argv = shlex.split(rayjob.entrypoint("r", "ns", 1, None, spec))
    config = RuntimeConfig.model_validate(json.loads(argv[argv.index("--config-json") + 1]))
    assert config.trainers.on_worker_groups and config.generation.on_worker_groups


def test_with_only_a_trainer_group_generation_runs_on_the_head() -> None:
    spec = with_workers("cluster.yaml", {"name": "train", "replicas": 1, "role": "trainer"})
    argv = shlex.split(rayjob.entrypoint("r", "ns", 1, None, spec))
    config = RuntimeConfig.model_validate(json.loads(argv[argv.index("--config-json") + 1]))
    assert config.trainers.on_worker_groups and not config.generation.on_worker_groups


@pytest.mark.parametrize(
    ("workers", "on_worker_groups"),
    [
        ([], False),
        ([{"name": "gen", "replicas": 0}], False),
        ([{"name": "idle", "replicas": 0}, {"name": "gen", "replicas": 1}], True),
    ],
    ids=["no worker group", "only empty groups", "a group with pods"],
)
def test_the_driver_runs_generation_on_the_worker_groups_only_when_they_have_pods(
    workers: list[dict[str, Any]], on_worker_groups: bool
) -> None:
    spec = with_workers("tiny.yaml", *workers, workerReplacementSeconds=45)
    argv = shlex.split(rayjob.entrypoint("tiny", "ns", 1, None, spec))
    config = RuntimeConfig.model_validate(json.loads(argv[argv.index("--config-json") + 1]))
    assert config.generation.on_worker_groups is on_worker_groups
    assert config.generation.replacement_seconds == 45


def test_the_cluster_example_puts_generation_on_its_workers_and_waits_the_default_bound_for_a_lost_one() -> None:
    argv = shlex.split(rayjob.entrypoint("r", "ns", 1, None, spec_of("cluster.yaml")))
    config = json.loads(argv[argv.index("--config-json") + 1])
    assert config["generation"] == {"onWorkerGroups": True, "replacementSeconds": 300.0}


def test_the_head_asks_the_driver_to_save_on_its_notice_within_its_grace_period() -> None:
    spec = spec_of("cluster.yaml")
    body = rayjob.build_rayjob("reverse-digits", "ns", "u", 3, None, spec)
    head = body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["terminationGracePeriodSeconds"] == model.HEAD_GRACE_SECONDS
    hook = head["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:3] == ["python", "-m", "trainingrun_runtime.sdk.notice"]
    args = dict(zip(hook[3::2], hook[4::2], strict=True))
    assert args == {
        "--root": "/checkpoints/trainingruns/ns",
        "--run": "reverse-digits",
        "--attempt": "3",
        "--grace-seconds": str(model.HEAD_GRACE_SECONDS),
    }


def root_args(body: dict[str, Any]) -> tuple[str, str, str]:
    """The driver's --root and --legacy-root, and the preStop hook's --root, of a RayJob."""
    argv = shlex.split(body["spec"]["entrypoint"])
    hook = body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["lifecycle"]
    command = hook["preStop"]["exec"]["command"]
    return argv[argv.index("--root") + 1], argv[argv.index("--legacy-root") + 1], command[command.index("--root") + 1]


def test_runs_named_alike_in_two_namespaces_get_two_roots_and_the_hook_looks_where_the_driver_writes() -> None:
    spec = spec_of("cluster.yaml")
    a = root_args(rayjob.build_rayjob("reverse-digits", "team-a", "uid-a", 1, None, spec))
    b = root_args(rayjob.build_rayjob("reverse-digits", "team-b", "uid-b", 1, None, spec))
    assert a == ("/checkpoints/trainingruns/team-a", "/checkpoints/trainingruns", "/checkpoints/trainingruns/team-a")
    assert b == ("/checkpoints/trainingruns/team-b", "/checkpoints/trainingruns", "/checkpoints/trainingruns/team-b")


def test_without_a_checkpoint_path_the_namespace_sits_right_under_the_mount() -> None:
    assert root_args(rayjob.build_rayjob("tiny", "ns", "u", 1, None, spec_of("tiny.yaml"))) == (
        "/checkpoints/ns",
        "/checkpoints",
        "/checkpoints/ns",
    )


def test_the_grace_periods_come_from_the_spec_and_workers_get_no_hook() -> None:
    spec = spec_of("cluster.yaml").wire()
    spec["ray"]["head"]["terminationGracePeriodSeconds"] = 90
    spec["ray"]["workers"][0]["terminationGracePeriodSeconds"] = 5
    body = rayjob.build_rayjob("r", "ns", "u", 1, None, model.TrainingRunSpec.model_validate(spec))
    cluster = body["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    assert head["terminationGracePeriodSeconds"] == 90
    assert head["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1] == "90"
    assert worker["terminationGracePeriodSeconds"] == 5
    assert "lifecycle" not in worker["containers"][0]


def test_a_worker_group_without_a_grace_period_leaves_kubernetes_default() -> None:
    body = rayjob.build_rayjob("r", "ns", "u", 1, None, spec_of("cluster.yaml"))
    assert (
        "terminationGracePeriodSeconds" not in body["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    )


def test_a_queued_runs_rayjob_is_created_suspended_with_kueues_labels_on_the_rayjob_only(
    kuberay_rayjob_crd: dict[str, Any], openapi_to_jsonschema: Callable[..., Any]
) -> None:
    queue = queueing.Queue("team-a", "high")
    job = rayjob.build_rayjob("demo", "ns", "uid-1", 2, None, spec_of("cluster.yaml"), (), queue)
    rayjob_validator(kuberay_rayjob_crd, openapi_to_jsonschema).validate(job)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][queueing.QUEUE_LABEL] == "team-a"
    assert job["metadata"]["labels"][queueing.PRIORITY_CLASS_LABEL] == "high"
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    assert all(queueing.QUEUE_LABEL not in p["metadata"]["labels"] for p in pods), "pods are not Kueue jobs"
    # Kueue's rules for a RayJob it manages (its RayJob webhook, v0.17.0):
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert "clusterSelector" not in job["spec"] and "enableInTreeAutoscaling" not in cluster
    assert job["spec"]["submissionMode"] == "HTTPMode", "no submitter pod set"
    assert len(cluster["workerGroupSpecs"]) <= queueing.MAX_WORKER_GROUPS


def test_an_unqueued_runs_rayjob_is_not_suspended_and_has_no_kueue_labels() -> None:
    job = rayjob.build_rayjob("demo", "ns", "uid-1", 1, None, spec_of("tiny.yaml"))
    assert "suspend" not in job["spec"]
    assert not any(key.startswith("kueue.x-k8s.io/") for key in job["metadata"]["labels"])


def test_a_driver_programs_rayjob_runs_its_command_with_the_attempt_in_trainingrun_attach_and_its_env() -> None:
    body = rayjob.build_rayjob(
        "plain-torch", "team-a", "uid-7", 3, 200, spec_of("plain-torch.yaml"), fallback=(100,),
        manifest_blake3={200: "a" * 64, 100: "b" * 64},
    )  # fmt: skip
    words = shlex.split(body["spec"]["entrypoint"])
    assert words[0] == "env" and words[-3:] == ["python", "-m", "trainingrun_runtime.examples.plain_torch"]
    assignments = dict(w.split("=", 1) for w in words[1:-3])
    assert assignments["OMP_NUM_THREADS"] == "1"
    attached = sdk.attached.parse_attachment(assignments[contract.ATTACH_ENV])
    assert attached == {
        "run": "plain-torch", "namespace": "team-a", "attempt": 3, "runUid": "uid-7",
        "root": "/checkpoints/team-a", "resume": 200, "fallback": [100],
        "manifestBlake3": {"100": "b" * 64, "200": "a" * 64}, "reporter": "kubernetes", "savePeriod": 100,
        "keepLast": 3, "keepEvery": None, "trainer": {"steps": 3000, "seed": 0, "grpo": {"lr": 0.001}},
    }  # fmt: skip
    head = body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][:3] == [
        "python", "-m", "trainingrun_runtime.sdk.notice",
    ]  # fmt: skip


def test_a_value_the_shell_would_read_reaches_the_program_as_one_word() -> None:
    spec = spec_of("plain-torch.yaml").wire()
    spec["driver"] = {"entrypoint": ["python", "train.py", "--note", "a b; rm -rf / $(x)"],
                      "env": [{"name": "NOTE", "value": "it's `here`"}]}  # fmt: skip
    body = rayjob.build_rayjob("p", "ns", "u", 1, None, model.TrainingRunSpec.model_validate(spec))
    words = shlex.split(body["spec"]["entrypoint"])
    assert words[-4:] == ["python", "train.py", "--note", "a b; rm -rf / $(x)"]
    assert "NOTE=it's `here`" in words


def test_an_env_name_of_the_operators_own_is_refused_naming_the_field() -> None:
    spec = spec_of("plain-torch.yaml").wire()
    spec["driver"]["env"] = [{"name": "TRAININGRUN_ATTACH", "value": "{}"}]
    with pytest.raises(pydantic.ValidationError, match=r"driver\.env\.0[\s\S]*operator's"):
        model.TrainingRunSpec.model_validate(spec)
