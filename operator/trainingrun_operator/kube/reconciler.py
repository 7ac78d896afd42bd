"""One reconcile of one TrainingRun against the API server: gather -> decide -> apply. kopf-free.

Called by `handlers.supervise` (one coroutine per run, so a run is never reconciled twice at once) and by
`handlers.cleanup` on deletion. The order is fixed, KubeRay-style:

    get the TrainingRun, list its RayJobs and pods (by label) ─ concurrently; gone or deleting? stop
    read: parse spec/status (pydantic); an object that does not parse goes on with its first invalid field
    observe: of what the label selected, only what the run owns (owner references: `observation.run_rayjobs`,
             `observation.of_run`); the nodes the current attempt's pods sit on
    decide (decision.py, pure): that field fails the run (Failed/InvalidSpec) like any other invalid spec
    write the status patch ─ identities (attempt number, RayJob and ServiceAccount names) land here first;
                              the driver's identity objects (fixed names) are created alongside, and so is the
                              run's NetworkPolicy whenever an attempt starts (`netpolicy.py`; set back to what the
                              operator writes if it says otherwise)
    act: RayJob create (409 = adopt if the run's own) / delete, then events; an object under one of the run's
         names that is not the run's (`identity.refusal`) is refused: its message goes into status.reason/message
         and a Warning event, and the pass fails, to be retried (`errors.ForeignObject`)
    metrics: once the status is written, the exporter learns what the pass changed (`metrics.py`, `figures.py`);
             every pass's duration, failed or not, less the wait for the moment it was asked for

A crash anywhere leaves either the old status (the next pass decides again) or the new status with names
whose objects may be missing (the next pass creates them under the same names). Nothing is created twice, and
nothing is adopted that the run did not create.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import pydantic

from trainingrun_operator.core import (
    allowance,
    decision,
    departures,
    errors,
    events,
    identity,
    model,
    naming,
    netpolicy,
    observation,
    phases,
    queueing,
    rayjob,
    validation,
)
from trainingrun_operator.kube import apiclient, wakeups

if TYPE_CHECKING:
    from trainingrun_operator.kube import metrics as metrics_

__all__ = ["Clock", "Snapshot", "finalize", "gather", "observe", "read", "reconcile", "utc_now"]

logger = logging.getLogger(__name__)
Clock = Callable[[], datetime.datetime]
READ_AHEAD_LIMIT = 0.2  # the longest a pass waits, after its reads, for the moment it was asked for


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _attempt_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata", {}).get("labels") or {}).get(naming.LABEL_ATTEMPT, ""))


async def gather(
    api: apiclient.Api, namespace: str, run: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """The TrainingRun, and the RayJobs and pods with its label, read concurrently (one round trip's wait instead
    of three).

    The lists select by the run's label, so they need nothing from the TrainingRun; on a loaded API server
    each read can take tens of milliseconds, and every pass starts with these three. Which of them the run owns
    is `observe`'s to say, with the TrainingRun's uid.
    """
    obj, jobs, pods = await asyncio.gather(
        api.get_trainingrun(namespace, run), api.list_rayjobs(namespace, run), api.list_pods(namespace, run)
    )
    return obj, jobs, pods


async def observe(
    api: apiclient.Api,
    namespace: str,
    run: str,
    uid: str | None,
    status: model.TrainingRunStatus,
    jobs: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    memory: departures.Departures | None = None,
) -> observation.AttemptObservation:
    """What the cluster shows about the run's current attempt (and leftovers of others), from the `jobs` and `pods`
    with the run's label (see `gather`) that the TrainingRun `uid` owns, and the nodes the current attempt's pods
    sit on (read here, concurrently). A RayJob or pod that only carries the label is not the run's: it counts for
    nothing (no lost worker, no pod left to wait for) and is never deleted."""
    current = status.attempt
    number = current.number if current else 0
    job_name = current.ray_job_name if current else None
    jobs = observation.run_rayjobs(jobs, uid)
    by_name = {j["metadata"]["name"]: j for j in jobs}
    pods = [p for p in pods if observation.of_run(observation.controller_of(p), run, _attempt_of(p), by_name)]
    mine = [p for p in pods if _attempt_of(p) == str(number)]
    node_names = sorted({str(p.get("spec", {}).get("nodeName")) for p in mine if p.get("spec", {}).get("nodeName")})
    found = await asyncio.gather(*(api.get_node(n) for n in node_names))
    nodes: dict[str, Mapping[str, Any]] = {
        n: node for n, node in zip(node_names, found, strict=True) if node is not None
    }
    job = next((j for j in jobs if j["metadata"]["name"] == job_name), None)
    return observation.AttemptObservation(
        number=number,
        rayjob=observation.rayjob_observation(job) if job is not None else None,
        pods=tuple(observation.pod_observation(p, nodes) for p in mine),
        other_rayjobs=tuple(
            j["metadata"]["name"]
            for j in jobs
            if j["metadata"]["name"] != job_name and not j["metadata"].get("deletionTimestamp")
        ),
        other_pods=len(pods) - len(mine),
        # A pod seen as a disruption target counts as disrupted once it is being deleted, even if the condition
        # is gone from its status by now (a later status write replaced the conditions): "departed" is every
        # such pod of this attempt that is gone or going.
        departed=tuple(
            p
            for p in (memory.of_attempt(namespace, run, number, _staying(mine)) if memory else ())
            if observation.of_run(p.owner, run, str(number), by_name)
        ),
    )


def _staying(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The TrainingRun as one pass read it. `spec` is None when the object does not parse; `problem` says why
    (its first invalid field), and `status` is as much of the status as parses."""

    meta: model.ObjectMeta
    spec: model.TrainingRunSpec | None
    status: model.TrainingRunStatus
    problem: str | None = None


