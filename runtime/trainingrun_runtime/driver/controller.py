"""SingleControllerActor: one Ray actor, one asyncio loop, running the rollout lanes, the train pump and the saves.

    rollout lane ×k (one per generator slot)            train pump
    ─────────────────────────────────────────           ──────────────────────────────────────────────
    dispatch: queued uid (redispatch) or loader.next()  select: sampler.select(committed {uid: version})
      ledger: QUEUED → IN_FLIGHT                        drop too-stale groups (remove_group, barrier)
    reserve(group)            ── barrier.mutation ──    advantage stage: read rewards back, write
    generate on worker (versioned weights)                 advantages onto the SAME keys (no barrier;
    commit(group, rows) → TQ  ── barrier.mutation ──       same task as the save)
      ledger: IN_FLIGHT → COMMITTED                     train: Trainers.train(keys) — the trainer reads TQ
                                                        clear consumed rows (remove_group, barrier)
                                                          ledger: COMMITTED → CONSUMED, sampler.advance()
                                                        weight sync: trainer → every generator (version t+1)
                                                        the save rule (`sdk.record`): the last step, every
                                                          save_period steps: checkpoint (below)

    checkpoint(step N): the policy and ONE exclusive barrier cut inline (replay index, loader place, sampler
      cursor, ledger, inventory check, TransferQueue snapshot), then commit, report and retention in the
      background, fenced against newer attempts (`checkpoints`, which draws it)
    reports: status.runtime as `sdk.record.AttemptRecord` builds it for programs too, after each checkpoint
    (lastCheckpoint) and, at most once per progress period, after a step (step, reward), one at a time and in order
    (reporting.ProgressReports)
    metrics (`telemetry`, Ray's metrics): each step's time, each committed rollout group, each save's duration and
    barrier window, the restore's duration (measured by setup)

    preemption notice (`notice`; the head pod's preStop hook asks, a task looks every POLL_S): at the next step
      boundary a save of the newest step, if it fits before the deadline (a save of that step already under way
      or done counts: one checkpoint, not two; a selected batch is trained first only if the step and the save
      both fit), then the answer to the hook, and the pump stops: `run()` returns with `notice` set (`Exit.PREEMPTED`)

`__init__` stores its `SingleControllerActorArgs`, declares every attribute and builds nothing. `run()` first
attaches the process-bound plumbing with the token the driver's restore produced (one `Attached` record: connect-only
client, replay buffer over the barrier, reports, checkpoint pipeline, generation fleet, metrics), rebuilding the
replay index and checking it against the rows TransferQueue holds, and only then starts the tasks. What a
checkpoint captures besides the index is a named mapping of `Stateful` parts (`_capture`).

Supervision: every task is named; the first one to fail cancels the others and its
own exception (not a wrapper) is what `run()` raises. The run ends when the train
pump has done `steps` steps.

Concurrency rules (one loop, so "no await between" means atomic):
- a ledger transition happens on the same loop turn as the buffer operation it
  describes, so the cut always sees ledger and index agree;
- `_dispatch` holds `_cond` (the dispatch lock) from choosing a uid until its
  generate call is submitted; a weight sync submits the new weights under the
  same lock, so a generate submitted with version v runs on v's weights (Ray runs
  one caller's calls to one actor in submission order).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol, cast

import torch

from trainingrun_runtime import config, contract
from trainingrun_runtime.dataplane import lifecycle
from trainingrun_runtime.dataplane.barrier import DataPlaneCheckpointBarrier
from trainingrun_runtime.dataplane.replay_buffer import TQReplayBuffer
from trainingrun_runtime.dataplane.replay_index import GroupRows, ReplayConfig
from trainingrun_runtime.driver import (
    checkpoints,
    crashpoints,
    events,
    generation_workers,
    placement,
    restore,
    telemetry,
    trainers,
)
from trainingrun_runtime.errors import PreflightError
from trainingrun_runtime.grpo import objective, trainer
from trainingrun_runtime.rollout import ledger, prompt_loader, samplers
from trainingrun_runtime.sdk import notice, record, reporting

__all__ = [
    "PARTITION",
    "Attached",
    "RunResult",
    "SingleController",
    "SingleControllerActorArgs",
    "Stateful",
    "capacity",
    "group_rows",
]

log = logging.getLogger(__name__)

PARTITION = trainers.PARTITION


def capacity(cfg: config.TrainerConfig) -> int:
    """Groups the replay buffer may hold (reserved + committed): the sampler's window plus one step of slack."""
    return (cfg.sampler.max_staleness + 2) * cfg.prompts_per_step


