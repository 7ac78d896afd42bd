"""What is wrong with a TrainingRun, field by field: every field at once for a person, the first one for the
operator's Failed condition (in pydantic's words, as before), and spec.trainer checked by the runtime's own
RuntimeConfig in both."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import pathlib
from typing import Any

import pytest
import yaml

from trainingrun_operator.core import decision, model, patching, restarts, validation, watchdog
from trainingrun_operator.core.observation import AttemptObservation, PodObservation, RayJobObservation
from trainingrun_runtime import timestamps

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "examples" / "tiny.yaml"


def tiny(**spec: Any) -> dict[str, Any]:
    """tiny.yaml with spec fields replaced; a value that is a dict is merged one level deep."""
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(doc["spec"].get(key), dict):
            doc["spec"][key] = {**doc["spec"][key], **value}
        else:
            doc["spec"][key] = value
    return dict(doc)


def explained(doc: dict[str, Any]) -> list[str]:
    return [f"{p.path}: {p.explained}" for p in validation.run_problems(doc)]


def test_the_shipped_example_has_no_problem() -> None:
    assert validation.run_problems(tiny()) == []


def test_problems_of_the_model_and_of_the_trainer_come_together() -> None:
    doc = tiny(checkpoint={"savePeriod": 0}, trainer={"steps": -5, "grpo": {"groupSize": 0}})
    assert sorted(explained(doc)) == [
        "spec.checkpoint.savePeriod: must be >= 1 (got 0)",
        "spec.trainer.grpo.groupSize: must be >= 2 (got 0)",
        "spec.trainer.steps: must be >= 1 (got -5)",
    ]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"trainer": {"grpo": {"lr": 0}}}, "spec.trainer.grpo.lr: must be > 0.0 (got 0)"),
        ({"trainer": {"task": {"digits": 99}}}, "spec.trainer.task.digits: must be <= 64 (got 99)"),
        (
            {"trainer": {"task": {"kind": "sort"}}},
            "spec.trainer.task.kind: must be one of 'reverse', 'copy' or 'increment' (got \"sort\")",
        ),
        (
            {"imagePullPolicy": "Sometimes"},
            "spec.imagePullPolicy: must be one of 'Always', 'IfNotPresent' or 'Never' (got \"Sometimes\")",
        ),
        (
            {"trainer": {"seed": "zero"}},
            'spec.trainer.seed: must be a valid integer, unable to parse string as an integer (got "zero")',
        ),
        ({"checkpoint": {"pvc": {}}}, "spec.checkpoint.pvc.claimName: required, but missing"),
        (
            {"trainer": {"model": {"dModel": 30, "nHeads": 4}}},
            "spec.trainer.model: n_heads (4) must divide d_model (30)",
        ),
        ({"trainer": {"grpo": {"lrr": 0.1}}}, "spec.trainer.grpo.lrr: unknown field (did you mean lr?)"),
        (
            {"checkpoint": {"retention": {"keepLast": 3, "x": 1}}},
            "spec.checkpoint.retention.x: unknown field; allowed here: keepLast, keepEvery",
        ),
        ({"trainer": "steps: 10"}, 'spec.trainer: must be a valid dictionary (got "steps: 10")'),
    ],
)
def test_each_problem_says_what_is_allowed_and_what_was_given(spec: dict[str, Any], expected: str) -> None:
    assert explained(tiny(**spec)) == [expected]


def test_the_operator_still_reports_the_first_problem_in_pydantics_words() -> None:
    doc = tiny(trainer={"steps": -5, "grpo": {"groupSize": 0}})
    spec = model.TrainingRunSpec.model_validate(doc["spec"])
    assert validation.spec_problem(spec) == "spec.trainer.grpo.groupSize: Input should be greater than or equal to 2"
    assert validation.spec_problem(model.TrainingRunSpec.model_validate(tiny()["spec"])) is None


# ------------------------------------------------------------------------------------------ placement


def head(**group: Any) -> dict[str, Any]:
    """tiny.yaml with its head group replaced by `group`."""
    doc = tiny()
    doc["spec"]["ray"]["head"] = group
    return doc


@pytest.mark.parametrize(
    ("resources", "field", "says"),
    [
        ({"limits": {"cpu": "2 cores"}}, "spec.ray.head.resources.limits.cpu", "must be a Kubernetes quantity"),
        ({"requests": {"memory": "4GB"}}, "spec.ray.head.resources.requests.memory", "must be a Kubernetes quantity"),
        ({"requests": {"memory": 1.5}}, "spec.ray.head.resources.requests.memory", "(got 1.5)"),
        ({"limits": {"cpus": 2}}, "spec.ray.head.resources.limits.cpus.[key]", "a container resource is cpu, memory"),
    ],
)
def test_a_quantity_or_resource_name_kubernetes_would_refuse_is_one_problem_in_the_crds_words(
    resources: dict[str, Any], field: str, says: str
) -> None:
    (problem,) = validation.run_problems(head(resources=resources))
    assert problem.path == field and says in problem.explained


@pytest.mark.parametrize(
    ("group", "field", "says"),
    [
        ({"rayStartParams": {"num-cpus": "2"}}, "spec.ray.head.rayStartParams.num-cpus", "gets 2 logical CPUs"),
        ({"resources": {"limits": {"cpu": "2"}}}, "spec.ray.head.resources.limits.cpu", "gets 2 logical CPUs"),
        (
            {"resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "4Gi"}}},
            "spec.ray.head.resources.requests.cpu",
            "gets 1 logical CPU from",
        ),
        ({"resources": {"limits": {"cpu": 0}, "requests": {"cpu": 1}}}, "spec.ray.head.resources.requests.cpu", "1"),
        ({"rayStartParams": {"num-cpus": "many"}}, "spec.ray.head.rayStartParams.num-cpus", "whole number"),
    ],
    ids=["num-cpus", "from the CPU limit", "from the CPU request, rounded up", "a zero limit", "not a number"],
)
def test_a_head_that_cannot_host_the_run_state_is_a_problem_naming_the_field_and_the_fix(
    group: dict[str, Any], field: str, says: str
) -> None:
    (problem,) = validation.run_problems(head(**group))
    assert problem.path == field and says in problem.explained
    if "logical CPU" in says:
        assert 'set spec.ray.head.rayStartParams.num-cpus to "3" or more' in problem.explained
    spec = model.TrainingRunSpec.model_validate(head(**group)["spec"])
    assert validation.spec_problem(spec) == str(problem), "the operator fails the run with the same words"


@pytest.mark.parametrize(
    "group",
    [
        {"rayStartParams": {"num-cpus": "3"}, "resources": {"limits": {"cpu": "1"}}},
        {"resources": {"limits": {"cpu": "2500m"}}},
        {"resources": {"limits": {"cpu": 4}}},
        {"resources": {"requests": {"cpu": "3"}}},
        {"resources": {"limits": {"memory": "4Gi"}}},
        {},
    ],
    ids=["num-cpus wins over the limit", "2.5 rounds up to 3", "an integer", "the request", "no CPU given", "nothing"],
)
def test_a_head_with_three_logical_cpus_or_an_unknown_count_can_host_the_run_state(group: dict[str, Any]) -> None:
    assert validation.run_problems(head(**group)) == []


@pytest.mark.parametrize(
    "resources",
    ["{spot: 1}", '{"spot": "one"}', '["spot"]', '{"spot": true}'],
    ids=["not JSON", "a string value", "not an object", "a boolean"],
)
def test_a_worker_group_resources_value_that_kuberay_cannot_read_is_a_problem_naming_the_group(resources: str) -> None:
    doc = tiny()
    doc["spec"]["ray"]["workers"] = [
        {"name": "ok", "rayStartParams": {"resources": "'{\"spot\": 1}'"}},
        {"name": "gen", "rayStartParams": {"resources": resources}},
    ]
    (problem,) = validation.run_problems(doc)
    assert problem.path == "spec.ray.workers.1.rayStartParams.resources"
    assert "JSON object of numbers" in problem.explained and "worker group gen" in problem.explained


def test_the_local_backend_runs_generation_beside_the_driver_whatever_the_worker_groups() -> None:
    doc = tiny()
    doc["spec"]["ray"]["workers"] = [{"name": "gen", "replicas": 2}]
    spec = model.TrainingRunSpec.model_validate(doc["spec"])
    assert validation.runtime_config(spec).generation.on_worker_groups
    assert not validation.runtime_config(spec, local=True).generation.on_worker_groups


def test_more_trainer_ranks_than_trainer_pods_is_a_problem_naming_trainer_workers_and_local_mode_keeps_them_home() -> (
    None
):
    doc = tiny()
    doc["spec"]["trainer"]["trainerWorkers"] = 3
    doc["spec"]["ray"]["workers"] = [{"name": "train", "replicas": 2, "role": "trainer"}]
    (problem,) = validation.run_problems(doc)
    assert problem.path == "spec.trainer.trainerWorkers"
    assert "3 trainer ranks" in problem.explained and "they have 2" in problem.explained
    doc["spec"]["trainer"]["trainerWorkers"] = 2
    assert validation.run_problems(doc) == []
    spec = model.TrainingRunSpec.model_validate(doc["spec"])
    assert validation.runtime_config(spec).trainers.on_worker_groups
    assert not validation.runtime_config(spec, local=True).trainers.on_worker_groups


# ------------------------------------------------------------------------------------------ bounds


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"restartPolicy": {"progressDeadlineSeconds": 10**12}}, "spec.restartPolicy.progressDeadlineSeconds"),
        ({"restartPolicy": {"backoff": {"initialSeconds": 10**12}}}, "spec.restartPolicy.backoff.initialSeconds"),
        ({"restartPolicy": {"backoff": {"maxSeconds": float("inf")}}}, "spec.restartPolicy.backoff.maxSeconds"),
        ({"restartPolicy": {"startupDeadlineSeconds": float("nan")}}, "spec.restartPolicy.startupDeadlineSeconds"),
        ({"ray": {"head": {}, "workers": [{"name": "gen", "replicas": 10**6}]}}, "spec.ray.workers.0.replicas"),
        ({"trainer": {"steps": 10**12}}, "spec.trainer.steps"),
        ({"checkpoint": {"pvc": {"claimName": "c"}, "savePeriod": 10**12}}, "spec.checkpoint.savePeriod"),
    ],
    ids=["a deadline", "a backoff", "an infinite cap", "not a number", "a million replicas", "steps", "savePeriod"],
)
def test_a_number_past_its_generous_bound_is_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    (problem,) = validation.run_problems(tiny(**spec))
    assert problem.path == field and problem.explained.startswith("must be <= ")


def test_the_bounds_are_the_ones_a_user_would_call_generous() -> None:
    doc = tiny(
        restartPolicy={"progressDeadlineSeconds": 30 * 24 * 3600, "backoff": {"maxSeconds": 30 * 24 * 3600}},
        ray={"head": {"rayStartParams": {"num-cpus": "8"}}, "workers": [{"name": "gen", "replicas": 1000}]},
        trainer={"steps": 10**9},
    )
    assert validation.run_problems(doc) == []


def _pass(spec: model.TrainingRunSpec, status: dict[str, Any], observed: Any, now: datetime.datetime) -> Any:
    """One decision over `status`, which it updates as the API server would apply the patch."""
    result = decision.decide(
        decision.Inputs(
            run="tiny",
            namespace="ns",
            generation=1,
            spec=spec,
            status=model.TrainingRunStatus.model_validate(status),
            observed=observed,
            now=now,
        )
    )
    status.update(patching.apply(status, result.patch))
    return result


def test_the_largest_deadlines_backoff_and_budgets_go_through_the_decision_without_overflow() -> None:
    """Every duration at MAX_SECONDS, the factor and the budgets at theirs: the backoff, the next attempt's time and
    the watchdog's deadlines are computed on every pass, and must neither overflow nor exceed 30 days."""
    longest, budget = model.MAX_SECONDS, model.MAX_BUDGET
    durations = ("workerReplacementSeconds", "nodeNotReadySeconds", "progressDeadlineSeconds", "startupDeadlineSeconds")
    doc = tiny(
        restartPolicy={
            **dict.fromkeys(durations, longest),
            "failureBudget": budget,
            "preemptionBudget": budget,
            "backoff": {"initialSeconds": longest, "maxSeconds": longest, "factor": 100},
        }
    )
    spec = model.TrainingRunSpec.model_validate(doc["spec"])
    assert validation.spec_problem(spec) is None
    now = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
    job = RayJobObservation(name="tiny-a1", deployment_status="Running", job_status="RUNNING")
    head = PodObservation(name="tiny-a1-head", node_type="head", phase="Running", node_ready=True)
    status: dict[str, Any] = {}
    _pass(spec, status, None, now)
    running = _pass(spec, status, AttemptObservation(number=1, rayjob=job, pods=(head,)), now)
    assert status["phase"] == "Running" and running.requeue_after == longest, "the watchdog's start-up deadline"
    failed = dataclasses.replace(job, deployment_status="Failed", job_status="FAILED", reason="AppFailed")
    _pass(spec, status, AttemptObservation(number=1, rayjob=failed), now + datetime.timedelta(seconds=longest))
    assert status["phase"] == "Restarting"
    assert timestamps.parse(status["nextAttemptTime"]) == now + datetime.timedelta(seconds=2 * longest)
    assert restarts.backoff_seconds(spec.restart_policy.backoff, budget) == longest
    attempt = model.AttemptRecord(number=1, running_since="2025-01-01T00:00:00Z")
    report = model.RuntimeReport(attempt=1, step=1, updated="2025-01-01T00:00:00Z")
    watch = watchdog.watch(spec.restart_policy, attempt, report)
    assert watch is not None and watch.left(now) == longest