def read(obj: Mapping[str, Any]) -> Snapshot:
    """Parse the TrainingRun (pydantic). An object that does not parse is not an error here: the decision fails it."""
    try:
        run = model.TrainingRun.model_validate(obj)
    except pydantic.ValidationError as exc:
        meta = model.ObjectMeta.model_validate(obj["metadata"])
        return Snapshot(meta, None, _parsable_status(obj.get("status")), str(validation.problems(exc)[0]))
    return Snapshot(run.metadata, run.spec, run.status or model.TrainingRunStatus())


def _parsable_status(raw: Any) -> model.TrainingRunStatus:
    """The status without its top-level fields that do not parse: those the decision sets are written anew, the
    others stay as they are (the merge patch never names them)."""
    fields = dict(raw) if isinstance(raw, Mapping) else {}
    while True:
        try:
            return model.TrainingRunStatus.model_validate(fields)
        except pydantic.ValidationError as exc:
            bad = {detail["loc"][0] for detail in exc.errors() if detail["loc"]} & fields.keys()
            if not bad:
                return model.TrainingRunStatus()
            for key in bad:
                del fields[key]


async def _act(api: apiclient.Api, obj: Mapping[str, Any], run: Snapshot, action: decision.Action) -> None:
    """Carry out one action. Events are not posted here: _apply() posts them all at once, concurrently."""
    meta = run.meta
    namespace, uid = meta.namespace or "default", meta.uid or ""
    if isinstance(action, decision.EnsureIdentity):
        # Independent objects: created concurrently (each 409 adopts the run's own); all exist before the RayJob.
        await asyncio.gather(
            _ensure(
                api.create_service_account,
                api.get_service_account,
                identity.build_service_account(meta.name, namespace, uid),
                uid,
            ),
            _ensure(api.create_role, api.get_role, identity.build_role(meta.name, namespace, uid), uid),
            _ensure(
                api.create_role_binding,
                api.get_role_binding,
                identity.build_role_binding(meta.name, namespace, uid),
                uid,
            ),
        )
    elif isinstance(action, decision.CreateAttempt):
        assert run.spec is not None, "the decision starts no attempt of a run whose spec does not parse"
        body = rayjob.build_rayjob(
            meta.name,
            namespace,
            uid,
            action.number,
            action.resume,
            run.spec,
            action.fallback,
            action.queue,
            manifest_blake3=dict(action.manifest_blake3),
        )
        try:
            adopted = await _ensure(api.create_rayjob, api.get_rayjob, body, uid)
        except errors.ApiError as exc:
            failed = events.Reason.FAILED_TO_CREATE_RAY_JOB
            await _event(api, obj, events.Type.WARNING, failed, f"RayJob {action.ray_job_name}: {exc}")
            raise
        reason = events.Reason.CREATED_RAY_JOB if adopted is None else events.Reason.ADOPTED_RAY_JOB
        await _event(api, obj, events.Type.NORMAL, reason, f"RayJob {action.ray_job_name} for attempt {action.number}")
    elif isinstance(action, decision.DeleteRayJob):
        try:
            deleted = await api.delete_rayjob(namespace, action.name)
        except errors.ApiError as exc:
            await _event(
                api, obj, events.Type.WARNING, events.Reason.FAILED_TO_DELETE_RAY_JOB, f"RayJob {action.name}: {exc}"
            )
            raise
        if deleted:
            await _event(api, obj, events.Type.NORMAL, events.Reason.DELETED_RAY_JOB, f"RayJob {action.name}")


