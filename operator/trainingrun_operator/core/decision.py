"""The decision core: (spec, status, observed attempt, now) -> (new status, merge patch, actions). Pure.

Called by the kopf handlers (`handlers.py`) for a cluster and by the local backend (`local.py`) on one
machine; both only gather the inputs and carry out the actions. No kopf, no I/O, no clock of its own.

One pass runs in a fixed order:

    terminal? ──> (Failed: delete a leftover RayJob) done
    invalid? ──> Failed/InvalidSpec, naming the field: the caller's `problem` (the object does not parse),
                 else the spec against the runtime's RuntimeConfig and the admin's allowance (validation.
                 spec_problem: spec.trainer, placement, pod templates), else a queued
                 run's spec against Kueue's rules for a RayJob (queueing.problem, naming the label)
    fold status.runtime (fenced: only the current attempt's report, until it ends unless it succeeded)
    delete RayJobs of other attempts
    switch on phase:
      Pending     -> suspended? Suspended : start attempt 1 (a queued run: its RayJob suspended, phase Queued)
      Queued      -> RayJob missing? create again; classify; unsuspended (Kueue admitted it)? admitted, then as
                     Starting; else wait for the next RayJob event (no deadline runs, no budget is charged)
      Starting    -> count lost worker pods; classify; running? Running; RayJob missing? create again (409 = adopt);
                     suspended before it was ever admitted (a queue's webhook)? Queued
      Running     -> count lost worker pods; classify; ended? charge the budget -> Restarting(reason) | Failed |
                     Succeeded; a head on a NotReady node within its grace? look again when the grace ends;
                     the stall watchdog on? look again when its deadline would pass (`watchdog.py`)
                     (a FailedRestore marks the step it resumed from bad; a restore refused because spec.trainer
                     changed the math fails the run as InvalidSpec, charging and marking nothing)
      Restarting  -> wait until the old attempt's pods are gone and the backoff passed -> start next
      Suspended   -> unsuspended and pods gone? start next attempt
    derive conditions; check the transition table; progress, reward, ETA and the attempt table (progress.py);
    diff into a merge patch (never touching status.runtime)

Identities (the attempt number and RayJob name, the driver's ServiceAccount) are in the returned status
before the matching Create actions: the caller writes the status first, then acts, so a crash between the
two leaves a name that the next pass adopts instead of a duplicate.

Lost worker pods are counted in `status.attempt.workersLost`, each once: the names already counted are kept in
`status.attempt.lostWorkerPods` (the newest MAX_LOST_WORKER_PODS), and a pass counts and announces (WorkerLost)
only a pod whose name is not there. The status is the memory, so an operator restart (the departures memory
empty, the pod maybe still Terminating) counts nothing twice; the event goes out after the status write, at most
once per pod (lost if the operator dies between the two: the count is what is kept).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from trainingrun_operator.core import (
    allowance,
    conditions,
    events,
    goodput,
    model,
    naming,
    patching,
    phases,
    progress,
    queueing,
    restarts,
    validation,
    watchdog,
)
from trainingrun_operator.core.classification import Context, FailureClass, Outcome, classify, grace_left, lost_workers
from trainingrun_operator.core.observation import AttemptObservation
from trainingrun_operator.core.phases import Phase
from trainingrun_runtime import contract, timestamps

__all__ = [
    "MAX_ATTEMPT_HISTORY",
    "MAX_CHECKPOINT_HISTORY",
    "MAX_LOST_WORKER_PODS",
    "Action",
    "CreateAttempt",
    "Decision",
    "DeleteRayJob",
    "EnsureIdentity",
    "Event",
    "Inputs",
    "decide",
]

MAX_CHECKPOINT_HISTORY = 20
MAX_ATTEMPT_HISTORY = 100
MAX_LOST_WORKER_PODS = 100  # the CRD's maxItems; above departures.MAX_PER_RUN, so a remembered pod keeps its name
POLL_SECONDS = 2.0  # re-check while waiting for pods to go (pod deletions also wake the handler)


# -------------------------------------------------------------------------------------------- records


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Everything one decision needs. `observed` is about `status.attempt` (None: nothing looked up yet).

    `problem`: why the object the caller read is invalid, found while parsing it ('<field path>: <what>');
    `spec` is None then (a spec that does not parse). A run with a problem fails unless it already ended.
    `queue`: the Kueue queue the run's labels name (`queueing.queue_of`); None: attempts start at once.
    `allow`: what the cluster admin allows in the pod templates (`allowance.py`; local mode: nothing).
    """

    run: str
    namespace: str
    generation: int
    spec: model.TrainingRunSpec | None
    status: model.TrainingRunStatus
    observed: AttemptObservation | None
    now: datetime.datetime
    problem: str | None = None
    queue: queueing.Queue | None = None
    allow: allowance.Allowance = allowance.NONE

    def __post_init__(self) -> None:
        if self.spec is None and not self.problem:
            raise ValueError("decision.Inputs: no spec, and no problem saying why")


