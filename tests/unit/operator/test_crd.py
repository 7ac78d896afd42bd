"""The TrainingRun CRD: structural, mirrored by the pydantic model, and accepting the shipped examples.

CEL rules need a real API server; tests/integration/test_operator_safety.py checks them there.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import functools
import importlib.util
import json
import pathlib
import re
import typing
from collections.abc import Callable
from typing import Any

import jsonschema
import pydantic
import pytest
import yaml

from trainingrun_operator.core import decision, model, patching
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation
from trainingrun_runtime import contract
from trainingrun_runtime.config import RuntimeConfig

REPO = pathlib.Path(__file__).resolve().parents[3]
CRD_PATH = REPO / "manifests" / "crd" / "trainingrun.dev_trainingruns.yaml"


@functools.cache
def _crd() -> dict[str, Any]:
    """The CRD, parsed once (its generated pod template schemas make it large); no test changes it."""
    doc = yaml.load(CRD_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert isinstance(doc, dict)
    return doc


_VALIDATOR: list[jsonschema.Draft7Validator] = []


def _validate(doc: dict[str, Any], convert: Callable[..., Any]) -> None:
    """Raise the most relevant error of `doc` against the CRD's schema, closed (a validator built once)."""
    if not _VALIDATOR:
        _VALIDATOR.append(jsonschema.Draft7Validator(convert(_schema(), closed=True)))
    error = jsonschema.exceptions.best_match(_VALIDATOR[0].iter_errors(doc))
    if error is not None:
        raise error


def _schema() -> dict[str, Any]:
    version = _crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    assert isinstance(schema, dict)
    return schema


def _walk(node: dict[str, Any], path: str) -> typing.Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _training_runs(name: str) -> list[dict[str, Any]]:
    path = REPO / "manifests" / "examples" / name
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == "TrainingRun"]


# ------------------------------------------------------------------------------------------- identity


