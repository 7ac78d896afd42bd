"""The status the pod runner reports for a container it runs with podman (hack/testbed/podstatus.py `container`):
the whole container status in each patch (containerStatuses is an atomic list), and the pod's readiness."""

from __future__ import annotations

from typing import Any

import podstatus

WAITING = {"waiting": {"reason": "ErrImageNeverPull"}}


def patch(**given: Any) -> dict[str, Any]:
    """podstatus.container for a container named operator that never ran, with `given` instead."""
    fields: dict[str, Any] = {
        "name": "operator", "image": "i", "image_id": "", "container_id": "", "restarts": 0, "ready": False,
        "state": WAITING, "last_terminated": None, "when": "t",
    }  # fmt: skip
    return podstatus.container(**{**fields, **given})


def test_a_restarted_container_reports_its_count_the_last_termination_and_runs_ready() -> None:
    last = {"exitCode": 137, "reason": "Error", "startedAt": "t0", "finishedAt": "t1", "containerID": None}
    body = patch(
        image="localhost/trainingrun-operator:dev", image_id="sha256:abc", container_id="podman://123", restarts=1,
        ready=True, state={"running": {"startedAt": "t2"}}, last_terminated=last, when="t2",
    )  # fmt: skip
    (status,) = body["status"]["containerStatuses"]
    assert status["restartCount"] == 1 and status["ready"] and status["started"]
    assert status["lastState"] == {"terminated": {k: v for k, v in last.items() if v is not None}}
    assert {c["type"]: c["status"] for c in body["status"]["conditions"]} == {
        "Ready": "True",
        "ContainersReady": "True",
    }


def test_a_container_not_yet_running_has_no_id_and_the_pod_is_not_ready() -> None:
    body = patch()
    (status,) = body["status"]["containerStatuses"]
    assert "containerID" not in status and status["lastState"] == {} and not status["started"]
    assert {c["type"]: c["status"] for c in body["status"]["conditions"]} == {
        "Ready": "False",
        "ContainersReady": "False",
    }


def test_a_running_container_reports_its_bridge_address_as_the_pods_ip_replacing_kwoks_placeholder() -> None:
    body = patch(
        image_id="sha256:abc", container_id="podman://123", state={"running": {"startedAt": "t"}}, pod_ip="10.88.0.7"
    )
    assert body["status"]["podIP"] == "10.88.0.7"
    assert body["status"]["podIPs"] == [{"$patch": "replace"}, {"ip": "10.88.0.7"}]  # not merged with kwok's


def test_without_an_ip_the_patch_leaves_the_pods_ip_alone() -> None:
    body = patch()
    assert "podIP" not in body["status"] and "podIPs" not in body["status"]