@dataclasses.dataclass(frozen=True)
class EnsureIdentity:
    """Create (or adopt) the driver's ServiceAccount, Role and RoleBinding named in status.identity."""

    name: str


@dataclasses.dataclass(frozen=True)
class CreateAttempt:
    """Create (or adopt, on 409) the attempt's RayJob, resuming from `resume` (None: the driver's newest)."""

    number: int
    ray_job_name: str
    resume: int | None
    fallback: tuple[int, ...] = ()
    """Older recorded steps (newest first) the driver resumes from if `resume` fails verification."""
    queue: queueing.Queue | None = None
    """The queue the RayJob waits in: created suspended, with Kueue's labels (None: it starts at once)."""
    manifest_blake3: tuple[tuple[int, str], ...] = ()
    """(step, BLAKE3 of its manifest.json) of `resume` and `fallback` as recorded: the driver refuses a manifest
    that hashes otherwise (a step recorded by a driver that did not report it has none)."""


@dataclasses.dataclass(frozen=True)
class DeleteRayJob:
    """Delete an attempt's RayJob (and with it its Ray cluster and pods); checkpoints stay on the volume."""

    name: str


@dataclasses.dataclass(frozen=True)
class Event:
    """A Kubernetes event on the TrainingRun (`events.py`: every reason and type)."""

    type: events.Type
    reason: events.Reason
    message: str


Action = EnsureIdentity | CreateAttempt | DeleteRayJob | Event


@dataclasses.dataclass(frozen=True)
class Decision:
    """The new operator-owned status, the merge patch that writes it, the actions, and when to look again."""

    status: model.TrainingRunStatus
    patch: dict[str, Any]
    actions: tuple[Action, ...]
    requeue_after: float | None

    @property
    def phase(self) -> Phase:
        return Phase(self.status.phase or Phase.PENDING.value)


# ------------------------------------------------------------------------------------------- the pass


