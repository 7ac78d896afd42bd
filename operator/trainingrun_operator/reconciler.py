"""One reconcile of one TrainingRun against the API server: gather -> decide -> apply. kopf-free.

Called by `handlers.supervise` (one coroutine per run, so a run is never reconciled twice at once) and by
`handlers.cleanup` on deletion. The order is fixed, KubeRay-style:

    get the TrainingRun ─ gone or deleting? stop
    parse spec/status (pydantic)
    gather: the run's RayJobs and pods (by label), the nodes the current attempt's pods sit on
    decide (decision.py, pure)
    write the status patch ─ identities (attempt number, RayJob and ServiceAccount names) land here first
    act: identity objects, RayJob create (409 = adopt) / delete, events

A crash anywhere leaves either the old status (the next pass decides again) or the new status with names
whose objects may be missing (the next pass creates them under the same names). Nothing is created twice.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pydantic

from trainingrun_operator import apiclient, decision, departures, errors, identity, model, naming, observation, rayjob

__all__ = ["Clock", "finalize", "observe", "reconcile", "utc_now"]

logger = logging.getLogger(__name__)
Clock = Callable[[], datetime.datetime]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _attempt_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata", {}).get("labels") or {}).get(naming.LABEL_ATTEMPT, ""))


async def observe(
    api: apiclient.Api,
    namespace: str,
    run: str,
    status: model.TrainingRunStatus,
    memory: departures.Departures | None = None,
) -> observation.AttemptObservation:
    """What the cluster shows about the run's current attempt (and leftovers of others)."""
    jobs = await api.list_rayjobs(namespace, run)
    pods = await api.list_pods(namespace, run)
    current = status.attempt
    number = current.number if current else 0
    job_name = current.ray_job_name if current else None
    mine = [p for p in pods if _attempt_of(p) == str(number)]
    node_names = sorted({str(p.get("spec", {}).get("nodeName")) for p in mine if p.get("spec", {}).get("nodeName")})
    nodes: dict[str, Mapping[str, Any]] = {}
    for node_name in node_names:
        node = await api.get_node(node_name)
        if node is not None:
            nodes[node_name] = node
    job = next((j for j in jobs if j["metadata"]["name"] == job_name), None)
    return observation.AttemptObservation(
        number=number,
        rayjob=observation.rayjob_observation(job) if job is not None else None,
        pods=tuple(observation.pod_observation(p, nodes) for p in mine),
        other_rayjobs=tuple(
            j["metadata"]["name"] for j in jobs
            if j["metadata"]["name"] != job_name and not j["metadata"].get("deletionTimestamp")
        ),
        other_pods=len(pods) - len(mine),
        departed=memory.of_attempt(namespace, run, number, {p["metadata"]["name"] for p in mine}) if memory else (),
    )


async def _act(api: apiclient.Api, obj: Mapping[str, Any], run: model.TrainingRun, action: decision.Action) -> None:
    """Carry out one action. Events are not posted here: reconcile() posts them all at once, concurrently."""
    meta = run.metadata
    namespace, uid = meta.namespace or "default", meta.uid or ""
    if isinstance(action, decision.EnsureIdentity):
        # Independent objects: created concurrently (each 409 adopts); all exist before the RayJob is created.
        await asyncio.gather(
            api.create_service_account(identity.build_service_account(meta.name, namespace, uid)),
            api.create_role(identity.build_role(meta.name, namespace, uid)),
            api.create_role_binding(identity.build_role_binding(meta.name, namespace, uid)),
        )
    elif isinstance(action, decision.CreateAttempt):
        body = rayjob.build_rayjob(meta.name, namespace, uid, action.number, action.resume, run.spec)
        try:
            created = await api.create_rayjob(body)
        except errors.ApiError as exc:
            await _event(api, obj, "Warning", "FailedToCreateRayJob", f"RayJob {action.ray_job_name}: {exc}")
            raise
        reason = "CreatedRayJob" if created else "AdoptedRayJob"
        await _event(api, obj, "Normal", reason, f"RayJob {action.ray_job_name} for attempt {action.number}")
    elif isinstance(action, decision.DeleteRayJob):
        try:
            deleted = await api.delete_rayjob(namespace, action.name)
        except errors.ApiError as exc:
            await _event(api, obj, "Warning", "FailedToDeleteRayJob", f"RayJob {action.name}: {exc}")
            raise
        if deleted:
            await _event(api, obj, "Normal", "DeletedRayJob", f"RayJob {action.name}")


async def _event(api: apiclient.Api, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    """Events are best effort: a failure to post one is logged, never fatal."""
    try:
        await api.post_event(obj, kind, reason, message)
    except errors.ApiError as exc:
        logger.warning("could not post event %s: %s", reason, exc)


async def reconcile(
    api: apiclient.Api,
    namespace: str,
    name: str,
    clock: Clock = utc_now,
    memory: departures.Departures | None = None,
) -> float | None:
    """One pass over TrainingRun namespace/name; returns seconds until the next pass is due (None: on events)."""
    obj = await api.get_trainingrun(namespace, name)
    if obj is None or obj.get("metadata", {}).get("deletionTimestamp"):
        return None
    try:
        run = model.TrainingRun.model_validate(obj)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = f"{where}: {first['msg']}"
        if (obj.get("status") or {}).get("message") != message:
            await api.patch_trainingrun_status(namespace, name, {"phase": "Failed", "reason": "InvalidSpec", "message": message})
            await _event(api, obj, "Warning", "InvalidSpec", message)
        return None
    status = run.status or model.TrainingRunStatus()
    observed = await observe(api, namespace, name, status, memory)
    result = decision.decide(
        decision.Inputs(
            run=name,
            namespace=namespace,
            generation=run.metadata.generation or 1,
            spec=run.spec,
            status=status,
            observed=observed,
            now=clock(),
        )
    )
    if result.patch:
        await api.patch_trainingrun_status(namespace, name, result.patch)
    if status.phase != result.status.phase:
        logger.info("%s/%s: %s -> %s (%s)", namespace, name, status.phase or "-", result.status.phase, result.status.reason or "")
    failed: errors.OperatorError | None = None
    try:
        for action in result.actions:
            if not isinstance(action, decision.Event):
                await _act(api, obj, run, action)
    except errors.OperatorError as exc:
        failed = exc  # the status already says what happened: its events still go out, then the error
    # The decision's events (transitions, checkpoints) go out together, concurrently; they are best effort.
    await asyncio.gather(
        *(_event(api, obj, a.type, a.reason, a.message) for a in result.actions if isinstance(a, decision.Event))
    )
    if failed is not None:
        raise failed
    return result.requeue_after


async def finalize(api: apiclient.Api, namespace: str, name: str) -> list[str]:
    """The run is being deleted: delete its RayJobs now (checkpoints on the PVC are kept). Returns their names."""
    deleted = []
    for job in await api.list_rayjobs(namespace, name):
        if await api.delete_rayjob(namespace, job["metadata"]["name"]):
            deleted.append(job["metadata"]["name"])
    return deleted