async def _ensure(
    create: Callable[[dict[str, Any]], Awaitable[bool]],
    get: Callable[[str, str], Awaitable[dict[str, Any] | None]],
    body: dict[str, Any],
    uid: str,
) -> dict[str, Any] | None:
    """Create `body`, or adopt the object already under its name if it is the run's own; None if created, else the
    object adopted (as read).

    errors.ForeignObject (naming the object, its owner and the fix) if it is not (`identity.refusal`): it is left
    as it is, and nothing that would use it is created.
    """
    if await create(body):
        return None
    meta = body["metadata"]
    existing = await get(meta["namespace"], meta["name"])
    if existing is None:
        raise errors.ApiError(f"{body['kind']} {meta['namespace']}/{meta['name']}: existed on create, gone on read")
    problem = identity.refusal(existing, body, uid)
    if problem is not None:
        raise errors.ForeignObject(problem)
    return existing


async def _ensure_network_policy(
    api: apiclient.Api, obj: Mapping[str, Any], run: Snapshot, sources: netpolicy.Sources
) -> None:
    """Create the run's NetworkPolicy, or adopt the run's own and set its spec back to the operator's if it differs
    (the settings or the run's Ray ports changed, or someone edited it). One that is not the run's is refused
    (errors.ForeignObject): an earlier run's, which the garbage collector is removing, would go with it."""
    assert run.spec is not None, "the decision starts no attempt of a run whose spec does not parse"
    meta = run.meta
    namespace, uid = meta.namespace or "default", meta.uid or ""
    body = netpolicy.build(meta.name, namespace, uid, run.spec, sources)
    adopted = await _ensure(api.create_network_policy, api.get_network_policy, body, uid)
    if adopted is None or adopted.get("spec") == body["spec"]:
        return
    name = body["metadata"]["name"]
    await api.patch_network_policy_spec(namespace, name, body["spec"])
    message = f"NetworkPolicy {name} admitted other traffic than the operator writes for this run; its spec is set back"
    await _event(api, obj, events.Type.NORMAL, events.Reason.UPDATED_NETWORK_POLICY, message)


async def _event(
    api: apiclient.Api, obj: Mapping[str, Any], kind: events.Type, reason: events.Reason, message: str
) -> None:
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
    signals: wakeups.Wakeups | None = None,
    *,
    not_before: float | None = None,
    metrics: metrics_.Exporter | None = None,
    network: netpolicy.Sources | None = netpolicy.DEFAULT,
    covered: set[str] | None = None,
    allow: allowance.Allowance = allowance.NONE,
) -> float | None:
    """One pass over TrainingRun namespace/name; returns seconds until the next pass is due (None: on events).

    The delay is counted from the moment of the decision, not from the end of the pass: the writes and
    events after it (tens of milliseconds on a loaded API server) do not push a backoff's end further out.
    `signals` learns what the pass read, so that watch events that bring nothing new (our own writes) wake no one.
    `not_before` (time.monotonic()): the moment the caller asked this pass for; a pass that has done its reads
    less than `READ_AHEAD_LIMIT` before it waits for it before deciding (reads a few tens of milliseconds old,
    as in any pass), so that a backoff ends on time; a pass further ahead (woken by an event) decides at once.
    `metrics` learns what the pass changed once the status is written, and how long the pass took.
    `network`: who besides the run's own pods may reach them, in the NetworkPolicy ensured before each attempt's
    RayJob (None: the operator makes no NetworkPolicy). `covered`: the uids of the runs whose NetworkPolicy this
    operator process has ensured; a run not in it whose pods may be up (an attempt, not Succeeded or Failed) gets
    its policy ensured in this pass too, so that a run started before the operator made policies (or whose policy
    was deleted) is closed once per operator process, not only at its next attempt. `allow`: what the cluster
    admin allows in the pod templates (the chart's podSecurity.allow; `allowance.py`).
    """
    began, waited = time.monotonic(), 0.0
    try:
        obj, jobs, pods = await gather(api, namespace, name)
        if obj is not None and signals is not None:
            signals.saw(namespace, name, obj)
        if obj is None and metrics is not None:
            metrics.forget(namespace, name)  # gone without our delete handler (a finalizer removed by hand)
        if obj is None or obj.get("metadata", {}).get("deletionTimestamp"):
            return None
        run = read(obj)
        observed = await observe(api, namespace, name, run.meta.uid, run.status, jobs, pods, memory)
        waited = await _wait_until(not_before)
        return await _decide_and_apply(
            api, namespace, name, obj, run, observed, clock, metrics, network, covered, allow
        )
    finally:
        if metrics is not None:
            metrics.reconciled(time.monotonic() - began - waited)


