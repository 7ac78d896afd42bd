"""Memory of pods that left with a platform-side cause, filled from the pod watch stream. asyncio-free, pure.

An evicted or preempted pod may be gone before the next reconcile lists pods; then only "the head is gone"
would remain, and the attempt would be charged as an infrastructure failure. The pod watch (handlers.py)
records each disrupted pod here the moment it is seen; the reconciler passes the records of the current
attempt's vanished pods to the decision as `AttemptObservation.departed`, so the attempt is classified by its
real cause (Preempted). Worker pods seen being deleted are remembered too: a worker deleted and gone between two
passes is still counted as lost (`classification.lost_workers`). The memory is per process: after an operator
restart it is empty (the attempt is then classified from what is still visible, and the workers already counted
are in the status), and it is bounded per run.
"""

from __future__ import annotations

from trainingrun_operator.core.observation import PodObservation, disrupted

__all__ = ["Departures"]

MAX_PER_RUN = 64


class Departures:
    """(namespace, run) -> {pod name: (attempt label, last disrupted observation)}."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], dict[str, tuple[str, PodObservation]]] = {}

    def record(self, namespace: str, run: str, attempt: str, pod: PodObservation) -> None:
        """Remember `pod` if it shows a disruption cause, or is a worker being deleted (others are ignored)."""
        if not (disrupted(pod) or (pod.deleting and not pod.is_head)):
            return
        pods = self._seen.setdefault((namespace, run), {})
        pods[pod.name] = (attempt, pod)
        while len(pods) > MAX_PER_RUN:
            pods.pop(next(iter(pods)))

    def of_attempt(self, namespace: str, run: str, attempt: int, present: set[str]) -> tuple[PodObservation, ...]:
        """Remembered pods of `attempt` that are no longer `present` (the caller counts a pod being deleted as
        no longer present)."""
        pods = self._seen.get((namespace, run), {})
        return tuple(p for a, p in pods.values() if a == str(attempt) and p.name not in present)

    def forget(self, namespace: str, run: str) -> None:
        self._seen.pop((namespace, run), None)
