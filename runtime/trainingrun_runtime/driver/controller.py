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
                                                        every save_period steps: checkpoint (below)

    checkpoint(step N): the policy and ONE exclusive barrier cut inline (replay index, loader place, sampler
      cursor, ledger, inventory check, TransferQueue snapshot), then commit, report and retention in the
      background, fenced against newer attempts (`checkpoints`, which draws it)
    reports: status.runtime after each checkpoint (lastCheckpoint) and, at most once per progress period,
    after a step (step, reward), one at a time and in order (reporting.ProgressReports)
    metrics (`telemetry`, Ray's metrics): each step's time, each committed rollout group, each save's duration and
    barrier window, the restore's duration (measured by setup)

    preemption notice (`notice`; the head pod's preStop hook asks, a task looks every POLL_S): at the next step
      boundary a save of the newest step, if it fits before the deadline (a save of that step already under way
      or done counts: one checkpoint, not two; a selected batch is trained first only if the step and the save
      both fit), then the answer to the hook, and the pump stops: `run()` returns with `notice` set (`Exit.PREEMPTED`)

`__init__` stores its `SingleControllerActorArgs` and builds nothing. `run()` first
attaches the process-bound plumbing with the token the driver's restore produced
(connect-only client, barrier, replay buffer, checkpoint pipeline), rebuilds the replay
index and checks it against the rows TransferQueue holds, and only then starts the tasks.

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
from typing import Any, cast

import torch

from trainingrun_runtime import config, contract, timestamps
from trainingrun_runtime.dataplane import lifecycle
from trainingrun_runtime.dataplane.barrier import DataPlaneCheckpointBarrier
from trainingrun_runtime.dataplane.replay_buffer import TQReplayBuffer
from trainingrun_runtime.dataplane.replay_index import GroupRows, ReplayConfig
from trainingrun_runtime.driver import (
    checkpoints,
    crashpoints,
    events,
    generation_workers,
    notice,
    placement,
    reporting,
    restore,
    telemetry,
    trainers,
)
from trainingrun_runtime.errors import PreflightError
from trainingrun_runtime.grpo import objective, trainer
from trainingrun_runtime.rollout import ledger, prompt_loader, samplers

__all__ = ["PARTITION", "RunResult", "SingleController", "SingleControllerActorArgs", "capacity", "group_rows"]

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


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What `run()` returns to the driver."""

    step: int
    weights_sha256: str
    mean_reward: float | None
    rewards: list[float]
    last_checkpoint: contract.CheckpointReport | None
    exclusive_s: list[float]
    """The barrier's exclusive window of each checkpoint this attempt wrote (seconds)."""
    notice: notice.Answer | None = None
    """Set when the run stopped on the head pod's preemption notice: what it saved (the driver exits PREEMPTED)."""


class SingleController:
    """The controller (plain class; `actor()` wraps it as a Ray actor). See the module docstring."""

    def __init__(self, args: SingleControllerActorArgs) -> None:
        self.args = args  # nothing is built here: setup built it, run() attaches it

    # -- start-up -------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Attach, restore the index, run the pumps until `steps`; raise the first failure as it was."""
        a = self.args
        self.telemetry = telemetry.DriverMetrics(a.namespace, a.run)
        if a.restore_s is not None:
            self.telemetry.restored(a.restore_s)
        await self._attach()
        self._cond = asyncio.Condition()
        self._rows_ready = asyncio.Event()
        self.version = a.sampler.step
        self.rewards: list[float] = []
        self._notice: notice.Notice | None = None
        self._answer: notice.Answer | None = None
        self._step_s: float | None = None
        self.fleet = generation_workers.Fleet(
            a.generators,
            spawn=self._spawn_generator,
            install=self._install_generator,
            replacement_s=a.config.generation.replacement_seconds,
            event_log=a.event_log,
        )
        tasks = {
            asyncio.create_task(self._train_pump(), name="train-pump"),
            asyncio.create_task(self.fleet.watch(), name="generation-watch"),
            asyncio.create_task(self._watch_notice(), name="notice-watch"),
        }
        for i in range(2 * len(self.fleet.slots)):
            slot = self.fleet.slots[i % len(self.fleet.slots)]
            tasks.add(asyncio.create_task(self._rollout_lane(slot), name=f"rollout-lane-{i}"))
        a.event_log.emit("pumps_started", step=a.sampler.step, next_uid=a.loader.next_uid)
        notice.listen(a.root, a.run, a.attempt)  # from here on, the head's preStop hook waits for an answer
        try:
            await _supervise(tasks, until="train-pump")
        finally:
            notice.stop_listening(a.root, a.run, a.attempt)
            self.fleet.stop()
        await self.reports.drain()  # the driver's final report comes after every report of this actor
        sha = await a.trainers.weights_sha256()
        a.event_log.emit("finished", step=a.sampler.step, weights_sha256=sha)
        mean = None if not self.rewards else self.rewards[-1]
        ckpt = self.checkpoints
        return RunResult(a.sampler.step, sha, mean, list(self.rewards), ckpt.last, list(ckpt.exclusive_s), self._answer)

    async def _attach(self) -> None:
        """The process-bound plumbing from the restore's token, and the replay index rebuilt, before any pump."""
        a = self.args
        self.client = await asyncio.to_thread(lifecycle.ConnectOnlyDataPlane.connect, a.restored.token)
        a.event_log.emit("client_connected")
        barrier = DataPlaneCheckpointBarrier()
        rc = replay_config(a.config.trainer)
        self.replay = TQReplayBuffer(
            self.client, barrier, partition=rc.partition, group_size=rc.group_size, capacity=rc.capacity
        )
        a.event_log.emit("buffer_built")
        if a.restored.replay_state is not None:
            # Index only, checked against the rows TransferQueue holds; no write to TQ; before any pump.
            await self.replay.restore(a.restored.replay_state, expected_digest=a.restored.replay_digest)
            self._check_ledger_against_index()
        a.event_log.emit("index_restored", groups=len(self.replay), digest=self.replay.index.digest())
        self.reports = reporting.ProgressReports(
            a.status_reporter,
            lambda: self.status(a.sampler.step, self.rewards[-1] if self.rewards else None, finished=False),
            period_s=a.progress_period_s,
        )
        self.checkpoints = checkpoints.Checkpoints(
            a, client=self.client, buffer=self.replay, barrier=barrier, reports=self.reports, telemetry=self.telemetry
        )

    def _check_ledger_against_index(self) -> None:
        committed_uids = sorted(int(g.meta["uid"]) for g in self.replay.groups())
        ledger_uids = self.args.ledger.in_state(ledger.State.COMMITTED)
        if committed_uids != ledger_uids:
            raise PreflightError(
                f"ledger.json says committed {ledger_uids[:8]}…, replay index holds {committed_uids[:8]}…"
            )

    # -- rollout --------------------------------------------------------------------------------

    def _pick(self) -> tuple[int, int, int] | None:
        """The next (uid, dataset index, version) to generate, moved to IN_FLIGHT; None if nothing may go now."""
        a = self.args
        for uid in a.ledger.queued():
            version = a.sampler.dispatch_version(uid, self.version)
            if version is not None:
                a.ledger.dispatched(uid)
                return uid, a.ledger.get(uid).index, version
        last = a.config.trainer.steps * a.config.trainer.prompts_per_step  # nothing past the last step
        if a.loader.next_uid < min(a.sampler.loader_limit(), last):
            version = a.sampler.dispatch_version(a.loader.next_uid, self.version)
            if version is not None:
                prompt = a.loader.next()
                a.ledger.left_loader(prompt.uid, prompt.index)  # no await since loader.next()
                a.ledger.dispatched(prompt.uid)
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
            await self.replay.reserve(rows.group_id, rows.sample_ids, {"uid": uid, "version": version})
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
                self.fleet.lost(slot, e)
                await self._return(uid)  # the same prompt, the same sample ids, to another worker
                continue
            if group["version"] != version:
                raise RuntimeError(f"uid {uid}: asked for version {version}, generated with {group['version']}")
            fields = {
                "tokens": group["tokens"],
                "logprobs": group["logprobs"],
                "rewards": group["rewards"],
            }
            await self.replay.commit(group_rows(uid, g).group_id, fields)
            self.args.ledger.committed(uid, version)  # same loop turn as the commit
            self._rows_ready.set()
            self.telemetry.rollout()

    # -- training -------------------------------------------------------------------------------

    async def _next_selection(self) -> samplers.Selection | None:
        """The sampler's next selection, once the committed rows allow one; None when a notice came meanwhile."""
        a = self.args
        while True:
            self._rows_ready.clear()
            committed = {int(r.meta["uid"]): int(r.meta["version"]) for r in self.replay.groups()}
            selection = a.sampler.select(committed)
            if selection is not None:
                return selection
            if self._notice is not None:
                return None
            await self._rows_ready.wait()

    async def _train_pump(self) -> None:
        a = self.args
        tcfg = a.config.trainer
        while a.sampler.step < tcfg.steps:
            if (found := self._noticed()) is not None:
                await self._stop_on_notice(found)
                return
            self.checkpoints.raise_if_failed()
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
            step = a.sampler.step
            keys = [sid for uid in selection.train for sid in group_rows(uid, tcfg.grpo.group_size).sample_ids]
            reward = await self._advantage_stage(keys, len(selection.train))
            stats = await a.trainers.train(PARTITION, keys)
            a.crash.reach("trained", step + 1)
            for uid in selection.train:
                await self.replay.remove_group(group_rows(uid, tcfg.grpo.group_size).group_id)
            a.ledger.consumed(selection.train, step)  # the cut cannot fall here: saves run in this task
            a.sampler.advance()
            self.rewards.append(reward)
            await self._sync_weights()
            done = a.sampler.step
            a.event_log.emit("step_done", step=done, reward=reward)
            self.reports.step_done()  # status.runtime.step, in the background, at most once per period
            if done % tcfg.log_every == 0 or done == tcfg.steps:
                log.info("step %d: reward %.3f loss %.4f clip %.3f", done, reward, stats["loss"], stats["clip_frac"])
            self._step_s = time.monotonic() - started
            self.telemetry.step(self._step_s)
            if done == tcfg.steps:
                await self.checkpoints.save(done, reward, self._capture, contract.CheckpointReason.FINAL)
            elif done % a.config.checkpoint.save_period == 0:
                await self.checkpoints.save(done, reward, self._capture, contract.CheckpointReason.PERIODIC)
        await self.checkpoints.settle()
        if self._notice is not None:  # it came with the last step: the final checkpoint answers it
            notice.answer(a.root, a.run, a.attempt, notice.Answer(a.sampler.step, "the run finished"))

    # -- preemption notice ----------------------------------------------------------------------

    def _noticed(self) -> notice.Notice | None:
        """The head pod's notice, if it came (a file read: the pump asks at every step boundary)."""
        if self._notice is None:
            a = self.args
            found = notice.pending(a.root, a.run, a.attempt)
            if found is not None:
                self._notice = found
                a.event_log.emit("notice", reason=found.reason, seconds_left=round(found.deadline - time.time(), 3))
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
        return notice.time_for_a_save(time.time(), n.deadline, self.checkpoints.save_s, self._step_s or 0.0)

    async def _stop_on_notice(self, n: notice.Notice) -> None:
        """At a step boundary after the notice: make sure the newest step is saved if that fits, then answer."""
        a, ckpt = self.args, self.checkpoints
        step = a.sampler.step
        answer = notice.Answer(step=None, why="")
        try:
            under_way = ckpt.committing
            await ckpt.settle_for_the_notice()  # a save under way finishes either way (an older step's is worth having)
            if ckpt.last is not None and ckpt.last["step"] == step:  # one checkpoint of this step, not two
                how = "was being saved when the notice came" if under_way == step else "was saved already"
                await ckpt.answers_notice()
                answer = notice.Answer(step, f"step {step} {how}")
            elif notice.time_for_a_save(time.time(), n.deadline, ckpt.save_s):
                reward = self.rewards[-1] if self.rewards else None
                await ckpt.save(step, reward, self._capture, contract.CheckpointReason.PREEMPTION_NOTICE)
                await ckpt.settle_for_the_notice()
                saved = ckpt.last is not None and ckpt.last["step"] == step
                answer = notice.Answer(step if saved else None, "saved on the notice" if saved else "save abandoned")
            else:
                left = n.deadline - time.time()
                answer = notice.Answer(None, f"no time for a save ({left:.1f}s left; a save takes {ckpt.save_s}s)")
        finally:
            self._answer = answer
            notice.answer(a.root, a.run, a.attempt, answer)
            a.event_log.emit("notice_answered", step=answer.step, why=answer.why, at_step=step)
        log.warning("stopping at step %d on the notice: %s", step, answer.why)

    async def _return(self, uid: int) -> None:
        """A prompt whose worker was lost goes back to the queue: its reservation dropped, nothing was stored."""
        rows = group_rows(uid, self.args.config.trainer.grpo.group_size)
        async with self._cond:
            await self.replay.cancel(rows.group_id)
            self.args.ledger.returned(uid)  # same loop turn as the cancel
            self._cond.notify_all()

    def _spawn_generator(self, index: int, incarnation: int) -> Any:
        a = self.args
        name = f"{a.name_prefix}-gen-{index}-r{incarnation}"
        return generation_workers.spawn(a.config.trainer, name, a.generation_options)

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
                await self.replay.remove_group(group_rows(uid, g).group_id)
                self.args.ledger.dropped(uid)  # same loop turn as the removal
            self._cond.notify_all()

    async def _advantage_stage(self, keys: list[str], prompts: int) -> float:
        """Read the batch's rewards back, write group-normalised advantages onto the same keys; mean reward."""
        g = self.args.config.trainer.grpo
        rows = await asyncio.to_thread(self.client.read_rows, PARTITION, keys, ["rewards"])
        rewards = rows["rewards"]
        assert isinstance(rewards, torch.Tensor)
        trainer.deterministic()  # TransferQueue's reads reset torch's thread count; put it back
        advantages = objective.group_advantages(rewards.view(prompts, g.group_size), g.adv_eps).flatten()
        await asyncio.to_thread(self.client.update_fields, PARTITION, keys, {"advantages": advantages})
        return float(rewards.mean())

    async def _sync_weights(self) -> None:
        """Send the trainer's new weights to every generator; later dispatches use the new version."""
        a = self.args
        async with self._cond:
            weights = a.trainers.weights_ref()
            slots = self.fleet.with_actors()
            loads = [cast(Any, slot.actor).load_weights.remote(a.sampler.step, weights) for slot in slots]
            self.version = a.sampler.step
            self._cond.notify_all()
        for slot, result in zip(slots, await asyncio.gather(*loads, return_exceptions=True), strict=True):
            if isinstance(result, BaseException):
                if not generation_workers.is_lost(result):
                    raise result
                self.fleet.lost(slot, result)  # its lanes return what they had in flight

    # -- checkpoint -----------------------------------------------------------------------------

    def _capture(self) -> dict[str, Any]:
        """Every restart-facing read besides the index; called by the snapshot inside the exclusive cut."""
        a = self.args
        return {
            "loader": dict(a.loader.state_dict()),
            "sampler": dict(a.sampler.state_dict()),
            "ledger": a.ledger.state_dict(),
            "version": self.version,
        }

    def status(self, step: int, reward: float | None, *, finished: bool) -> contract.RuntimeStatus:
        """`status.runtime` as of now."""
        return contract.RuntimeStatus(
            attempt=self.args.attempt,
            step=step,
            reward=reward,
            updated=timestamps.now(),
            lastCheckpoint=self.checkpoints.last,
            restoreError=None,
            finished=finished,
            badCheckpoints=list(self.args.restored.rejected),
            orphanedCheckpoints=list(self.args.orphaned),
        )


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
