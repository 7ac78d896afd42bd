"""The phase transition table: what may follow what, and that terminal phases are final."""

from __future__ import annotations

import itertools

import pytest

from trainingrun_operator.core import errors
from trainingrun_operator.core.phases import TERMINAL, TRANSITIONS, Phase, check_transition

P = Phase
ALLOWED = {
    (P.PENDING, P.QUEUED),
    (P.PENDING, P.STARTING),
    (P.QUEUED, P.STARTING),
    (P.QUEUED, P.RUNNING),
    (P.QUEUED, P.RESTARTING),
    (P.QUEUED, P.SUSPENDED),
    (P.QUEUED, P.SUCCEEDED),
    (P.QUEUED, P.FAILED),
    (P.STARTING, P.QUEUED),
    (P.PENDING, P.SUSPENDED),
    (P.PENDING, P.FAILED),
    (P.STARTING, P.RUNNING),
    (P.STARTING, P.RESTARTING),
    (P.STARTING, P.SUSPENDED),
    (P.STARTING, P.SUCCEEDED),
    (P.STARTING, P.FAILED),
    (P.RUNNING, P.RESTARTING),
    (P.RUNNING, P.SUSPENDED),
    (P.RUNNING, P.SUCCEEDED),
    (P.RUNNING, P.FAILED),
    (P.RESTARTING, P.QUEUED),
    (P.RESTARTING, P.STARTING),
    (P.RESTARTING, P.SUSPENDED),
    (P.RESTARTING, P.FAILED),
    (P.SUSPENDED, P.QUEUED),
    (P.SUSPENDED, P.STARTING),
    (P.SUSPENDED, P.FAILED),
}


@pytest.mark.parametrize(("source", "target"), sorted(itertools.product(Phase, Phase)))
def test_transition_is_allowed_exactly_when_listed(source: Phase, target: Phase) -> None:
    if source == target or (source, target) in ALLOWED:
        check_transition(source, target)
    else:
        with pytest.raises(errors.IllegalTransition, match=f"{source.value} -> {target.value}"):
            check_transition(source, target)


def test_terminal_phases_have_no_way_out() -> None:
    assert TERMINAL == {Phase.SUCCEEDED, Phase.FAILED}
    assert all(TRANSITIONS[p] == frozenset() for p in TERMINAL)


def test_every_phase_appears_in_the_table() -> None:
    assert set(TRANSITIONS) == set(Phase)