async def _decide_and_apply(
    api: apiclient.Api,
    namespace: str,
    name: str,
    obj: Mapping[str, Any],
    run: Snapshot,
    observed: observation.AttemptObservation,
    clock: Clock,
    metrics: metrics_.Exporter | None,
    network: netpolicy.Sources | None = None,
    covered: set[str] | None = None,
    allow: allowance.Allowance = allowance.NONE,
) -> float | None:
    """The rest of `reconcile` once the reads are done: decide, write, act; the metrics after the write."""
    now, decided = clock(), time.monotonic()
    result = decision.decide(
        decision.Inputs(
            run=name,
            namespace=namespace,
            generation=run.meta.generation or 1,
            spec=run.spec,
            status=run.status,
            observed=observed,
            now=now,
            problem=run.problem,
            queue=queueing.queue_of(run.meta.labels),
            allow=allow,
        )
    )

    def written() -> None:
        if metrics is not None:
            meta = run.meta
            metrics.passed(namespace, name, meta.uid, run.status, result.status, now, meta.creation_timestamp)

    await _apply(api, obj, run, result, written, network, covered)
    if result.requeue_after is None:
        return None
    return max(0.0, result.requeue_after - (time.monotonic() - decided))


async def _wait_until(not_before: float | None) -> float:
    """Wait for the moment the pass was asked for, if the reads finished at most READ_AHEAD_LIMIT before it;
    returns the seconds waited."""
    if not_before is not None and 0 < not_before - time.monotonic() <= READ_AHEAD_LIMIT:
        began = time.monotonic()
        await asyncio.sleep(not_before - began)
        return time.monotonic() - began
    return 0.0


async def _apply(
    api: apiclient.Api,
    obj: Mapping[str, Any],
    run: Snapshot,
    result: decision.Decision,
    written: Callable[[], None] | None = None,
    network: netpolicy.Sources | None = None,
    covered: set[str] | None = None,
) -> None:
    """Carry out a decision: the status write (and the identity objects beside it), the other actions, the events.

    The status write and the driver's identity objects go out together: the identity objects have fixed names
    (a crash between the two leaves objects the next pass adopts on 409) and grant nothing until a pod uses them.
    So does the run's NetworkPolicy, with `network`, whenever the decision creates an attempt (every attempt, not
    only the first: a run from before the policy, or whose policy was deleted, gets it before its next RayJob), and
    once per operator process for a run with pods up that is not yet in `covered` (`_cover`).
    Every other action (the RayJob above all) waits until the status names it and those objects exist. An action
    that fails after the status was written still lets the decision's events go out (the status already says what
    happened); its error is raised last. `written` is called once the status write succeeded (what the status now
    says happened). A refused object (`errors.ForeignObject`) is also told in the status and an event
    (`_tell_ownership`).
    """
    namespace, name = run.meta.namespace or "default", run.meta.name
    identities = [a for a in result.actions if isinstance(a, decision.EnsureIdentity)]
    others = [a for a in result.actions if not isinstance(a, (decision.Event, decision.EnsureIdentity))]
    policies: list[Awaitable[None]] = []
    if network is not None and run.spec is not None:
        starts = any(isinstance(a, decision.CreateAttempt) for a in result.actions)
        if starts or _uncovered(run, result, covered):
            policies.append(_cover(api, obj, run, network, covered, before_rayjob=starts))
    status_written, *ensured = await asyncio.gather(
        _write_status(api, namespace, name, result.patch),
        *(_act(api, obj, run, a) for a in identities),
        *policies,
        return_exceptions=True,
    )
    if isinstance(status_written, BaseException):
        raise status_written
    if written is not None:
        written()
    if run.status.phase != result.status.phase:
        logger.info(
            "%s/%s: %s -> %s (%s)",
            namespace,
            name,
            run.status.phase or "-",
            result.status.phase,
            result.status.reason or "",
        )
    failed = next((e for e in ensured if isinstance(e, BaseException)), None)
    if failed is not None and not isinstance(failed, errors.OperatorError):
        raise failed
    try:
        for action in others if failed is None else []:
            await _act(api, obj, run, action)
    except errors.OperatorError as exc:
        failed = exc
    # The decision's events (transitions, checkpoints) go out together, concurrently; they are best effort.
    await asyncio.gather(
        *(_event(api, obj, a.type, a.reason, a.message) for a in result.actions if isinstance(a, decision.Event))
    )
    await _tell_ownership(api, obj, namespace, name, result, failed)
    if failed is not None:
        raise failed