class _Pass:
    """One decision pass: a draft of the new status plus the actions collected so far (local to decide())."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.now = timestamps.rfc3339(inputs.now, timespec="seconds")  # as the API server writes times
        st = inputs.status
        self.phase = Phase(st.phase or Phase.PENDING.value)
        self.reason = st.reason or ""
        self.message = st.message or ""
        self.status = st
        self.actions: list[Action] = []
        self.requeue: float | None = None

    # -- small helpers

    def update(self, **fields: Any) -> None:
        self.status = self.status.model_copy(update=fields)

    def emit(self, kind: events.Type, reason: events.Reason, message: str) -> None:
        self.actions.append(Event(kind, reason, message))

    def wait(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def move(self, phase: Phase, reason: str = "", message: str = "") -> None:
        self.phase, self.reason, self.message = phase, reason, message

    @property
    def spec(self) -> model.TrainingRunSpec:
        assert self.inputs.spec is not None, "decide() fails a run without a spec before anything reads it"
        return self.inputs.spec

    @property
    def attempt(self) -> model.AttemptRecord | None:
        return self.status.attempt

    @property
    def observed(self) -> AttemptObservation:
        number = self.attempt.number if self.attempt else 0
        return self.inputs.observed or AttemptObservation(number=number)

    def delete_current_rayjob(self) -> None:
        obs, attempt = self.observed, self.attempt
        job = obs.rayjob
        if job is not None and not job.deleting:
            self.actions.append(DeleteRayJob(job.name))
        elif job is None and obs.backend == "local" and obs.pods and attempt is not None and attempt.ray_job_name:
            # A local attempt has no RayJob: its driver's processes stand for it, and the local backend kills them
            # on this action, again on every pass while any is left (one Ray may start a worker during a kill).
            self.actions.append(DeleteRayJob(attempt.ray_job_name))

    def pods_gone(self) -> bool:
        obs = self.observed
        return not obs.pods and obs.other_pods == 0

    # -- checkpoints (fencing)

    def fold_bad_checkpoints(self) -> None:
        """The steps this attempt's driver passed over (they failed verification) join `checkpoints.bad`, each
        announced once; an attempt that fell back from its pinned step records the step it resumed from."""
        report, attempt = self.status.runtime, self.attempt
        if report is None or attempt is None or report.attempt != attempt.number or not report.bad_checkpoints:
            return
        book = self.status.checkpoints or model.CheckpointsStatus()
        known = set(book.bad or [])
        # The driver lists what it passed over in every report of its attempt; a step the attempt has since saved
        # anew (recorded, which took it off the list) is good again and stays off.
        saved_anew = {c.step for c in book.recorded() if c.attempt == attempt.number}
        new = {b.step: b for b in report.bad_checkpoints if b.step not in known | saved_anew}
        if not new:
            return
        bad = sorted(known | set(new))[-MAX_ATTEMPT_HISTORY:]
        self.update(checkpoints=book.model_copy(update={"bad": bad}))
        for step, b in sorted(new.items(), reverse=True):
            self.emit(
                events.Type.WARNING,
                events.Reason.CHECKPOINT_CORRUPT,
                f"attempt {attempt.number}: checkpoint step {step} failed verification and was passed over: "
                f"{b.problem or 'no detail'}",
            )
        restored = report.last_checkpoint
        if attempt.resumed_from in new and restored is not None and restored.attempt != attempt.number:
            self.update(attempt=attempt.model_copy(update={"resumed_from": restored.step}))

    def fold_runtime_report(self) -> None:
        self.fold_bad_checkpoints()
        report, attempt = self.status.runtime, self.attempt
        if report is None or report.last_checkpoint is None or attempt is None:
            return
        if report.attempt != attempt.number:
            return  # a stale attempt's report: never recorded (fencing)
        late_notice = self._late_notice_checkpoint(report, attempt)
        if attempt.end is not None and attempt.reason != events.Reason.SUCCEEDED and not late_notice:
            # The attempt ended (preempted, failed, suspended) and the next one may already be pinned to a step:
            # its driver may still be alive (a partitioned node), so nothing it says is recorded any more. A
            # succeeded attempt's final report may be read after the RayJob's completion; that one counts.
            return
        ckpt = report.last_checkpoint
        book = self.status.checkpoints or model.CheckpointsStatus()
        latest = book.latest
        if latest is not None and (latest.step, latest.attempt, latest.path) == (ckpt.step, ckpt.attempt, ckpt.path):
            self._answers_notice(book, latest, ckpt)
            return
        history = [h for h in book.history or [] if h.step != ckpt.step] + [ckpt]
        bad = [s for s in book.bad or [] if s != ckpt.step] or None
        self.update(
            checkpoints=model.CheckpointsStatus(latest=ckpt, history=history[-MAX_CHECKPOINT_HISTORY:], bad=bad)
        )
        if ckpt.attempt == attempt.number:
            self.update(consecutive_failures=0)  # an attempt that produced a checkpoint resets the count
        self.emit(
            events.Type.NORMAL,
            events.Reason.CHECKPOINT_RECORDED,
            f"checkpoint step {ckpt.step} (attempt {ckpt.attempt}) at {ckpt.path}",
        )
        if ckpt.reason == contract.CheckpointReason.PREEMPTION_NOTICE:
            self._emit_notice(ckpt, "saved")
        if late_notice:
            self._recount_steps_lost(attempt, report.step, ckpt.step)

    def _answers_notice(
        self, book: model.CheckpointsStatus, held: model.CheckpointRecord, ckpt: model.CheckpointRecord
    ) -> None:
        """The recorded checkpoint reported again as the answer to the head's notice (the driver saved that step
        before it saw the notice, or was saving it when the notice came): its reason becomes PreemptionNotice, in
        `latest` and the history. Any other report of a recorded checkpoint changes nothing."""
        notice = contract.CheckpointReason.PREEMPTION_NOTICE
        if ckpt.reason != notice or held.reason == notice:
            return
        answered = held.model_copy(update={"reason": notice})
        history = [answered if h == held else h for h in book.history or []]
        self.update(checkpoints=book.model_copy(update={"latest": answered, "history": history}))
        self._emit_notice(answered, "had saved")

    def _emit_notice(self, ckpt: model.CheckpointRecord, saved: str) -> None:
        self.emit(
            events.Type.NORMAL,
            events.Reason.PREEMPTION_NOTICE,  # the value of the checkpoint reason (the driver's)
            f"attempt {ckpt.attempt} {saved} step {ckpt.step} on the head pod's notice (its preStop hook) and "
            "stops; the next attempt resumes from it",
        )

    def _late_notice_checkpoint(self, report: model.RuntimeReport, attempt: model.AttemptRecord) -> bool:
        """Whether the report is the checkpoint the ended attempt's driver saved on the head's notice, read after
        the attempt ended (the head went as soon as the driver had saved and reported, before a pass saw the
        report) and before the next attempt was pinned. The driver stopped after that save, so recording it is
        safe; the next attempt then resumes from it."""
        ckpt = report.last_checkpoint
        return (
            ckpt is not None
            and ckpt.reason == contract.CheckpointReason.PREEMPTION_NOTICE
            and ckpt.attempt == attempt.number
            and attempt.end is not None
            and attempt.reason == FailureClass.PREEMPTED.value
            and self.phase is Phase.RESTARTING
        )

    def _recount_steps_lost(self, attempt: model.AttemptRecord, reached: int | None, saved: int) -> None:
        """The ended attempt's stepsLost, counted again from the checkpoint recorded after it ended."""
        lost = max(0, (reached or saved) - saved)
        if attempt.steps_lost is not None and attempt.steps_lost <= lost:
            return
        ended = attempt.model_copy(update={"steps_lost": lost})
        history = [
            h.model_copy(update={"steps_lost": lost}) if h.number == attempt.number else h
            for h in self.status.attempts or []
        ]
        self.update(attempt=ended, attempts=history)

    def restore_error(self) -> str | None:
        report, attempt = self.status.runtime, self.attempt
        if report is None or attempt is None or report.attempt != attempt.number:
            return None
        return report.restore_error

    def last_report(self) -> datetime.datetime | None:
        """When this attempt's driver last reported (status.runtime.updated), if it did."""
        report, attempt = self.status.runtime, self.attempt
        if report is None or attempt is None or report.attempt != attempt.number or not report.updated:
            return None
        try:
            return timestamps.parse(report.updated)
        except ValueError:
            return None

    # -- lost workers

    def count_lost_workers(self) -> None:
        """Count the attempt's newly lost worker pods (names not yet in lostWorkerPods) and announce each once."""
        attempt = self.attempt
        if attempt is None or attempt.end is not None:
            return
        counted = list(attempt.lost_worker_pods or [])
        new = [w for w in lost_workers(self.observed) if w.name not in counted]
        if not new:
            return
        before = attempt.workers_lost or 0
        names = [*counted, *(w.name for w in new)][-MAX_LOST_WORKER_PODS:]
        self.update(attempt=attempt.model_copy(update={"workers_lost": before + len(new), "lost_worker_pods": names}))
        for n, worker in enumerate(new, start=before + 1):
            self.emit(
                events.Type.WARNING,
                events.Reason.WORKER_LOST,
                f"attempt {attempt.number}: worker pod {worker.name} lost ({worker.cause}); {n} lost in this attempt",
            )

    # -- attempts

    def resume_point(self) -> tuple[bool, int | None]:
        """(possible, step): the newest recorded checkpoint not known bad; else the pinned step; else latest."""
        good = self._restorable_steps()
        if good:
            return True, good[-1]
        bad = set((self.status.checkpoints or model.CheckpointsStatus()).bad or [])
        resume = self.spec.resume
        if resume.policy == "step" and resume.step is not None and resume.step not in bad:
            return True, resume.step
        if bad:
            return False, None  # every checkpoint we know of failed to restore; "latest" would pick one again
        return True, None

    def fallback_steps(self, resume: int | None) -> tuple[int, ...]:
        """The recorded steps older than `resume` and not known bad, newest first: where the driver resumes from,
        within the same attempt, when `resume` fails verification (never from a newer step)."""
        if resume is None:
            return ()
        return tuple(sorted({s for s in self._restorable_steps() if s < resume}, reverse=True))

    def manifest_hashes(self, resume: int | None, fallback: tuple[int, ...]) -> tuple[tuple[int, str], ...]:
        """The recorded BLAKE3 of each of `resume` and `fallback`'s manifests, by step (the newest record of a step)."""
        book = self.status.checkpoints or model.CheckpointsStatus()
        wanted = {*fallback, *([resume] if resume is not None else [])}
        found = {
            c.step: c.manifest_blake3 for c in book.recorded() if c.step in wanted and c.manifest_blake3 is not None
        }
        return tuple(sorted(found.items()))

    def _restorable_steps(self) -> list[int]:
        """The recorded checkpoints' steps (history, then latest: oldest recorded first) not known bad."""
        book = self.status.checkpoints or model.CheckpointsStatus()
        bad = set(book.bad or [])
        return [c.step for c in book.recorded() if c.step not in bad]

    def start_attempt(self) -> None:
        possible, resume = self.resume_point()
        if not possible:
            self.fail(events.Reason.NO_RESTORABLE_CHECKPOINT, "every recorded checkpoint failed to restore")
            return
        number = (self.attempt.number if self.attempt else 0) + 1
        spent = goodput.total(self.status, queued=self.inputs.queue is not None)  # the attempts so far, summed
        if spent is not None:
            self.update(goodput=model.Goodput(earlier=spent[0]))
        name = naming.rayjob_name(self.inputs.run, number)
        identity = naming.identity_name(self.inputs.run)
        first_identity = self.status.identity is None or self.status.identity.service_account_name is None
        self.update(
            attempt=model.AttemptRecord(
                number=number, ray_job_name=name, start=self.now, resumed_from=resume, workers_lost=0
            ),
            identity=model.Identity(service_account_name=identity, role_name=identity, role_binding_name=identity),
            next_attempt_time=None,
            start_time=self.status.start_time or self.now,
            restarts=self.status.restarts or model.RestartCounts(),
        )
        if first_identity:
            self.actions.append(EnsureIdentity(identity))  # once per run; after a crash, _recreate_missing redoes it
        queue = self.inputs.queue
        fallback = self.fallback_steps(resume)
        hashes = self.manifest_hashes(resume, fallback)
        self.actions.append(CreateAttempt(number, name, resume, fallback, queue, manifest_blake3=hashes))
        where = f"checkpoint step {resume}" if resume is not None else "the newest checkpoint on the volume, if any"
        self.emit(
            events.Type.NORMAL, events.Reason.ATTEMPT_STARTED, f"attempt {number} (RayJob {name}) resumes from {where}"
        )
        if queue is not None:
            self.enter_queue()
        else:
            self.move(Phase.STARTING, events.Reason.ATTEMPT_STARTED.value, f"attempt {number} starting")

    def end_attempt(self, reason: str, detail: str) -> None:
        attempt = self.attempt
        if attempt is None or attempt.end:
            return
        progress = [s for s in (self.observed.progress_step, self._reported_step()) if s is not None]
        book = self.status.checkpoints or model.CheckpointsStatus()
        base = book.latest.step if book.latest else (attempt.resumed_from or 0)
        lost = max(0, max(progress) - base) if progress else None
        seen = goodput.seen(attempt, self.status.runtime, self.status.rate)  # its reports' times, saves, step time
        ended = seen.model_copy(update={"end": self.now, "reason": reason, "message": detail, "steps_lost": lost})
        entry = ended.model_copy(update={"lost_worker_pods": None})  # the count stays; the names only on the attempt
        self.update(attempt=ended, attempts=[*(self.status.attempts or []), entry][-MAX_ATTEMPT_HISTORY:])

    def _reported_step(self) -> int | None:
        report, attempt = self.status.runtime, self.attempt
        if report is None or attempt is None or report.attempt != attempt.number:
            return None
        return report.step

    # -- outcomes

    def fail(self, reason: events.Reason, message: str) -> None:
        self.delete_current_rayjob()
        self.update(completion_time=self.now, next_attempt_time=None)
        self.emit(events.Type.WARNING, reason, message)
        self.move(Phase.FAILED, reason.value, message)

    def succeed(self, detail: str) -> None:
        succeeded = events.Reason.SUCCEEDED
        self.end_attempt(succeeded.value, detail)
        self.update(completion_time=self.now)
        self.emit(events.Type.NORMAL, succeeded, f"attempt {self.attempt.number if self.attempt else '?'}: {detail}")
        self.move(Phase.SUCCEEDED, succeeded.value, detail)

    def attempt_failed(self, outcome: Outcome) -> None:
        assert outcome.failure is not None
        if outcome.invalid_spec:
            # The spec, not the attempt, is at fault (a restore refused under a changed spec.trainer): no retry can
            # help, no budget is charged, and the checkpoint is good: under the spec that wrote it, it resumes.
            self.end_attempt(events.Reason.INVALID_SPEC.value, outcome.detail)
            self.fail(events.Reason.INVALID_SPEC, outcome.detail)
            return
        failure = outcome.failure
        self.end_attempt(failure.value, outcome.detail)
        self.delete_current_rayjob()
        permanent = outcome.permanent
        if failure is FailureClass.FAILED_RESTORE and not self._mark_bad_resume_point():
            # The driver chose the newest checkpoint on the volume itself and it failed verification;
            # "latest" would pick the same one again. A user can pin an older one with spec.resume.
            # (Only a failed verification is a FailedRestore: an interrupted restore is retried, step not blamed.)
            permanent = True
        charged = restarts.charge(
            self.spec.restart_policy,
            self.status.restarts or model.RestartCounts(),
            self.status.consecutive_failures or 0,
            failure,
        )
        self.update(restarts=charged.restarts, consecutive_failures=charged.consecutive_failures)
        number = self.attempt.number if self.attempt else 0
        self.emit(events.Type.WARNING, events.for_failure(failure), f"attempt {number} ended: {outcome.detail}")
        if permanent:
            self.fail(events.Reason.PERMANENT_FAILURE, f"{failure.value}: {outcome.detail} (retrying cannot help)")
        elif charged.exhausted:
            self.fail(events.Reason.BUDGET_EXHAUSTED, f"{failure.value}: {outcome.detail}; {charged.exhausted}")
        else:
            wake = self.inputs.now + datetime.timedelta(seconds=charged.delay_seconds)
            self.update(next_attempt_time=timestamps.rfc3339(wake))  # to the millisecond: backoffs below 1 s
            self.move(
                Phase.RESTARTING,
                failure.value,
                f"attempt {number} ended ({outcome.detail}); next attempt in {charged.delay_seconds:g}s",
            )
            self.emit(events.Type.NORMAL, events.Reason.RESTARTING, self.message)
            self.wait(min(POLL_SECONDS, charged.delay_seconds))

    def _mark_bad_resume_point(self) -> bool:
        """Record the step this attempt resumed from, which failed verification, as bad; False if there is no step
        to blame."""
        attempt = self.attempt
        if attempt is None or attempt.resumed_from is None:
            return False
        book = self.status.checkpoints or model.CheckpointsStatus()
        bad = sorted({*(book.bad or []), attempt.resumed_from})
        self.update(checkpoints=book.model_copy(update={"bad": bad[-MAX_ATTEMPT_HISTORY:]}))
        return True

    # -- phases

    def suspend(self) -> None:
        if self.phase in (Phase.QUEUED, Phase.STARTING, Phase.RUNNING):
            self.end_attempt(events.Reason.SUSPENDED.value, "spec.suspend is true")
            self.delete_current_rayjob()
        self.update(next_attempt_time=None)
        self.emit(
            events.Type.NORMAL, events.Reason.SUSPENDED, "spec.suspend is true; no attempt runs, checkpoints are kept"
        )
        self.move(Phase.SUSPENDED, events.Reason.SUSPENDED.value, "spec.suspend is true")

    def context(self, running: bool) -> Context:
        attempt, policy = self.attempt, self.spec.restart_policy
        return Context(
            now=self.inputs.now,
            node_not_ready_seconds=policy.node_not_ready_seconds,
            running=running,
            admitted=bool(attempt and attempt.admitted),
            restore_error=self.restore_error(),
            last_report=self.last_report(),
            workers_lost=tuple(attempt.lost_worker_pods or ()) if attempt else (),
            watch=watchdog.watch(policy, attempt, self.status.runtime) if running and attempt else None,
        )

    def on_active(self) -> None:
        running = self.phase is Phase.RUNNING
        self.count_lost_workers()
        context = self.context(running)
        outcome = classify(self.observed, context)
        if outcome is None:
            left = grace_left(self.observed, context)
            if left is not None:
                self.wait(left)  # a head's NotReady node: look again when its grace ends, even without an event
            job = self.observed.rayjob
            if not running and self._looks_running():
                self._mark_running()
            elif not running and job is None and self.observed.backend == "kuberay":
                self._recreate_missing()
            elif not running and job is not None and job.suspend and not (self.attempt and self.attempt.admitted):
                self.enter_queue()  # suspended before it ever ran: a queue (a webhook's default queue) holds it
            self._watch_for_stalls()
        elif outcome.succeeded:
            self.succeed(outcome.detail)
        else:
            self.attempt_failed(outcome)

    def _mark_running(self) -> None:
        attempt = self.attempt
        number = attempt.number if attempt else 0
        if attempt is not None:
            self.update(attempt=attempt.model_copy(update={"running_since": self.now}))
        self.emit(events.Type.NORMAL, events.Reason.ATTEMPT_RUNNING, f"attempt {number} is running")
        self.move(Phase.RUNNING, events.Reason.ATTEMPT_RUNNING.value, f"attempt {number} is running")

    def _watch_for_stalls(self) -> None:
        """A Running attempt under the stall watchdog: look again when its deadline would pass, since the driver's
        progress reports wake no one. A report that came meanwhile moves the deadline; that pass asks again."""
        attempt = self.attempt
        if attempt is None or self.phase is not Phase.RUNNING:
            return
        watch = watchdog.watch(self.spec.restart_policy, attempt, self.status.runtime)
        due = watch.left(self.inputs.now) if watch else None
        if due:  # 0: past the deadline yet not a stall (a NotReady node or a deleted head's grace decides; it waits)
            self.wait(due)

    def _looks_running(self) -> bool:
        obs = self.observed
        job = obs.rayjob
        if job is not None:
            return job.deployment_status == "Running" or job.job_status == "RUNNING"
        head = obs.head
        return obs.backend == "local" and head is not None and head.phase == "Running"

    def _recreate_missing(self) -> None:
        attempt = self.attempt
        if attempt is None or attempt.ray_job_name is None:
            return
        identity = naming.identity_name(self.inputs.run)
        queue = self.inputs.queue
        fallback = self.fallback_steps(attempt.resumed_from)
        self.actions += [
            EnsureIdentity(identity),
            CreateAttempt(
                attempt.number,
                attempt.ray_job_name,
                attempt.resumed_from,
                fallback,
                queue,
                manifest_blake3=self.manifest_hashes(attempt.resumed_from, fallback),
            ),
        ]
        if queue is not None and self.phase is Phase.STARTING:
            # Created again, suspended: it waits for admission again (nothing of it ran: it never reached Running).
            self.update(attempt=attempt.model_copy(update={"admitted": None}))
            self.enter_queue()

    # -- queueing (Kueue)

    def enter_queue(self) -> None:
        """The current attempt waits for admission: phase Queued, its message naming the queue."""
        attempt = self.attempt
        number = attempt.number if attempt else 0
        name = attempt.ray_job_name if attempt else "?"
        queue = self.inputs.queue
        if queue is not None:
            where = f"LocalQueue {queue.name} ({queueing.QUEUE_LABEL})"
            if queue.priority_class:
                where += f", priority class {queue.priority_class}"
        else:
            where = f"a queue that suspended it (the run has no {queueing.QUEUE_LABEL} label)"
        message = f"attempt {number} (RayJob {name}) waits for Kueue to admit it in {where}"
        if self.phase is not Phase.QUEUED:
            self.emit(events.Type.NORMAL, events.Reason.QUEUED, message)
        self.move(Phase.QUEUED, events.Reason.QUEUED.value, message)

    def on_queued(self) -> None:
        """Queued: wait for Kueue to unsuspend the RayJob; nothing runs, so no deadline applies and nothing is
        charged. The RayJob's events (admission is one) wake the run."""
        obs = self.observed
        job = obs.rayjob
        if job is None and obs.backend == "kuberay":
            self._recreate_missing()
            return
        outcome = classify(obs, self.context(running=False))
        if outcome is not None:
            self.succeed(outcome.detail) if outcome.succeeded else self.attempt_failed(outcome)
            return
        if job is not None and not job.suspend:
            self._admit()
            self.on_active()

    def _admit(self) -> None:
        attempt = self.attempt
        if attempt is None:
            return
        self.update(attempt=attempt.model_copy(update={"admitted": self.now}))
        waited = ""
        started = _parse(attempt.start)
        if started is not None:
            waited = f" after {max(0.0, (self.inputs.now - started).total_seconds()):.0f}s in the queue"
        admitted = f"attempt {attempt.number} (RayJob {attempt.ray_job_name}) admitted{waited}"
        self.emit(events.Type.NORMAL, events.Reason.ADMITTED, admitted)
        self.move(Phase.STARTING, events.Reason.ADMITTED.value, f"attempt {attempt.number} admitted; starting")

    def on_waiting(self) -> None:
        """Restarting or Suspended(unsuspended): start the next attempt once the old pods are gone."""
        self.delete_current_rayjob()
        if not self.pods_gone():
            self.wait(POLL_SECONDS)
            return
        due = self.status.next_attempt_time
        wake = timestamps.parse(due) if due else None
        if wake is not None and wake > self.inputs.now:
            self.wait((wake - self.inputs.now).total_seconds())
            return
        self.start_attempt()


