"""Which queue a run's labels name, and the shipped admission policy checking what `queueing.problem` checks."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from trainingrun_operator.core import queueing

RENDERED = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "deploy" / "trainingrun-operator.yaml"


def test_the_queue_comes_from_the_queue_name_label_and_an_empty_one_is_none() -> None:
    labels = {queueing.QUEUE_LABEL: "team-a", queueing.PRIORITY_CLASS_LABEL: "high", "app": "x"}
    assert queueing.queue_of(labels) == queueing.Queue("team-a", "high")
    assert queueing.queue_of({queueing.QUEUE_LABEL: "team-a"}) == queueing.Queue("team-a")
    assert queueing.queue_of({queueing.QUEUE_LABEL: ""}) is None, "Kueue treats an empty queue name as none"
    assert queueing.queue_of({queueing.PRIORITY_CLASS_LABEL: "high"}) is None
    assert queueing.queue_of(None) is None


def test_a_queued_rayjob_carries_the_queue_and_the_priority_class_labels() -> None:
    assert queueing.rayjob_labels(queueing.Queue("team-a", "high")) == {
        queueing.QUEUE_LABEL: "team-a",
        queueing.PRIORITY_CLASS_LABEL: "high",
    }
    assert queueing.rayjob_labels(queueing.Queue("team-a")) == {queueing.QUEUE_LABEL: "team-a"}
    assert queueing.rayjob_labels(None) == {}


def test_the_shipped_admission_policy_checks_the_same_limits_as_the_operator() -> None:
    docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(RENDERED.read_text()) if d]
    (policy,) = [
        d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-kueue")
    ]
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    spec = policy["spec"]
    text = " ".join(str(e["expression"]) for e in [*spec["variables"], *spec["validations"]])
    assert f"size(object.spec.ray.workers) <= {queueing.MAX_WORKER_GROUPS}" in text
    assert f"w.name != '{queueing.RESERVED_GROUP}'" in text
    assert queueing.QUEUE_LABEL in text and queueing.PRIORITY_CLASS_LABEL in text
    assert [r["resources"] for r in spec["matchConstraints"]["resourceRules"]] == [["trainingruns"]], (
        "never the status subresource: the operator's and the driver's status writes are not checked"
    )
