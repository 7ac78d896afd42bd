"""What the operator observed about an attempt: frozen records built from raw Kubernetes objects (or, in local
mode, from a driver process). Pure: the kopf handlers and the local backend build these; `classification.py`
and `decision.py` read them.

Only the facts the decision needs are kept: KubeRay's view of the RayJob, and for every pod of the attempt
its phase, disruption condition, node health (and since when), the Ray container's termination and waiting reasons.

What is the run's is decided by owner references, never by the run's label alone (anyone who may create a pod
can write the label): a RayJob is the run's if it names the TrainingRun's uid as an owner (`run_rayjobs`); a pod
if its controller is the Ray cluster of one of those RayJobs (`of_run`).
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any

from trainingrun_operator.core import model, naming
from trainingrun_runtime import timestamps

__all__ = [
    "EVICTION_REASONS",
    "RAY_API_VERSION",
    "AttemptObservation",
    "Owner",
    "PodObservation",
    "RayJobObservation",
    "controller_of",
    "disrupted",
    "exit_code_from_message",
    "node_ready",
    "node_ready_changed",
    "of_run",
    "owned_by_run",
    "pod_observation",
    "rayjob_observation",
    "run_rayjobs",
]

EVICTION_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "Terminated", "NodeShutdown"})
"""pod.status.reason values that mean the platform, not the program, ended the pod."""

RAY_API_VERSION = "ray.io/v1"
"""The apiVersion of KubeRay's RayJob and RayCluster, as their owner references name them."""

DEFAULT_GRACE_SECONDS = 30.0
"""A pod's termination grace period when its spec does not say (the API server's default)."""
_EXIT_CODE = re.compile(r"exit code (-?\d+)")


@dataclasses.dataclass(frozen=True)
class Owner:
    """An object's controlling owner: its ownerReference with `controller: true`."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclasses.dataclass(frozen=True)
class RayJobObservation:
    """KubeRay's status of the attempt's RayJob."""

    name: str
    deployment_status: str = ""  # New, Initializing, Running, Complete, Failed, Suspending, Suspended, ...
    job_status: str = ""  # PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED
    reason: str = ""  # SubmissionFailed, DeadlineExceeded, AppFailed, ValidationFailed, ...
    message: str = ""
    suspend: bool = False  # spec.suspend: set by a queue (Kueue) when we never ask for it
    deleting: bool = False


@dataclasses.dataclass(frozen=True)
class PodObservation:
    """One pod of the attempt's Ray cluster."""

    name: str
    node_type: str  # "head" or "worker" (label ray.io/node-type)
    phase: str = "Pending"
    deleting: bool = False
    reason: str = ""  # pod.status.reason: Evicted, Preempting, NodeLost, ...
    disruption: str = (
        ""  # reason of a True DisruptionTarget condition: PreemptionByScheduler, EvictionByEvictionAPI, ...
    )
    deletion_deadline: datetime.datetime | None = None  # a deleted pod's deletionTimestamp: its grace period's end
    disruption_since: datetime.datetime | None = None  # the True DisruptionTarget condition's lastTransitionTime
    grace_seconds: float = DEFAULT_GRACE_SECONDS  # spec.terminationGracePeriodSeconds
    node_name: str = ""
    node_ready: bool | None = None  # None: not scheduled or not known
    node_ready_changed: datetime.datetime | None = None  # the node's Ready condition's lastTransitionTime
    node_gone: bool = False
    exit_code: int | None = None  # the Ray container's last termination
    termination_reason: str = ""  # OOMKilled, Error, ...
    waiting_reason: str = ""  # ImagePullBackOff, ErrImagePull, InvalidImageName, CreateContainerConfigError, ...
    owner: Owner | None = None  # the pod's controller (KubeRay's: the RayCluster); who it belongs to (`of_run`)

    @property
    def is_head(self) -> bool:
        return self.node_type == "head"


@dataclasses.dataclass(frozen=True)
class AttemptObservation:
    """Everything observed about the current attempt, plus leftovers of earlier attempts."""

    number: int
    backend: str = "kuberay"  # "kuberay" or "local" (a local driver process has no RayJob)
    rayjob: RayJobObservation | None = None
    pods: tuple[PodObservation, ...] = ()
    other_rayjobs: tuple[str, ...] = ()  # this run's RayJobs of other attempts (to delete)
    other_pods: int = 0  # this run's pods of other attempts (a new attempt waits until 0)
    departed: tuple[PodObservation, ...] = ()  # pods of this attempt last seen disrupted, now gone (watch memory)
    exit_code: int | None = None  # the driver's exit code, when known (local mode; parsed from KubeRay's message)
    progress_step: int | None = None  # newest training step seen, when known beyond status.runtime
    stderr_tail: str = ""

    @property
    def head(self) -> PodObservation | None:
        return next((p for p in self.pods if p.is_head), None)


def exit_code_from_message(message: str) -> int | None:
    """The driver's exit code from Ray's job message ('Job entrypoint command failed with exit code 3, ...')."""
    found = _EXIT_CODE.search(message)
    return int(found.group(1)) if found else None