def replay_config(cfg: config.TrainerConfig) -> ReplayConfig:
    """The replay buffer's shape for a trainer config (what a restore preflights against)."""
    return ReplayConfig(partition=PARTITION, group_size=cfg.grpo.group_size, capacity=capacity(cfg))


def group_rows(uid: int, group_size: int) -> GroupRows:
    """The group id and member sample ids of prompt `uid`: `u<uid>`, `u<uid>:<g>`."""
    return GroupRows(f"u{uid}", tuple(f"u{uid}:{g}" for g in range(group_size)))


@dataclasses.dataclass
class SingleControllerActorArgs:
    """Everything the controller needs, built and (when resuming) restored by `setup_single_controller`."""

    config: config.RuntimeConfig
    run: str
    attempt: int
    root: str
    config_hash: str
    trainers: trainers.Trainers
    generators: list[Any]
    """The first generation workers, each holding the restored version's weights."""
    generation_options: dict[str, Any]
    """Ray actor options of a generation worker (`placement.generation`), for replacements."""
    name_prefix: str
    """`<run>-a<attempt>`: actor names start with it."""
    loader: prompt_loader.PromptLoader
    sampler: samplers.Sampler
    ledger: ledger.Ledger
    restored: restore.Restored
    """What the driver's restore brought back: the data-plane token, the replay index, the last checkpoint."""
    status_reporter: reporting.Reporter
    event_log: events.EventLog
    crash: crashpoints.CrashPoints
    progress_period_s: float = reporting.PROGRESS_PERIOD_S
    """At most one progress report (`status.runtime.step`) per this many seconds; checkpoints report at once."""
    run_uid: str | None = None
    """The TrainingRun's uid: with `attempt`, the owner this driver claimed the run directory as (`fence`)."""
    namespace: str = "default"
    """The TrainingRun's namespace (a label of the driver's metrics)."""
    restore_s: float | None = None
    """How long setup's restore took (verification included); None: a fresh start restored nothing."""
    orphaned: tuple[int, ...] = ()
    """The steps setup set aside as `orphan_step_N` (`status.runtime.orphanedCheckpoints`)."""
    data_fingerprint: str | None = None
    """`spec.trainer.data`'s rows as read (`grpo.dataset.Dataset.fingerprint`), in every manifest; None: the built-in
    task."""


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `run()` returns to the driver."""

    step: int
    weights_sha256: str
    mean_reward: float | None
    rewards: list[float]
    last_checkpoint: contract.CheckpointReport | None
    record: record.AttemptRecord
    """What the attempt did, as its reports said it: the driver's final report is its status (finished or not)."""
    exclusive_s: list[float]
    """The barrier's exclusive window of each checkpoint this attempt wrote (seconds)."""
    notice: notice.Answer | None = None
    """Set when the run stopped on the head pod's preemption notice: what it saved (the driver exits PREEMPTED)."""