def test_crd_names_group_version_kind_and_short_name() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == f"{model.PLURAL}.{model.GROUP}"
    assert crd["spec"]["group"] == model.GROUP
    assert crd["spec"]["names"]["kind"] == model.KIND
    assert crd["spec"]["names"]["shortNames"] == ["trun"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == model.VERSION
    assert version["subresources"] == {"status": {}}


def test_printer_columns_show_phase_progress_step_attempt_restarts_and_age() -> None:
    (version,) = _crd()["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0}
    assert columns == {
        "Phase": ".status.phase",
        "Progress": ".status.progress",
        "Step": ".status.checkpoints.latest.step",
        "Attempt": ".status.attempt.number",
        "Restarts": ".status.restarts.total",
        "Age": ".metadata.creationTimestamp",
    }


def test_wide_output_adds_the_workers_lost_by_the_attempt_the_reward_the_goodput_the_eta_and_the_reason() -> None:
    (version,) = _crd()["spec"]["versions"]
    wide = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 1}
    assert wide == {
        "Workers-Lost": ".status.attempt.workersLost",
        "Reward": ".status.reward",
        "Goodput": ".status.goodput.ratio",
        "ETA": ".status.eta",
        "Reason": ".status.reason",
    }


def test_every_status_column_points_at_a_field_the_status_declares_with_the_columns_type() -> None:
    (version,) = _crd()["spec"]["versions"]
    columns = [c for c in version["additionalPrinterColumns"] if c["jsonPath"].startswith(".status.")]
    assert len(columns) == 10
    for column in columns:
        node = _schema()
        for part in column["jsonPath"].lstrip(".").split("."):
            node = node["properties"][part]
        assert node["type"] == column["type"], column


def test_restart_policy_bounds_worker_replacement_a_not_ready_head_node_and_stalls_with_defaults() -> None:
    policy = _schema()["properties"]["spec"]["properties"]["restartPolicy"]["properties"]
    month = 30 * 24 * 3600
    assert {
        k: (policy[k]["type"], policy[k]["minimum"], policy[k]["maximum"], policy[k].get("default"))
        for k in policy
        if k.endswith("Seconds")
    } == {
        "workerReplacementSeconds": ("number", 0, month, 300),
        "nodeNotReadySeconds": ("number", 0, month, 60),
        "progressDeadlineSeconds": ("number", 0, month, None),  # unset: no stall watchdog
        "startupDeadlineSeconds": ("number", 0, month, 600),
    }
    assert model.MAX_SECONDS == month


def test_the_ray_groups_say_which_runs_the_state_and_which_only_generation() -> None:
    ray = _schema()["properties"]["spec"]["properties"]["ray"]["properties"]
    head, workers = ray["head"]["description"], ray["workers"]["description"]
    assert all(part in head for part in ("driver", "controller", "trainer", "TransferQueue", "3 logical CPUs"))
    assert "generation workers only" in workers and "no restart" in workers


def test_every_schema_node_has_a_type_so_the_schema_is_structural() -> None:
    untyped = [
        path
        for path, node in _walk(_schema(), "")
        if "type" not in node
        and not node.get("x-kubernetes-int-or-string")
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ]
    assert untyped == []


def test_status_declares_every_field_the_driver_reports_and_no_other() -> None:
    status = _schema()["properties"]["status"]["properties"]
    runtime = status[contract.REPORT_FIELD]["properties"]
    assert set(runtime) == set(contract.RuntimeStatus.__annotations__)
    assert set(runtime["lastCheckpoint"]["properties"]) == set(contract.CheckpointReport.__annotations__)
    assert set(runtime["badCheckpoints"]["items"]["properties"]) == set(contract.BadCheckpointReport.__annotations__)


def test_cel_rules_cover_immutable_storage_pinned_resume_and_backoff_cap() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    rules = [
        r["rule"]
        for node in (spec["checkpoint"], spec["resume"], spec["restartPolicy"]["properties"]["backoff"])
        for r in node["x-kubernetes-validations"]
    ]
    assert any("oldSelf.pvc" in r for r in rules)
    assert any("self.policy == 'step'" in r for r in rules)
    assert any("maxSeconds >= self.initialSeconds" in r for r in rules)
    assert spec["resume"]["properties"]["step"]["minimum"] == 0


# ------------------------------------------------------------------------------ CRD <-> pydantic mirror


def _model_of(annotation: Any) -> type[pydantic.BaseModel] | None:
    """The pydantic model inside an annotation like `X | None` or `list[X] | None`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _mismatches(schema: dict[str, Any], cls: type[pydantic.BaseModel], path: str) -> list[str]:
    props = schema.get("properties", {})
    fields = {(f.alias or name): f for name, f in cls.model_fields.items()}
    problems = [f"{path}.{n}: in the CRD, not in {cls.__name__}" for n in sorted(set(props) - set(fields))]
    problems += [f"{path}.{n}: in {cls.__name__}, not in the CRD" for n in sorted(set(fields) - set(props))]
    for name in sorted(set(props) & set(fields)):
        field, child = fields[name], props[name]
        if "default" in child and field.default != pydantic.fields.PydanticUndefined:
            default = field.default.wire() if isinstance(field.default, pydantic.BaseModel) else field.default
            if default != child["default"] and not (child["default"] == {} and isinstance(default, dict)):
                problems.append(f"{path}.{name}: default {child['default']!r} in the CRD, {default!r} in the model")
        if "default" in child and field.is_required():
            problems.append(f"{path}.{name}: defaulted in the CRD but required in the model")
        sub = _model_of(field.annotation)
        node = child.get("items", child) if child.get("type") == "array" else child
        if sub is not None and "properties" in node:
            problems += _mismatches(node, sub, f"{path}.{name}")
    return problems


def test_pydantic_model_mirrors_every_field_of_the_crd_spec_and_status() -> None:
    schema = _schema()["properties"]
    problems = _mismatches(schema["spec"], model.TrainingRunSpec, "spec")
    problems += _mismatches(schema["status"], model.TrainingRunStatus, "status")
    assert problems == []


def test_crd_required_fields_are_required_in_the_model() -> None:
    spec = _schema()["properties"]["spec"]
    required = {f.alias for f in model.TrainingRunSpec.model_fields.values() if f.is_required()}
    assert required == set(spec["required"])


def test_model_rejects_an_unknown_field_naming_it() -> None:
    doc = _training_runs("tiny.yaml")[0]
    doc["spec"]["checkpoint"]["savePeriodd"] = 5
    with pytest.raises(pydantic.ValidationError, match="savePeriodd"):
        model.TrainingRun.model_validate(doc)


def test_model_rejects_a_step_without_a_pinned_policy() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"resume\.step is required"):
        model.ResumeSpec.model_validate({"policy": "latest", "step": 3})


# ------------------------------------------------------------------------------------------- examples


@pytest.mark.parametrize("example", ["tiny.yaml", "cluster.yaml"])
def test_example_validates_against_the_crd_schema_the_model_and_the_runtime_config(
    example: str, openapi_to_jsonschema: Callable[..., Any]
) -> None:
    (doc,) = _training_runs(example)
    _validate(doc, openapi_to_jsonschema)
    run = model.TrainingRun.model_validate(doc)
    RuntimeConfig.model_validate({"trainer": run.spec.trainer})


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda s: s["checkpoint"].__setitem__("savePeriod", 0), "savePeriod"),
        (lambda s: s["checkpoint"].__setitem__("path", "../escape"), "path"),
        (lambda s: s.__setitem__("restartPolicy", {"failureBudget": 0}), "failureBudget"),
        (lambda s: s.__setitem__("resume", {"policy": "step", "step": -1}), "step"),
        (lambda s: s["ray"]["head"].__setitem__("resources", {"requests": {"cpu": 1.5}}), "cpu"),
        (lambda s: s.__delitem__("image"), "image"),
        (lambda s: s.__setitem__("restartPolicy", {"progressDeadlineSeconds": 10**12}), "progressDeadlineSeconds"),
        (lambda s: s.__setitem__("restartPolicy", {"backoff": {"initialSeconds": 10**12}}), "initialSeconds"),
        (lambda s: s["ray"].__setitem__("workers", [{"name": "gen", "replicas": 10**6}]), "replicas"),
        (lambda s: s["ray"]["head"].__setitem__("resources", {"limits": {"memory": 2**60}}), "memory"),
    ],
)
def test_crd_schema_rejects_a_malformed_spec(
    mutate: Callable[[dict[str, Any]], None], field: str, openapi_to_jsonschema: Callable[..., Any]
) -> None:
    (doc,) = _training_runs("tiny.yaml")
    doc = copy.deepcopy(doc)
    mutate(doc["spec"])
    with pytest.raises(jsonschema.ValidationError) as caught:
        _validate(doc, openapi_to_jsonschema)
    assert field in str(caught.value)


# ------------------------------------------------------------------------------------------ pod templates


def _sync_manifests() -> Any:
    """operator/sync_manifests.py (a script, not a module of the package), loaded from its file."""
    path = REPO / "operator" / "sync_manifests.py"
    spec = importlib.util.spec_from_file_location("sync_manifests", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _groups() -> dict[str, dict[str, Any]]:
    ray = _schema()["properties"]["spec"]["properties"]["ray"]["properties"]
    return {"head": ray["head"], "worker": ray["workers"]["items"]}


@pytest.mark.parametrize("group", ["head", "worker"])
def test_the_template_schema_is_kuberays_pod_template_spec_with_the_owned_fields_rules(
    group: str, kuberay_rayjob_crd: dict[str, Any]
) -> None:
    sync = _sync_manifests()
    kuberay = sync.kuberay_pod_template(kuberay_rayjob_crd)
    ours = _groups()[group]["properties"]["template"]
    assert ours == sync.template_schema(kuberay, group), "drift: run `.venv/bin/python operator/sync_manifests.py`"
    pod, theirs = ours["properties"]["spec"], kuberay["properties"]["spec"]
    assert set(pod["properties"]) == set(theirs["properties"]), "every PodSpec field, none invented"
    assert pod["properties"]["affinity"] == theirs["properties"]["affinity"]
    assert "required" not in pod, "a fragment need not list the containers"
    assert set(ours["properties"]["metadata"]["properties"]) == {"labels", "annotations"}


def test_the_crd_fits_the_api_servers_limits_with_room_for_client_side_apply() -> None:
    """The API server stores a CRD of up to about 1.5 MB (etcd's request limit); `kubectl apply` without
    --server-side also copies the object into an annotation, and annotations are limited to 256 KiB."""
    size = len(json.dumps(_crd(), separators=(",", ":")))
    assert size < 256 * 1024, size


@pytest.mark.parametrize(
    ("fragment", "field"),
    [
        ({"spec": {"priorityClasName": "high"}}, "priorityClasName"),
        ({"spec": {"imagePullSecrets": "registry"}}, "imagePullSecrets"),
        (
            {"spec": {"containers": [{"name": "ray-head", "env": [{"name": "A", "valueFrom": {"secretRef": {}}}]}]}},
            "secretRef",
        ),
        ({"metadata": {"labels": {"team": 1}}}, "team"),
        ({"metadata": {"name": "pod"}}, "name"),
    ],
    ids=["misspelled field", "wrong type", "misspelled nested field", "label not a string", "pod name"],
)
def test_the_crd_schema_rejects_a_template_typo_naming_it(
    fragment: dict[str, Any], field: str, openapi_to_jsonschema: Callable[..., Any]
) -> None:
    (doc,) = _training_runs("tiny.yaml")
    doc["spec"]["ray"]["head"]["template"] = fragment
    with pytest.raises(jsonschema.ValidationError) as caught:
        _validate(doc, openapi_to_jsonschema)
    assert field in str(caught.value)


# ---------------------------------------------------------------------------------------------- /dev/shm


@pytest.mark.parametrize(
    ("size", "valid"), [("8Gi", True), (2**30, True), ("1.5G", True), ("8GB", False), ("-1Gi", False)]
)
def test_shm_size_is_a_quantity_of_bytes(size: Any, valid: bool, openapi_to_jsonschema: Callable[..., Any]) -> None:
    (doc,) = _training_runs("tiny.yaml")
    doc["spec"]["ray"]["head"]["shmSize"] = size
    with contextlib.nullcontext() if valid else pytest.raises(jsonschema.ValidationError, match="shmSize"):
        _validate(doc, openapi_to_jsonschema)
    with contextlib.nullcontext() if valid else pytest.raises(pydantic.ValidationError, match="shmSize"):
        model.TrainingRun.model_validate(doc)


# ------------------------------------------------------------------------- bounds: the CRD, and the model again

_BOUND_KEYS = ("pattern", "minLength", "maxLength", "maxItems", "maxProperties", "minimum", "maximum", "enum")


def _bounds(node: dict[str, Any]) -> dict[str, Any]:
    """A node's bounds, its anyOf members' included (a quantity is `int | <bounded str>` in the model)."""
    found: dict[str, Any] = {}
    for part in [node, *node.get("anyOf", [])]:
        found.update({k: part[k] for k in _BOUND_KEYS if k in part})
    return found


def _bound_mismatches(crd: dict[str, Any], mine: dict[str, Any], defs: dict[str, Any], path: str) -> list[str]:
    while "$ref" in mine or ("anyOf" in mine and {"type": "null"} in mine["anyOf"]):
        if "$ref" in mine:
            mine = defs[mine["$ref"].split("/")[-1]]
        else:
            rest = [m for m in mine["anyOf"] if m != {"type": "null"}]
            mine = rest[0] if len(rest) == 1 else {"anyOf": rest}
    problems = [
        f"{path}: {key} {value!r} in the CRD, {_bounds(mine).get(key)!r} in the model"
        for key, value in _bounds(crd).items()
        if _bounds(mine).get(key) != value
    ]
    for name, child in crd.get("properties", {}).items():
        # Dicts in the model: RuntimeConfig checks the trainer (validation.py), podtemplate.py a template.
        if name not in ("trainer", "template"):
            problems += _bound_mismatches(child, mine["properties"][name], defs, f"{path}.{name}")
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(crd.get(key), dict):  # a dict with constrained keys is patternProperties in the model's schema
            theirs = mine[key] if key in mine else next(iter(mine.get("patternProperties", {}).values()), {})
            problems += _bound_mismatches(crd[key], theirs, defs, path + suffix)
    return problems


def test_the_model_checks_every_bound_the_crd_schema_declares_on_the_spec() -> None:
    mine = model.TrainingRunSpec.model_json_schema(by_alias=True)
    assert _bound_mismatches(_schema()["properties"]["spec"], mine, mine.get("$defs", {}), "spec") == []


def _unbounded(root: dict[str, Any], at: str, *, numbers: bool) -> list[str]:
    """Every string without maxLength (an enum bounds itself), map without maxProperties and list without maxItems
    under `root`; with `numbers`, also every integer or number (an int-or-string included) without a minimum and a
    maximum; and every bound past 2**53 (the API server compares with a bound as a float64). Not the pod templates:
    KubeRay's PodTemplateSpec schema as generated (Kubernetes bounds none of its strings in the schema; the Pod
    validation does when the pods are made)."""
    found = []
    for path, node in _walk(root, at):
        if ".template" in path:
            continue
        kind, either = node.get("type"), node.get("x-kubernetes-int-or-string")
        if (kind == "string" or either) and "maxLength" not in node and "enum" not in node:
            found.append(f"{path}: a string without maxLength")
        if numbers and (kind in ("integer", "number") or either) and not {"minimum", "maximum"} <= set(node):
            found.append(f"{path}: a number without minimum and maximum")
        if any(abs(node.get(bound, 0)) > 2**53 for bound in ("minimum", "maximum")):
            found.append(f"{path}: a bound past 2**53, which the API server's float64 does not hold exactly")
        if kind == "object" and isinstance(node.get("additionalProperties"), dict) and "maxProperties" not in node:
            found.append(f"{path}: a map without maxProperties")
        if kind == "array" and "maxItems" not in node:
            found.append(f"{path}: a list without maxItems")
    return found


def test_every_number_string_map_and_list_under_spec_is_bounded_but_in_the_pod_templates() -> None:
    assert _unbounded(_schema()["properties"]["spec"], "spec", numbers=True) == []


def test_every_string_and_list_of_the_status_is_bounded_and_a_copied_message_fits_its_bound() -> None:
    """The status's numbers are the operator's and the driver's own counts (steps, attempts), bounded by the spec's."""
    status = _schema()["properties"]["status"]
    assert _unbounded(status, "status", numbers=False) == []
    messages = [status["properties"]["message"], status["properties"]["attempt"]["properties"]["message"]]
    messages.append(status["properties"]["conditions"]["items"]["properties"]["message"])
    assert [m["maxLength"] for m in messages] == [model.MESSAGE_CHARS] * 3


def test_the_bound_walk_finds_a_field_without_a_bound() -> None:
    """The walk above proves something: a new field without a bound, at any depth, fails it."""
    spec = copy.deepcopy(_schema()["properties"]["spec"])
    restart = spec["properties"]["restartPolicy"]["properties"]
    restart["newSeconds"] = {"type": "number", "minimum": 0}
    restart["backoff"]["properties"]["label"] = {"type": "string"}
    spec["properties"]["ray"]["properties"]["workers"]["items"]["properties"]["names"] = {"type": "array"}
    assert _unbounded(spec, "spec", numbers=True) == [
        "spec.ray.workers[].names: a list without maxItems",
        "spec.restartPolicy.backoff.label: a string without maxLength",
        "spec.restartPolicy.newSeconds: a number without minimum and maximum",
    ]


def test_the_ray_start_params_rules_are_the_models_patterns() -> None:
    """The CEL rules on rayStartParams (head and worker groups share them) and validation.py check the same text."""
    groups = _groups()
    rules = [r["rule"] for r in groups["head"]["properties"]["rayStartParams"]["x-kubernetes-validations"]]
    assert (
        groups["worker"]["properties"]["rayStartParams"]["x-kubernetes-validations"]
        == (groups["head"]["properties"]["rayStartParams"]["x-kubernetes-validations"])
    )
    assert f"'{model.RAY_FLAG_PATTERN}'" in rules[0] and "size(k) <= 63" in rules[0]
    assert f"'{model.RAY_VALUE_PATTERN}'" in rules[1] and "k == 'resources'" in rules[1]
    assert "'" + model.RAY_RESOURCE_CHARS.replace("'", "\\'") + "'" in rules[2]


def test_quantities_use_kubernetes_int_or_string_and_quantity_pattern() -> None:
    head = _schema()["properties"]["spec"]["properties"]["ray"]["properties"]["head"]["properties"]
    quantity = head["resources"]["properties"]["requests"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True
    assert quantity["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert quantity["pattern"] == model.QUANTITY_PATTERN
    accepted = ["2", "500m", "4Gi", "1e3", "0.5", "+1", ".5", "1E-3", "16Ki"]
    refused = ["lots", "1GB", "2 Gi", "1.5.2", "0x10", "1e", "Gi", ""]
    assert all(re.fullmatch(model.QUANTITY_PATTERN, q) for q in accepted)
    assert not any(re.fullmatch(model.QUANTITY_PATTERN, q) for q in refused)


# ------------------------------------------------------------------------------------------ status messages


def test_a_long_kuberay_message_is_cut_in_the_status_with_a_mark_and_the_status_passes_the_crd(
    openapi_to_jsonschema: Callable[..., Any],
) -> None:
    """KubeRay copies the job's message (a driver's traceback, say) unbounded; the operator cuts what it copies."""
    (doc,) = _training_runs("tiny.yaml")
    spec = model.TrainingRunSpec.model_validate(doc["spec"])
    now = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
    status: dict[str, Any] = {}

    def decide(observed: AttemptObservation | None) -> None:
        inputs = decision.Inputs("tiny", "ns", 1, spec, model.TrainingRunStatus.model_validate(status), observed, now)
        status.update(patching.apply(status, decision.decide(inputs).patch))

    job = RayJobObservation(name="tiny-a1", deployment_status="Running", job_status="RUNNING")
    head = PodObservation(name="tiny-a1-head", node_type="head", phase="Running", node_ready=True)
    decide(None)
    decide(AttemptObservation(number=1, rayjob=job, pods=(head,)))
    traceback = "Traceback (most recent call last):\n" + '  File "driver.py", line 1, in <module>\n' * 10_000
    failed = dataclasses.replace(job, deployment_status="Failed", job_status="FAILED", message=traceback)
    decide(AttemptObservation(number=1, rayjob=failed))
    assert status["phase"] == "Restarting"
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    messages = [status["message"], status["attempts"][-1]["message"], running["message"]]
    assert all(len(m) == model.MESSAGE_CHARS and m.endswith("...[truncated]") for m in messages)
    assert status["attempts"][-1]["message"].startswith("the Ray job failed: Traceback (most recent call last):")
    _validate({**doc, "status": status}, openapi_to_jsonschema)


def test_a_message_within_the_bound_is_kept_whole() -> None:
    exact = "x" * model.MESSAGE_CHARS
    assert model.AttemptRecord(number=1, message=exact).wire()["message"] == exact
    copied = model.AttemptRecord(number=1).model_copy(update={"message": exact + "y"})
    assert copied.wire()["message"] == "x" * (model.MESSAGE_CHARS - 15) + " ...[truncated]"


def test_the_rule_that_freezes_the_trainers_math_once_a_checkpoint_exists_names_exactly_the_math_fields() -> None:
    from trainingrun_runtime import config

    [rule] = [r for r in _schema()["x-kubernetes-validations"] if "oldSelf.status.checkpoints.latest" in r["rule"]]
    named = set(re.findall(r"has\(self\.spec\.trainer\.(\w+)\)", rule["rule"]))
    math = {path.removeprefix("trainer.") for path in config.MATH_FIELDS}
    assert named == {re.sub(r"_(\w)", lambda m: m.group(1).upper(), f) for f in math}
    assert rule["fieldPath"] == ".spec.trainer" and "another name" in rule["message"]


def test_every_status_schema_node_says_only_openapi_keywords_so_no_description_spilled_into_a_key() -> None:
    """A comma in a flow mapping's description (`{type: number, description: a, b}`) makes `b` a key of its own,
    which the API server refuses when the CRD is applied."""
    keywords = {
        "type", "properties", "items", "description", "nullable", "format", "maxLength", "minLength", "minimum",
        "maximum", "enum", "maxItems", "minItems", "maxProperties", "additionalProperties", "required", "pattern",
        "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-validations", "default",
    }  # fmt: skip
    for path, node in _walk(_schema()["properties"]["status"], "status"):
        assert set(node) <= keywords, f"{path}: {sorted(set(node) - keywords)}"
        assert all(re.fullmatch(r"[a-z][A-Za-z0-9]*", name) for name in node.get("properties", {})), path