def _uncovered(run: Snapshot, result: decision.Decision, covered: set[str] | None) -> bool:
    """Whether the run's pods may be up (it has an attempt and is neither Succeeded nor Failed) and this operator
    process has not ensured its NetworkPolicy yet (`covered`; None: it does not keep count)."""
    uid, status = run.meta.uid, result.status
    live = status.attempt is not None and status.phase not in phases.TERMINAL
    return covered is not None and bool(uid) and uid not in covered and live


async def _cover(
    api: apiclient.Api,
    obj: Mapping[str, Any],
    run: Snapshot,
    sources: netpolicy.Sources,
    covered: set[str] | None,
    *,
    before_rayjob: bool,
) -> None:
    """Ensure the run's NetworkPolicy and note the run in `covered`. Before a RayJob a failure is raised, so that no
    RayJob goes without it; otherwise (a run whose pods are up, once per operator process) it is logged and tried
    again the next pass, and holds back nothing else the pass does."""
    try:
        await _ensure_network_policy(api, obj, run, sources)
    except errors.OperatorError as exc:
        if before_rayjob:
            raise
        logger.warning(
            "%s/%s: NetworkPolicy not ensured (tried again next pass): %s", run.meta.namespace, run.meta.name, exc
        )
        return
    if covered is not None and run.meta.uid:
        covered.add(run.meta.uid)


async def _tell_ownership(
    api: apiclient.Api,
    obj: Mapping[str, Any],
    namespace: str,
    name: str,
    result: decision.Decision,
    failed: BaseException | None,
) -> None:
    """A refused object goes into status.reason/message (where `kubectl describe` and `kubectl get -o` show it)
    and a Warning event, each once per message: the run keeps its phase and no RayJob is made while the pass is
    retried. Once a pass has created the run's objects after such a refusal, the status says so (the decision
    carries reason and message over until the phase changes). Best effort: the pass's own error comes first."""
    status = result.status
    if isinstance(failed, errors.ForeignObject):
        reason, kind, message = events.Reason.FOREIGN_OBJECT, events.Type.WARNING, str(failed)
        if (status.reason, status.message) == (reason, message):
            return
    elif (
        failed is None
        and status.reason == events.Reason.FOREIGN_OBJECT
        and any(isinstance(a, decision.CreateAttempt) for a in result.actions)
    ):
        number = status.attempt.number if status.attempt else 0
        reason, kind = events.Reason.FOREIGN_OBJECT_GONE, events.Type.NORMAL
        message = (
            f"the driver's identity, the NetworkPolicy and the RayJob of attempt {number} are this run's own now; "
            "it goes on"
        )
    else:
        return
    try:
        await _write_status(api, namespace, name, {"reason": reason.value, "message": message})
    except errors.ApiError as exc:
        logger.warning("could not write %s into the status: %s", reason, exc)
    await _event(api, obj, kind, reason, message)


async def _write_status(api: apiclient.Api, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
    if patch:
        await api.patch_trainingrun_status(namespace, name, patch)


async def finalize(api: apiclient.Api, namespace: str, name: str) -> list[str]:
    """The run is being deleted: delete its RayJobs now (checkpoints on the PVC are kept). Returns their names.

    Only the RayJobs the run owns: one that merely carries its label is not the run's to delete. A run already
    gone has nothing left to delete here (the garbage collector takes what it owned).
    """
    obj, jobs = await asyncio.gather(api.get_trainingrun(namespace, name), api.list_rayjobs(namespace, name))
    uid = (obj or {}).get("metadata", {}).get("uid")
    deleted = []
    for job in observation.run_rayjobs(jobs, uid):
        if await api.delete_rayjob(namespace, job["metadata"]["name"]):
            deleted.append(job["metadata"]["name"])
    return deleted