class Stateful(Protocol):
    """Restart-facing state that a checkpoint captures (torch.distributed.checkpoint's `Stateful`): it writes
    itself out as a mapping, which `restore` hands back to its `load_state_dict` (whose argument types differ)."""

    def state_dict(self) -> Mapping[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Attached:
    """What `run()` attaches in the actor's process (`_attach`), from the restore's token, before any pump."""

    client: lifecycle.ConnectOnlyDataPlane
    """The connect-only data-plane client (the rows: rewards read back, advantages written)."""
    replay: TQReplayBuffer
    """The replay buffer over that client and the barrier; its index rebuilt from the checkpoint, if any."""
    record: record.AttemptRecord
    """What this attempt did, as its reports say it (`sdk.record`: the SDK's, as a program's)."""
    reports: reporting.ProgressReports
    checkpoints: checkpoints.Checkpoints
    fleet: generation_workers.Fleet
    metrics: telemetry.DriverMetrics


class SingleController:
    """The controller (plain class; `actor()` wraps it as a Ray actor). See the module docstring."""

    def __init__(self, args: SingleControllerActorArgs) -> None:
        # Nothing is built here: setup built `args`; run() attaches the process-bound plumbing (`Attached`).
        self.args: SingleControllerActorArgs = args
        self.version: int = args.sampler.step
        """The policy version dispatches use: the trainer's step at the last weight sync."""
        self.rewards: list[float] = []
        """Each trained step's mean reward, in order."""
        self._attached: Attached | None = None
        self._cond: asyncio.Condition = asyncio.Condition()
        """The dispatch lock: held from choosing a uid until its generate call is submitted, and by a weight sync."""
        self._rows_ready: asyncio.Event = asyncio.Event()
        """Set when a group was committed (or a notice came): a train pump waiting for rows looks again."""
        self._notice: notice.Notice | None = None
        self._answer: notice.Answer | None = None
        self._step_s: float | None = None
        """How long the latest train step took (seconds)."""

    @property
    def attached(self) -> Attached:
        """The plumbing `run()` attached; a RuntimeError before that."""
        if self._attached is None:
            raise RuntimeError("the controller has not attached yet: run() does that first")
        return self._attached

    # -- start-up -------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Attach, restore the index, run the pumps until `steps`; raise the first failure as it was."""
        self._attached = await self._attach()
        tasks = {
            asyncio.create_task(self._train_pump(), name="train-pump"),
            asyncio.create_task(self.attached.fleet.watch(), name="generation-watch"),
            asyncio.create_task(self._watch_notice(), name="notice-watch"),
        }
        for i in range(2 * len(self.attached.fleet.slots)):
            slot = self.attached.fleet.slots[i % len(self.attached.fleet.slots)]
            tasks.add(asyncio.create_task(self._rollout_lane(slot), name=f"rollout-lane-{i}"))
        self.args.event_log.emit("pumps_started", step=self.args.sampler.step, next_uid=self.args.loader.next_uid)
        notice.listen(self.args.root, self.args.run, self.args.attempt)  # the head's preStop hook waits for an answer
        try:
            await _supervise(tasks, until="train-pump")
        except Exception as e:  # a trainer rank lost with its node fails whatever call came first: name it
            await self.args.trainers.raise_if_lost(e)
            raise
        finally:
            notice.stop_listening(self.args.root, self.args.run, self.args.attempt)
            self.attached.fleet.stop()
        await self.attached.reports.drain()  # the driver's final report comes after every report of this actor
        sha = await self.args.trainers.weights_sha256()
        self.args.event_log.emit("finished", step=self.args.sampler.step, weights_sha256=sha)
        mean = None if not self.rewards else self.rewards[-1]
        saved = self.attached.checkpoints
        return RunResult(
            self.args.sampler.step, sha, mean, list(self.rewards), saved.last, self.attached.record,
            list(saved.exclusive_s), self._answer,
        )  # fmt: skip

    async def _attach(self) -> Attached:
        """The process-bound plumbing from the restore's token, and the replay index rebuilt, before any pump."""
        metrics = telemetry.DriverMetrics(self.args.namespace, self.args.run)
        if self.args.restore_s is not None:
            metrics.restored(self.args.restore_s)
        client = await asyncio.to_thread(lifecycle.ConnectOnlyDataPlane.connect, self.args.restored.token)
        self.args.event_log.emit("client_connected")
        barrier = DataPlaneCheckpointBarrier()
        rc = replay_config(self.args.config.trainer)
        replay = TQReplayBuffer(client, barrier, partition=rc.partition, group_size=rc.group_size, capacity=rc.capacity)
        self.args.event_log.emit("buffer_built")
        if self.args.restored.replay_state is not None:
            # Index only, checked against the rows TransferQueue holds; no write to TQ; before any pump.
            await replay.restore(self.args.restored.replay_state, expected_digest=self.args.restored.replay_digest)
            _check_ledger_against_index(self.args.ledger, replay)
        self.args.event_log.emit("index_restored", groups=len(replay), digest=replay.index.digest())
        book = record.AttemptRecord(self.args.attempt, orphaned=self.args.orphaned)
        book.resumed(self.args.restored.last_checkpoint, self.args.restored.rejected)
        reports = reporting.ProgressReports(
            self.args.status_reporter, book.status, period_s=self.args.progress_period_s
        )
        saved = checkpoints.Checkpoints(
            self.args, record=book, client=client, buffer=replay, barrier=barrier, reports=reports, telemetry=metrics
        )
        fleet = generation_workers.Fleet(
            self.args.generators,
            spawn=self._spawn_generator,
            install=self._install_generator,
            replacement_s=self.args.config.generation.replacement_seconds,
            event_log=self.args.event_log,
        )
        return Attached(
            client=client, replay=replay, record=book, reports=reports, checkpoints=saved, fleet=fleet, metrics=metrics
        )

    # -- rollout --------------------------------------------------------------------------------

    def _pick(self) -> tuple[int, int, int] | None:
        """The next (uid, dataset index, version) to generate, moved to IN_FLIGHT; None if nothing may go now."""
        for uid in self.args.ledger.queued():
            version = self.args.sampler.dispatch_version(uid, self.version)
            if version is not None:
                self.args.ledger.dispatched(uid)
                return uid, self.args.ledger.get(uid).index, version
        last = self.args.config.trainer.steps * self.args.config.trainer.prompts_per_step  # nothing past the last step
        if self.args.loader.next_uid < min(self.args.sampler.loader_limit(), last):
            version = self.args.sampler.dispatch_version(self.args.loader.next_uid, self.version)
            if version is not None:
                prompt = self.args.loader.next()
                self.args.ledger.left_loader(prompt.uid, prompt.index)  # no await since loader.next()
                self.args.ledger.dispatched(prompt.uid)
                return prompt.uid, prompt.index, version
        return None

    async def _dispatch(self, slot: generation_workers.Slot) -> tuple[int, int, Any] | None:
        """Choose, reserve and submit one group; (uid, version, ObjectRef of the group), None if `slot` was lost."""
        g = self.args.config.trainer.grpo.group_size
        async with self._cond:
            while True:
                if slot.actor is None or not slot.ready.is_set():
                    return None  # lost while this lane waited for work
                if (picked := self._pick()) is not None:
                    break
                await self._cond.wait()
            uid, index, version = picked
            rows = group_rows(uid, g)
            await self.attached.replay.reserve(rows.group_id, rows.sample_ids, {"uid": uid, "version": version})
            ref = slot.actor.generate.remote(uid, index, version)  # under the lock: no weight sync in between
        return uid, version, ref

    async def _rollout_lane(self, slot: generation_workers.Slot) -> None:
        g = self.args.config.trainer.grpo.group_size
        while True:
            await slot.ready.wait()  # a replaced worker generates once it holds the current weights
            dispatched = await self._dispatch(slot)
            if dispatched is None:
                continue
            uid, version, ref = dispatched
            try:
                group = await ref
            except Exception as e:
                if not generation_workers.is_lost(e):
                    raise
                self.attached.fleet.lost(slot, e)
                await self._return(uid)  # the same prompt, the same sample ids, to another worker
                continue
            if group["version"] != version:
                raise RuntimeError(f"uid {uid}: asked for version {version}, generated with {group['version']}")
            await self.attached.replay.commit(group_rows(uid, g).group_id, group["fields"])
            self.args.ledger.committed(uid, version)  # same loop turn as the commit
            self._rows_ready.set()
            self.attached.metrics.rollout()

    # -- training -------------------------------------------------------------------------------

    async def _next_selection(self) -> samplers.Selection | None:
        """The sampler's next selection, once the committed rows allow one; None when a notice came meanwhile."""
        while True:
            self._rows_ready.clear()
            committed = {int(r.meta["uid"]): int(r.meta["version"]) for r in self.attached.replay.groups()}
            selection = self.args.sampler.select(committed)
            if selection is not None:
                return selection
            if self._notice is not None:
                return None
            await self._rows_ready.wait()

    async def _train_pump(self) -> None:
        tcfg = self.args.config.trainer
        while self.args.sampler.step < tcfg.steps:
            if (found := self._noticed()) is not None:
                await self._stop_on_notice(found)
                return
            self.attached.checkpoints.raise_if_failed()
            selection = await self._next_selection()
            if selection is None:
                continue
            if selection.drop:
                await self._drop(selection.drop)
            if not selection.train:
                continue
            if (found := self._noticed()) is not None and not self._step_fits(found):
                continue  # the batch stays committed; the boundary saves without this step
            started = time.monotonic()
            step = self.args.sampler.step
            keys = [sid for uid in selection.train for sid in group_rows(uid, tcfg.grpo.group_size).sample_ids]
            reward = await self._advantage_stage(keys, len(selection.train))
            stats = await self.args.trainers.train(PARTITION, keys)
            self.args.crash.reach("trained", step + 1)
            for uid in selection.train:
                await self.attached.replay.remove_group(group_rows(uid, tcfg.grpo.group_size).group_id)
            self.args.ledger.consumed(selection.train, step)  # the cut cannot fall here: saves run in this task
            self.args.sampler.advance()
            self.rewards.append(reward)
            await self._sync_weights()
            done = self.args.sampler.step
            self.args.event_log.emit("step_done", step=done, reward=reward)
            self.attached.record.progress(done, reward)
            self.attached.reports.step_done()  # status.runtime.step, in the background, at most once per period
            if done % tcfg.log_every == 0 or done == tcfg.steps:
                log.info("step %d: reward %.3f loss %.4f clip %.3f", done, reward, stats["loss"], stats["clip_frac"])
            self._step_s = time.monotonic() - started
            self.attached.metrics.step(self._step_s)
            reason = self.attached.record.save_reason(
                done, save_period=self.args.config.checkpoint.save_period, now=time.time(), last_step=tcfg.steps
            )
            if reason is not None:
                await self.attached.checkpoints.save(done, reward, self._capture, reason)
        await self.attached.checkpoints.settle()
        if self._notice is not None:  # it came with the last step: the final checkpoint answers it
            notice.answer(
                self.args.root,
                self.args.run,
                self.args.attempt,
                notice.Answer(self.args.sampler.step, "the run finished"),
            )

    # -- preemption notice ----------------------------------------------------------------------

    def _noticed(self) -> notice.Notice | None:
        """The head pod's notice, if it came (a file read: the pump asks at every step boundary)."""
        if self._notice is None:
            found = notice.pending(self.args.root, self.args.run, self.args.attempt)
            if found is not None:
                self._notice = found
                self.args.event_log.emit(
                    "notice", reason=found.reason, seconds_left=round(found.deadline - time.time(), 3)
                )
                log.warning("preemption notice (%s): saving at the next step boundary if it fits", found.reason)
                self._rows_ready.set()  # a pump waiting for rows looks again
        return self._notice

    async def _watch_notice(self) -> None:
        """Look for the notice every POLL_S, for a pump that waits for rows. Runs until the pump ends."""
        while self._noticed() is None:
            await asyncio.sleep(notice.POLL_S)
        await asyncio.Event().wait()

    def _step_fits(self, n: notice.Notice) -> bool:
        """Whether one more train step and then a save end before the notice's deadline."""
        return notice.time_for_a_save(time.time(), n.deadline, self.attached.record.save_s, self._step_s or 0.0)

    async def _stop_on_notice(self, n: notice.Notice) -> None:
        """At a step boundary after the notice: make sure the newest step is saved if that fits, then answer."""
        saves = self.attached.checkpoints
        step = self.args.sampler.step
        answer = notice.Answer(step=None, why="")
        try:
            under_way = saves.committing
            # A save under way finishes either way (an older step's is worth having).
            await saves.settle_for_the_notice()
            if saves.last is not None and saves.last["step"] == step:  # one checkpoint of this step, not two
                how = "was being saved when the notice came" if under_way == step else "was saved already"
                await saves.answers_notice()
                answer = notice.Answer(step, f"step {step} {how}")
            elif (reason := self._save_on(n, step)) is not None:
                reward = self.rewards[-1] if self.rewards else None
                await saves.save(step, reward, self._capture, reason)
                await saves.settle_for_the_notice()
                saved = saves.last is not None and saves.last["step"] == step
                answer = notice.Answer(step if saved else None, "saved on the notice" if saved else "save abandoned")
            else:
                left = n.deadline - time.time()
                took = self.attached.record.save_s
                answer = notice.Answer(None, f"no time for a save ({left:.1f}s left; a save takes {took}s)")
        finally:
            self._answer = answer
            notice.answer(self.args.root, self.args.run, self.args.attempt, answer)
            self.args.event_log.emit("notice_answered", step=answer.step, why=answer.why, at_step=step)
        log.warning("stopping at step %d on the notice: %s", step, answer.why)

    def _save_on(self, n: notice.Notice, step: int) -> contract.CheckpointReason | None:
        """The save rule (`sdk.record`) at the boundary after the notice: PreemptionNotice if a save still fits."""
        period = self.args.config.checkpoint.save_period
        return self.attached.record.save_reason(step, save_period=period, now=time.time(), notice=n)

    async def _return(self, uid: int) -> None:
        """A prompt whose worker was lost goes back to the queue: its reservation dropped, nothing was stored."""
        rows = group_rows(uid, self.args.config.trainer.grpo.group_size)
        async with self._cond:
            await self.attached.replay.cancel(rows.group_id)
            self.args.ledger.returned(uid)  # same loop turn as the cancel
            self._cond.notify_all()

    def _spawn_generator(self, index: int, incarnation: int) -> Any:
        name = f"{self.args.name_prefix}-gen-{index}-r{incarnation}"
        return generation_workers.spawn(self.args.config.trainer, name, self.args.generation_options)

    async def _install_generator(self, slot: generation_workers.Slot, actor: Any) -> None:
        """Give a replacement the current weights; from here on every weight sync reaches it too (same lock)."""
        async with self._cond:
            slot.actor = actor
            load = actor.load_weights.remote(self.version, self.args.trainers.weights_ref())
        await load

    async def _drop(self, uids: tuple[int, ...]) -> None:
        g = self.args.config.trainer.grpo.group_size
        async with self._cond:
            for uid in uids:
                await self.attached.replay.remove_group(group_rows(uid, g).group_id)
                self.args.ledger.dropped(uid)  # same loop turn as the removal
            self._cond.notify_all()

    async def _advantage_stage(self, keys: list[str], prompts: int) -> float:
        """Read the batch's rewards back, write group-normalised advantages onto the same keys; mean reward."""
        g = self.args.config.trainer.grpo
        rows = await asyncio.to_thread(self.attached.client.read_rows, PARTITION, keys, ["rewards"])
        rewards = rows["rewards"]
        assert isinstance(rewards, torch.Tensor)
        trainer.deterministic()  # TransferQueue's reads reset torch's thread count; put it back
        advantages = objective.group_advantages(rewards.view(prompts, g.group_size), g.adv_eps).flatten()
        await asyncio.to_thread(self.attached.client.update_fields, PARTITION, keys, {"advantages": advantages})
        return float(rewards.mean())

    async def _sync_weights(self) -> None:
        """Send the trainer's new weights to every generator; later dispatches use the new version."""
        async with self._cond:
            weights = self.args.trainers.weights_ref()
            slots = self.attached.fleet.with_actors()
            loads = [cast(Any, slot.actor).load_weights.remote(self.args.sampler.step, weights) for slot in slots]
            self.version = self.args.sampler.step
            self._cond.notify_all()
        for slot, result in zip(slots, await asyncio.gather(*loads, return_exceptions=True), strict=True):
            if isinstance(result, BaseException):
                if not generation_workers.is_lost(result):
                    raise result
                self.attached.fleet.lost(slot, result)  # its lanes return what they had in flight

    # -- checkpoint -----------------------------------------------------------------------------

    def _stateful(self) -> dict[str, Stateful]:
        """The restart-facing state a checkpoint captures besides the index, by the name it is saved under."""
        return {"loader": self.args.loader, "sampler": self.args.sampler, "ledger": self.args.ledger}

    def _capture(self) -> dict[str, Any]:
        """Every restart-facing read besides the index (`_stateful`, and the policy version); called by the snapshot
        inside the exclusive cut."""
        captured: dict[str, Any] = {name: dict(part.state_dict()) for name, part in self._stateful().items()}
        captured["version"] = self.version
        return captured


def _check_ledger_against_index(the_ledger: ledger.Ledger, replay: TQReplayBuffer) -> None:
    """PreflightError unless the ledger's committed uids are the groups the rebuilt index holds."""
    committed_uids = sorted(int(g.meta["uid"]) for g in replay.groups())
    ledger_uids = the_ledger.in_state(ledger.State.COMMITTED)
    if committed_uids != ledger_uids:
        raise PreflightError(f"ledger.json says committed {ledger_uids[:8]}…, replay index holds {committed_uids[:8]}…")


async def _supervise(tasks: set[asyncio.Task[None]], *, until: str) -> None:
    """Wait until the task named `until` returns (then cancel the rest) or any task fails (re-raise it)."""
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed = [t for t in done if not t.cancelled() and t.exception() is not None]
            if failed:
                first = failed[0]
                log.error("task %s failed: %r; stopping the run", first.get_name(), first.exception())
                raise first.exception()  # type: ignore[misc]
            if any(t.get_name() == until for t in done):
                return
            if done:
                names = ", ".join(sorted(t.get_name() for t in done))
                raise RuntimeError(f"task(s) {names} ended on their own; they must run until the train pump ends")
    finally:
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending)


def actor(name: str, head: str) -> Any:
    """The Ray actor class for `SingleController`, named `name`, on the head (one asyncio loop: an async actor)."""
    import ray

    actor_cls: Any = ray.remote(SingleController)
    return actor_cls.options(name=name, num_cpus=0, max_restarts=0, max_concurrency=1000, **placement.on_head(head))