def rayjob_observation(obj: Mapping[str, Any]) -> RayJobObservation:
    """Build a RayJobObservation from a raw RayJob object."""
    meta = obj.get("metadata", {})
    status = obj.get("status") or {}
    return RayJobObservation(
        name=str(meta.get("name", "")),
        deployment_status=str(status.get("jobDeploymentStatus") or ""),
        job_status=str(status.get("jobStatus") or ""),
        reason=str(status.get("reason") or ""),
        message=str(status.get("message") or ""),
        suspend=bool((obj.get("spec") or {}).get("suspend", False)),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _true_condition(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    """The condition of type `kind` whose status is True, if there is one."""
    return next((c for c in conditions if c.get("type") == kind and c.get("status") == "True"), None)


def _grace_seconds(value: Any) -> float:
    """spec.terminationGracePeriodSeconds (the API server defaults it to 30)."""
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        else DEFAULT_GRACE_SECONDS
    )


def node_ready(node: Mapping[str, Any] | None) -> bool | None:
    """True/False from a node's Ready condition; None when there is no node object."""
    if node is None:
        return None
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return None


def _time(value: Any) -> datetime.datetime | None:
    """A Kubernetes timestamp, None when absent or unreadable."""
    if not value:
        return None
    try:
        return timestamps.parse(str(value))
    except ValueError:
        return None


def node_ready_changed(node: Mapping[str, Any] | None) -> datetime.datetime | None:
    """When a node's Ready condition last changed (its lastTransitionTime); None when absent or unreadable."""
    for cond in ((node or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return _time(cond.get("lastTransitionTime"))
    return None


def pod_observation(pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]] | None) -> PodObservation:
    """Build a PodObservation from a raw pod and the nodes known by name (a missing node is `node_gone`).

    `nodes=None`: node health unknown (a watch event seen without looking nodes up).
    """
    meta = pod.get("metadata", {})
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    node_name = str(spec.get("nodeName") or "")
    node = nodes.get(node_name) if node_name and nodes is not None else None
    exit_code: int | None = None
    termination_reason = ""
    waiting_reason = ""
    disruption = _true_condition(status.get("conditions") or [], "DisruptionTarget")
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        last = cs.get("lastState") or {}
        terminated = state.get("terminated") or last.get("terminated")
        if terminated:
            exit_code = int(terminated.get("exitCode", 0))
            termination_reason = str(terminated.get("reason") or "")
        waiting = state.get("waiting")
        if waiting:
            waiting_reason = str(waiting.get("reason") or "")
    return PodObservation(
        name=str(meta.get("name", "")),
        node_type=str((meta.get("labels") or {}).get("ray.io/node-type", "")),
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_deadline=_time(meta.get("deletionTimestamp")),
        reason=str(status.get("reason") or ""),
        disruption=str(disruption.get("reason") or "DisruptionTarget") if disruption else "",
        disruption_since=_time(disruption.get("lastTransitionTime")) if disruption else None,
        grace_seconds=_grace_seconds(spec.get("terminationGracePeriodSeconds")),
        node_name=node_name,
        node_ready=node_ready(node),
        node_ready_changed=node_ready_changed(node),
        node_gone=bool(node_name) and nodes is not None and node is None,
        exit_code=exit_code,
        termination_reason=termination_reason,
        waiting_reason=waiting_reason,
        owner=controller_of(pod),
    )


def disrupted(pod: PodObservation) -> bool:
    """The pod shows a platform-side cause of its end (DisruptionTarget, Evicted, Preempting, ...)."""
    return bool(pod.disruption) or pod.reason in EVICTION_REASONS


# ----------------------------------------------------------------------------------- what is the run's


def _owner_references(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [ref for ref in refs if isinstance(ref, Mapping)]


def controller_of(obj: Mapping[str, Any]) -> Owner | None:
    """The object's controlling owner reference (`controller: true`), None if it has none."""
    for ref in _owner_references(obj):
        if ref.get("controller") is True:
            fields = (str(ref.get(key) or "") for key in ("apiVersion", "kind", "name", "uid"))
            return Owner(*fields)
    return None


def owned_by_run(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether an owner reference of `obj` names the TrainingRun whose uid is `uid` (its kind and apiVersion too)."""
    return bool(uid) and any(
        ref.get("uid") == uid and ref.get("kind") == model.KIND and ref.get("apiVersion") == model.API_VERSION
        for ref in _owner_references(obj)
    )


def run_rayjobs(jobs: Iterable[Mapping[str, Any]], uid: str | None) -> list[dict[str, Any]]:
    """The RayJobs among `jobs` that the TrainingRun `uid` owns; one with the run's label and another owner (or
    none) is not the run's: never observed, never deleted."""
    return [dict(job) for job in jobs if owned_by_run(job, uid)]


def of_run(owner: Owner | None, run: str, attempt: str, jobs: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether a pod whose controller is `owner` and whose attempt label is `attempt` is a pod of that attempt of
    `run`. `jobs`: the run's own RayJobs by name (`run_rayjobs`).

    Its controller must be the Ray cluster of the attempt's RayJob: the RayCluster that RayJob names in
    status.rayClusterName (KubeRay's pods), or the RayJob itself, by uid. Once that RayJob is gone (deleted, its
    cluster's pods still going) its name must do: a RayCluster `<rayjob>-<suffix>` (how KubeRay names a RayJob's
    cluster) or the RayJob `<rayjob>`. A reference to an object that does not exist does not last: the garbage
    collector deletes a pod whose owner is gone.
    """
    if owner is None or owner.api_version != RAY_API_VERSION or not attempt.isdigit():
        return False
    name = naming.rayjob_name(run, int(attempt))
    job = jobs.get(name)
    if job is None:
        return (owner.kind == "RayCluster" and owner.name.startswith(f"{name}-")) or (
            owner.kind == "RayJob" and owner.name == name
        )
    cluster = str((job.get("status") or {}).get("rayClusterName") or "")
    if owner.kind == "RayCluster":
        return bool(cluster) and owner.name == cluster
    return owner.kind == "RayJob" and owner.name == name and bool(owner.uid) and owner.uid == job["metadata"].get("uid")
