"""The in-process operator of the cluster tests (tests/support/operator_double.py) reports its thread's end: a crash
of the operator fails the test that ran it with the crash's own error. Run here with `cli.operate` replaced by a
stand-in, since the point is the thread's bookkeeping, not the operator."""

from __future__ import annotations

import asyncio
import pathlib
import threading
from typing import Any

import pytest

from support import operator_double
from trainingrun_operator import cli


class _Api:
    closed = False

    def close(self) -> None:
        self.closed = True


def _operator(monkeypatch: pytest.MonkeyPatch, crash: BaseException | None) -> operator_double.InProcessOperator:
    async def operate(api: Any, *, stop_flag: threading.Event, ready_flag: threading.Event, **_: Any) -> None:
        ready_flag.set()
        if crash is not None:
            raise crash
        while not stop_flag.is_set():
            await asyncio.sleep(0.01)

    monkeypatch.setattr(cli, "operate", operate)
    return operator_double.InProcessOperator(pathlib.Path("unused"), "ns", api=_Api())  # type: ignore[arg-type]


def test_stop_re_raises_the_exception_that_ended_the_operator_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    operator = _operator(monkeypatch, RuntimeError("the operator crashed"))
    operator.start()
    operator.thread.join(10)
    with pytest.raises(RuntimeError, match="the operator crashed"):
        operator.stop()
    assert operator.api.closed  # type: ignore[attr-defined]


def test_stop_of_an_operator_that_ran_until_told_to_stop_raises_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    operator = _operator(monkeypatch, None)
    operator.start()
    assert operator.thread.is_alive()
    operator.stop()
    assert not operator.thread.is_alive() and operator.api.closed  # type: ignore[attr-defined]
