"""The pod status the pod runner reports, as a kubelet would: strategic-merge patch bodies for `pods/status`.
Pure: they are built here and sent by `podrunner.PodRunner._patch`.

    running(pod, ready=False)   Ready=False while Ray starts (the container Running, not ready)
    running(pod, ready=True)    Ready=True once Ray answers (as after a readiness probe)
    terminated(...)             the container's termination: phase Failed/Succeeded under restartPolicy Never,
                                or, with `waiting`, CrashLoopBackOff before a restart
    container(...)              a container the pod runner runs with podman (containerpods.py): its whole status
                                (state, lastState, restartCount, image and container ids), the pod's readiness
                                and, once the container runs, the pod's IP (its address on podman's bridge)

`containerStatuses` is an atomic list (no merge key): each patch carries the container's whole status.
"""

from __future__ import annotations

from typing import Any

from localpod import LocalPod

PATCH_CONTENT_TYPE = "application/strategic-merge-patch+json"


def _readiness(ready: bool, when: str, reason: str | None) -> list[dict[str, Any]]:
    return [
        {"type": kind, "status": str(ready), "lastTransitionTime": when, "reason": reason}
        for kind in ("Ready", "ContainersReady")
    ]


def running(pod: LocalPod, *, ready: bool, when: str) -> dict[str, Any]:
    """The container running since `pod.started_at`, ready or not."""
    return {
        "status": {
            "conditions": _readiness(ready, when, None if ready else "ContainersNotReady"),
            "containerStatuses": [
                {
                    "name": pod.container,
                    "ready": ready,
                    "started": True,
                    "restartCount": pod.restarts,
                    "state": {"running": {"startedAt": pod.started_at}},
                }
            ],
        }
    }


def terminated(
    pod: LocalPod,
    *,
    exit_code: int,
    reason: str,
    when: str,
    message: str = "",
    phase: str | None = "Failed",
    waiting: bool = False,
) -> dict[str, Any]:
    """The container terminated with `exit_code`; `phase` set unless None; with `waiting`, the termination is the
    last state and the container waits in CrashLoopBackOff."""
    record = {
        "exitCode": exit_code,
        "reason": reason,
        "message": message or None,
        "startedAt": pod.started_at or when,
        "finishedAt": when,
    }
    state: dict[str, Any] = (
        {"state": {"waiting": {"reason": "CrashLoopBackOff"}, "running": None}, "lastState": {"terminated": record}}
        if waiting
        else {"state": {"terminated": record, "running": None}}
    )
    status: dict[str, Any] = {
        "conditions": _readiness(False, when, "PodCompleted" if phase else "ContainersNotReady"),
        "containerStatuses": [
            {"name": pod.container, "ready": False, "started": False, "restartCount": pod.restarts, **state}
        ],
    }
    if phase:
        status["phase"] = phase
    return {"status": status}


def container(
    *,
    name: str,
    image: str,
    image_id: str,
    container_id: str,
    restarts: int,
    ready: bool,
    state: dict[str, Any],
    last_terminated: dict[str, Any] | None,
    when: str,
    pod_ip: str | None = None,
) -> dict[str, Any]:
    """One container's whole status (`state`: {"running": ...}, {"waiting": ...} or {"terminated": ...}; the
    previous instance's termination as `lastState`), and the pod Ready when it is; with `pod_ip`, the pod's IP
    (podIP, and podIPs replaced by it: a strategic merge would add it to kwok's placeholder)."""
    status = {
        "name": name,
        "image": image,
        "imageID": image_id,
        "containerID": container_id or None,
        "ready": ready,
        "started": "running" in state,
        "restartCount": restarts,
        "state": state,
        "lastState": {"terminated": _present(last_terminated)} if last_terminated else {},
    }
    body: dict[str, Any] = {
        "status": {
            "conditions": _readiness(ready, when, None if ready else "ContainersNotReady"),
            "containerStatuses": [_present(status)],
        }
    }
    if pod_ip:
        body["status"]["podIP"] = pod_ip
        body["status"]["podIPs"] = [{"$patch": "replace"}, {"ip": pod_ip}]
    return body


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """Without the fields that have no value (a null in a patch would be a deletion directive)."""
    return {k: v for k, v in fields.items() if v is not None}
