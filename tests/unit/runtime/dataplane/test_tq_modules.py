"""tq_modules: TransferQueue and tensordict imported without torch's compiler, and torch.compiler left as it was.

The imports run in a fresh interpreter each (a subprocess): the pytest process has long loaded both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from trainingrun_runtime.dataplane import tq_modules

PROBE = """
import json, sys
{imports}
import torch.compiler
print(json.dumps({{
    "compiler_loaded": "torch._dynamo" in sys.modules,
    "tensordict_loaded": "tensordict" in sys.modules,
    "marks": {{name: getattr(torch.compiler, name).__module__ for name in ("allow_in_graph", "assume_constant_result",
                                                                          "disable")}},
}}))
"""


def probe(*imports: str) -> dict[str, Any]:
    code = PROBE.format(imports="\n".join(imports))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


PROCESSES = (
    "trainingrun_runtime.driver.entrypoint",  # the driver
    "trainingrun_runtime.driver.controller",  # the controller actor's class
    "trainingrun_runtime.dataplane.tq_controller",  # TransferQueue's controller's actor class
    "trainingrun_runtime.dataplane.storage_unit",  # a storage unit's actor class
)


def test_transferqueues_processes_import_it_without_torchs_compiler_and_leave_its_marks_as_they_were() -> None:
    seen = probe(*(f"import {module}" for module in PROCESSES))
    assert seen["tensordict_loaded"]
    assert not seen["compiler_loaded"]
    assert seen["marks"] == dict.fromkeys(tq_modules.COMPILER_MARKS, "torch.compiler")


def test_a_process_that_already_loaded_torchs_compiler_imports_tensordict_as_usual() -> None:
    seen = probe("import torch._dynamo", "import trainingrun_runtime.dataplane.tq_modules")
    assert seen["compiler_loaded"] and seen["tensordict_loaded"]
    assert seen["marks"] == dict.fromkeys(tq_modules.COMPILER_MARKS, "torch.compiler")


def test_the_eager_mark_returns_the_function_whether_called_with_it_or_with_options() -> None:
    def fn(x: int) -> int:
        return x + 1

    decorator: Callable[[Callable[[int], int]], Callable[[int], int]] = tq_modules.eager_mark(recursive=False)
    assert tq_modules.eager_mark(fn) is fn
    assert decorator(fn) is fn


def test_the_marks_are_restored_when_the_import_under_them_fails() -> None:
    import torch.compiler

    originals = {name: getattr(torch.compiler, name) for name in tq_modules.COMPILER_MARKS}
    with pytest.raises(ImportError), tq_modules.compiler_marks_as_identity():
        assert torch.compiler.allow_in_graph is tq_modules.eager_mark
        raise ImportError("a failed import")
    assert {name: getattr(torch.compiler, name) for name in tq_modules.COMPILER_MARKS} == originals
