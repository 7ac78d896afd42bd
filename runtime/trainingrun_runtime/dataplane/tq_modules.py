"""TransferQueue and tensordict, imported here only, without loading torch's compiler.

tensordict (TransferQueue's tensor container) marks some of its functions for `torch.compile` while it is imported:
`torch.compiler.allow_in_graph`, `assume_constant_result` and `disable` each import `torch._dynamo`, and with it the
inductor. That is about 1.7 s of CPU in each process that imports TransferQueue and nothing else that loads the
compiler: the driver, the controller actor, TransferQueue's controller and each storage unit (the trainer worker and
the generators load it anyway, with `torch.use_deterministic_algorithms` and the optimizer), so 4 to 8 of the 35 to
40 s of CPU a driver's start costs (`bench/bench_imports.py`, docs/measurements.md). Nothing in the runtime runs
`torch.compile`, and for eager code those three return the function unchanged; so while tensordict is first imported
they are that identity, and they are put back right after. A process that had already loaded torch's compiler (or
tensordict) imports as usual.

Every module of the data plane takes TransferQueue and tensordict from here (the names below), so that no import of
theirs comes first (tests/unit/runtime/dataplane/test_tq_modules.py checks it for each process's modules).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch.compiler

__all__ = [
    "NonTensorStack",
    "TensorDict",
    "simple_storage",
    "simple_storage_bootstrap",
    "tq_controller",
    "tq_interface",
    "transfer_queue",
]

COMPILER_MARKS = ("allow_in_graph", "assume_constant_result", "disable")
"""The `torch.compiler` functions tensordict calls at import time, each importing `torch._dynamo`."""


def eager_mark(fn: Callable[..., Any] | None = None, *args: Any, **kwargs: Any) -> Any:
    """What the marks do in eager code: `mark(fn)` is `fn`, and `mark(**options)` is a decorator returning `fn`."""
    if fn is None:
        return lambda f: f
    return fn


@contextmanager
def compiler_marks_as_identity() -> Iterator[None]:
    """While it lasts, the `COMPILER_MARKS` of `torch.compiler` are `eager_mark`; the originals are put back."""
    saved = {name: getattr(torch.compiler, name) for name in COMPILER_MARKS}
    try:
        for name in COMPILER_MARKS:
            setattr(torch.compiler, name, eager_mark)
        yield
    finally:
        for name, original in saved.items():
            setattr(torch.compiler, name, original)


if "tensordict" not in sys.modules and "torch._dynamo" not in sys.modules:
    with compiler_marks_as_identity():
        import tensordict  # noqa: F401

import transfer_queue  # type: ignore[import-untyped]  # noqa: E402
from tensordict import NonTensorStack, TensorDict  # noqa: E402
from transfer_queue import controller as tq_controller  # noqa: E402
from transfer_queue import interface as tq_interface  # noqa: E402
from transfer_queue.storage import simple_storage  # type: ignore[import-untyped]  # noqa: E402
from transfer_queue.storage.bootstrap import simple_storage_bootstrap  # type: ignore[import-untyped]  # noqa: E402