# ------------------------------------------------------------------------------------------ rayStartParams


@pytest.mark.parametrize(
    ("params", "field", "says"),
    [
        ({"num-cpus; rm -rf /": "8"}, "spec.ray.head.rayStartParams.num-cpus; rm -rf /", "not a ray start flag name"),
        ({"num-cpus": "8", "Num_CPUs": "8"}, "spec.ray.head.rayStartParams.Num_CPUs", "not a ray start flag name"),
        ({"num-cpus": "1 && curl x"}, "spec.ray.head.rayStartParams.num-cpus", "shell command line unquoted"),
        ({"num-cpus": "8", "temp-dir": "/tmp/$(id)"}, "spec.ray.head.rayStartParams.temp-dir", "no space, quote"),
        ({"num-cpus": "8", "node-name": "a\nb"}, "spec.ray.head.rayStartParams.node-name", "shell metacharacter"),
    ],
    ids=["a command in a key", "a key not a flag", "a command in a value", "a substitution", "a newline"],
)
def test_a_ray_start_param_the_shell_would_read_is_refused_naming_the_field_and_the_fix(
    params: dict[str, str], field: str, says: str
) -> None:
    (problem,) = validation.run_problems(head(rayStartParams=params))
    assert problem.path == field and says in problem.explained
    spec = model.TrainingRunSpec.model_validate(head(rayStartParams=params)["spec"])
    assert validation.spec_problem(spec) == str(problem), "the operator fails the run before any RayJob"