def _parse(text: str | None) -> datetime.datetime | None:
    try:
        return timestamps.parse(text) if text else None
    except ValueError:
        return None


def _conditions_and_patch(p: _Pass, old: model.TrainingRunStatus) -> Decision:
    inputs = p.inputs
    phases.check_transition(Phase(old.phase or Phase.PENDING.value), p.phase)
    book = p.status.checkpoints
    p.update(
        phase=p.phase.value,
        reason=p.reason or None,
        message=p.message or None,
        observed_generation=inputs.generation,
        conditions=conditions.derive(
            old.conditions,
            p.phase,
            p.reason,
            p.message,
            book.latest if book else None,
            p.now,
            inputs.generation,
            queued=inputs.queue is not None,
        ),
    )
    if inputs.spec is not None:
        # what kubectl get and describe show
        p.status = progress.summarise(inputs.spec, p.status, inputs.now, in_queue=inputs.queue is not None)
    p.status = goodput.keep(p.status, queued=inputs.queue is not None)
    before = {k: v for k, v in old.wire().items() if k != contract.REPORT_FIELD}
    after = {k: v for k, v in p.status.wire().items() if k != contract.REPORT_FIELD}
    return Decision(p.status, patching.diff(before, after), tuple(p.actions), p.requeue)


def decide(inputs: Inputs) -> Decision:
    """One reconcile pass over a TrainingRun. See the module docstring for the order."""
    p = _Pass(inputs)
    if p.phase in phases.TERMINAL:
        p.fold_runtime_report()
        if p.phase is Phase.FAILED:
            p.delete_current_rayjob()
        return _conditions_and_patch(p, inputs.status)
    problem = inputs.problem or validation.spec_problem(p.spec, inputs.allow) or queueing.problem(p.spec, inputs.queue)
    if problem is not None:
        p.end_attempt(events.Reason.INVALID_SPEC.value, problem)
        p.fail(events.Reason.INVALID_SPEC, problem)
        return _conditions_and_patch(p, inputs.status)
    p.fold_runtime_report()
    for name in p.observed.other_rayjobs:
        p.actions.append(DeleteRayJob(name))
    suspend = p.spec.suspend
    if p.phase is Phase.PENDING:
        p.suspend() if suspend else p.on_waiting()
    elif p.phase is Phase.QUEUED:
        p.suspend() if suspend else p.on_queued()
    elif p.phase in (Phase.STARTING, Phase.RUNNING):
        p.suspend() if suspend else p.on_active()
    elif p.phase is Phase.RESTARTING:
        p.suspend() if suspend else p.on_waiting()
    elif p.phase is Phase.SUSPENDED:
        p.on_waiting() if not suspend else p.delete_current_rayjob()
    return _conditions_and_patch(p, inputs.status)
