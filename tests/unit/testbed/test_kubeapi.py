"""Reading what the API server answers (hack/testbed/kubeapi.py): an object's status condition. The client
itself is exercised against a real API server in tests/integration/test_controlplane.py."""

from __future__ import annotations

import kubeapi


def test_condition_finds_the_condition_of_that_type_as_a_copy() -> None:
    ready = {"type": "Ready", "status": "True"}
    pod = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}, ready]}}
    found = kubeapi.condition(pod, "Ready")
    assert found == ready and found is not ready


def test_condition_is_none_for_no_object_no_status_or_no_such_condition() -> None:
    assert kubeapi.condition(None, "Ready") is None
    assert kubeapi.condition({}, "Ready") is None
    assert kubeapi.condition({"status": {"conditions": None}}, "Ready") is None
    assert kubeapi.condition({"status": {"conditions": [{"type": "Ready"}]}}, "DisruptionTarget") is None