@pytest.mark.parametrize(
    ("resources", "says"),
    [
        ("'{\"spot\": 1}'; curl x", "a character the shell would read"),
        ("'{\"a b\": 1}'", 'resource name "a b"'),
        ("'{\"$(id)\": 1}'", "a character the shell would read"),
        ("'{\"\\u0024x\": 1}'", "a character the shell would read"),
        ("'{\"spot\": -1}'", "resource spot: the amount must be a number from 0"),
        ("'{\"spot\": NaN}'", "resource spot: the amount must be a number from 0"),
        ("'{\"spot\": 1e300}'", "resource spot: the amount must be a number from 0"),
    ],
    ids=["a command after it", "a space in a name", "a substitution", "an escape", "negative", "NaN", "huge"],
)
def test_a_resources_value_is_checked_as_json_of_safe_names_and_amounts_on_the_head_and_the_workers(
    resources: str, says: str
) -> None:
    for where, group in (("spec.ray.head", "the head"), ("spec.ray.workers.0", "worker group gen")):
        doc = head(rayStartParams={"num-cpus": "8"})
        params = {"resources": resources}
        if where == "spec.ray.head":
            doc["spec"]["ray"]["head"]["rayStartParams"] |= params
        else:
            doc["spec"]["ray"]["workers"] = [{"name": "gen", "rayStartParams": params}]
        (problem,) = validation.run_problems(doc)
        assert problem.path == f"{where}.rayStartParams.resources"
        assert says in problem.explained and group in problem.explained
        assert "single-quoted, e.g. '{\"my_resource\": 1}'" in problem.explained


@pytest.mark.parametrize(
    "params",
    [
        {"num-cpus": "8", "object-store-memory": "100000000", "dashboard-host": "0.0.0.0", "block": "true"},
        {"num-cpus": "8", "temp-dir": "/tmp/ray", "labels": "zone=a,tier=gpu", "node-ip-address": "10.0.0.1"},
        {"num-cpus": "8", "resources": '\'{"spot": 1, "accelerator_type:A100": 0.5}\''},
        {"num-cpus": "8", "resources": '{"spot":1}'},
    ],
    ids=["numbers and an address", "a path and labels", "quoted resources", "unquoted resources"],
)
def test_ray_start_params_of_plain_flags_and_values_pass(params: dict[str, str]) -> None:
    assert validation.run_problems(head(rayStartParams=params)) == []


@pytest.mark.parametrize("example", ["tiny.yaml", "cluster.yaml"])
def test_the_shipped_examples_have_no_problem(example: str) -> None:
    (doc,) = [d for d in yaml.safe_load_all((EXAMPLE.parent / example).read_text()) if d and d["kind"] == "TrainingRun"]
    assert validation.run_problems(doc) == []
