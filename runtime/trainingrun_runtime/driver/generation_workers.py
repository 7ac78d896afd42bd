"""Generation workers: Ray actors that sample GRPO groups with versioned policy weights.

    trainer ──weights(version v)──► Generator.load_weights(v, ·)      (weight sync, after each train step)
    controller ──generate(uid, index, version)──► Generator ──► rows {tokens, logprobs, rewards} of version v

A `Generator` is a plain class (tested without Ray); `spawn` wraps it as a Ray actor, placed by
`placement.generation` (on the worker groups when the run has them). `Fleet` keeps the controller's
generation workers: one `Slot` per worker, a lost worker (its pod or node gone) replaced as soon as Ray
has room again, and the attempt given up when none is back within the bound. Each actor holds exactly
one policy version. `generate` with an explicit version
(the in_order sampler) refuses to run on other weights — a scheduling bug, not a
retry; with `version=None` (the async sampler) it uses whatever it holds and says
which. The sample itself is a function of (weights, seed, uid, row, version) only
(`group_sampling.sample_group`), so which actor runs it does not matter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypedDict

import torch

from trainingrun_runtime import config
from trainingrun_runtime.driver import events
from trainingrun_runtime.errors import GenerationLost
from trainingrun_runtime.grpo import group_sampling, trainer, workload

__all__ = ["Fleet", "GeneratedGroup", "Generator", "Slot", "is_lost", "spawn"]

log = logging.getLogger(__name__)


class GeneratedGroup(TypedDict):
    """What `generate` returns: one group's row fields (`group_sampling.Group.fields`) and the version that produced
    them."""

    uid: int
    version: int
    fields: dict[str, torch.Tensor]


class Generator:
    """One copy of the policy at one version, and the sampler that uses it."""

    def __init__(self, cfg: config.TrainerConfig) -> None:
        trainer.deterministic()
        self.cfg = cfg
        self.work = workload.Workload(cfg)
        self.model = self.work.new_model().eval()
        self.version = 0

    def load_weights(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        """Replace the weights with those of `version`; returns the version now held."""
        self.model.load_state_dict(weights)
        self.version = version
        return version

    def current_version(self) -> int:
        """The version of the weights held now."""
        return self.version

    def generate(self, uid: int, index: int, version: int | None) -> GeneratedGroup:
        """Sample the group of prompt `uid` (dataset `index`) with the held weights."""
        if version is not None and version != self.version:
            raise RuntimeError(
                f"asked to generate uid {uid} with version {version}, but this worker holds {self.version}"
            )
        group = group_sampling.sample_group(self.model, self.work, index, uid=uid, version=self.version)
        return GeneratedGroup(uid=uid, version=self.version, fields=group.fields(self.work.variable))


def spawn(cfg: config.TrainerConfig, name: str, options: Mapping[str, Any]) -> Any:
    """One Generator actor named `name`, placed by `options` (`placement.generation`; `num_cpus=0`: tiny, CPU)."""
    import ray

    actor_cls = ray.remote(num_cpus=0, max_restarts=0)(Generator)
    return actor_cls.options(name=name, **options).remote(cfg)


def is_lost(error: BaseException) -> bool:
    """Whether a call failed because its actor is gone (its pod, its node or its process died), not by its own fault."""
    from ray.exceptions import RayActorError

    return isinstance(error, RayActorError)


@dataclasses.dataclass(eq=False)
class Slot:
    """One generation worker's place: the actor serving it now, and whether that actor holds the current weights."""

    index: int
    actor: Any | None
    """The actor (None from its loss until a replacement exists). Weight syncs go to every slot that has one."""
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set while the actor holds the current weights and may generate."""
    incarnation: int = 0


class Fleet:
    """The controller's generation workers: a lost one is replaced as soon as Ray has room, synced before it generates.

        lost(slot)   ─► the slot's lanes wait; a replacement actor is created (pending until Ray has room: KubeRay
                        recreates the worker pod), `install(slot, actor)` gives it the current weights under the
                        controller's dispatch lock, and the slot is ready again
        watch()      ─► raises GenerationLost once no slot has been ready for `replacement_s` seconds, and any
                        error of a replacement other than its actor being lost again (which is retried)

    `spawn(index, incarnation)` creates an actor; `install` belongs to the controller (only it knows the current
    version, and it must not sync weights in between). Runs on the controller's loop; no locks of its own.
    """

    def __init__(
        self,
        actors: list[Any],
        *,
        spawn: Callable[[int, int], Any],
        install: Callable[[Slot, Any], Awaitable[None]],
        replacement_s: float,
        event_log: events.EventLog,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = 1.0,
    ) -> None:
        self.slots = [Slot(i, actor) for i, actor in enumerate(actors)]
        for slot in self.slots:
            slot.ready.set()  # setup gave every first actor the weights of the restored version
        self._spawn = spawn
        self._install = install
        self._replacement_s = replacement_s
        self._events = event_log
        self._clock = clock
        self._retry_s = retry_s
        self._none_ready = asyncio.Event()
        self._some_ready = asyncio.Event()
        self._some_ready.set()
        self._none_since = 0.0
        self._failed: list[BaseException] = []
        self._failure = asyncio.Event()
        self._replacing: dict[int, asyncio.Task[None]] = {}
        self.lost_count = 0

    def with_actors(self) -> list[Slot]:
        """The slots that have an actor now (ready, or being given the weights): every weight sync goes to these."""
        return [slot for slot in self.slots if slot.actor is not None]

    def lost(self, slot: Slot, error: BaseException) -> None:
        """`slot`'s actor is gone: stop dispatching to it and start its replacement (once per loss)."""
        if slot.actor is None:
            return  # another lane of the same slot saw it first
        log.warning("generation worker %d (incarnation %d) lost: %s", slot.index, slot.incarnation, error)
        slot.actor, self.lost_count = None, self.lost_count + 1
        slot.ready.clear()
        self._events.emit("generator_lost", slot=slot.index, incarnation=slot.incarnation, error=str(error)[:200])
        if not any(s.ready.is_set() for s in self.slots):
            self._some_ready.clear()
            self._none_ready.set()
            self._none_since = self._clock()
        if slot.index not in self._replacing:  # a replacement lost during its install retries by itself
            task = asyncio.create_task(self._replace(slot), name=f"replace-generator-{slot.index}")
            self._replacing[slot.index] = task
            task.add_done_callback(lambda _: self._replacing.pop(slot.index, None))

    async def _replace(self, slot: Slot) -> None:
        try:
            while True:
                incarnation = slot.incarnation + 1
                actor = self._spawn(slot.index, incarnation)
                slot.incarnation = incarnation
                try:
                    await actor.__ray_ready__.remote()  # its process is up: Ray found room for it
                    await self._install(slot, actor)  # slot.actor set under the dispatch lock; weights loaded
                    break
                except Exception as e:
                    if not is_lost(e):
                        raise
                    slot.actor = None  # lost again before it could generate (its new node went too): retry
                    log.warning("replacement of generation worker %d lost before it was ready: %s", slot.index, e)
                    await asyncio.sleep(self._retry_s)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self._failed.append(e)
            self._failure.set()
            return
        slot.ready.set()
        self._some_ready.set()
        self._none_ready.clear()
        self._events.emit("generator_replaced", slot=slot.index, incarnation=slot.incarnation)
        log.info("generation worker %d replaced (incarnation %d)", slot.index, slot.incarnation)

    async def watch(self) -> None:
        """Run until cancelled; raise GenerationLost when no generation worker has been ready for the bound."""
        while True:
            await _first(self._none_ready.wait(), self._failure.wait())
            self._raise_failure()
            left = self._none_since + self._replacement_s - self._clock()
            await _first(self._some_ready.wait(), self._failure.wait(), timeout=max(0.0, left))
            self._raise_failure()
            if not self._some_ready.is_set():
                raise GenerationLost(
                    f"no generation worker for {self._replacement_s:g} s (spec.restartPolicy.workerReplacementSeconds)"
                    f"; {self.lost_count} lost in this attempt, none back in time: the attempt ends and the next "
                    "resumes from the newest checkpoint"
                )

    def _raise_failure(self) -> None:
        if self._failed:
            raise self._failed[0]

    def stop(self) -> None:
        """Cancel replacements in flight (the run is over)."""
        for replacing in list(self._replacing.values()):
            replacing.cancel()


async def _first(*waits: Awaitable[Any], timeout: float | None = None) -> None:
    """Wait until the first of `waits` is done (or `timeout` seconds pass); cancel the rest."""
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future in futures:
            future.cancel()
