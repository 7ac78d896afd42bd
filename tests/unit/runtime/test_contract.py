"""The driver–operator contract: its wire values, pinned here as literals on purpose (a change to one is a protocol
change between a driver and an operator of different versions), and the stderr line's format read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainingrun_runtime import contract
from trainingrun_runtime.contract import CheckpointReason, Exit, Prefix


def test_the_exit_codes_are_the_wire_values() -> None:
    assert {e.name: e.value for e in Exit} == {
        "OK": 0,
        "FAILED": 1,
        "BAD_CONFIG": 2,
        "RESTORE_FAILED": 3,
        "GENERATION_LOST": 4,
        "PREEMPTED": 5,
        "CONFIG_MISMATCH": 6,
        "RESTORE_INTERRUPTED": 7,
        "TRAINER_LOST": 8,
    }


def test_each_stderr_prefix_is_the_wire_value_and_names_its_exit_code() -> None:
    assert {p.value: p.code.value for p in Prefix} == {
        "BadConfig:": 2,
        "Superseded:": 1,
        "RestoreFailed:": 3,
        "GenerationLost:": 4,
        "Preempted:": 5,
        "ConfigMismatch:": 6,
        "RestoreInterrupted:": 7,
        "TrainerLost:": 8,
    }


def test_the_checkpoint_reasons_are_the_wire_values() -> None:
    assert [r.value for r in CheckpointReason] == ["Periodic", "Final", "PreemptionNotice"]


def test_the_reports_field_names_are_the_wire_values() -> None:
    assert contract.REPORT_FIELD == "runtime"
    assert set(contract.RuntimeStatus.__annotations__) == {
        "attempt",
        "step",
        "reward",
        "updated",
        "lastCheckpoint",
        "restoreError",
        "finished",
        "badCheckpoints",
        "orphanedCheckpoints",
        "metrics",
        "checkpointSeconds",
    }
    assert set(contract.CheckpointReport.__annotations__) == {
        "step",
        "path",
        "attempt",
        "replayDigest",
        "weightsSha256",
        "manifestBlake3",
        "time",
        "reason",
    }
    assert set(contract.BadCheckpointReport.__annotations__) == {"step", "problem"}
    assert contract.PROGRESS_FIELDS == {"step", "reward", "updated", "metrics"}


def test_the_attachment_a_program_is_handed_is_the_wire_values() -> None:
    assert contract.ATTACH_ENV == "TRAININGRUN_ATTACH"
    assert set(contract.Attachment.__annotations__) == {
        "run", "namespace", "attempt", "runUid", "root", "resume", "fallback", "manifestBlake3", "reporter",
        "savePeriod", "keepLast", "keepEvery", "trainer",
    }  # fmt: skip


def test_the_local_report_file_is_under_the_attempts_directory(tmp_path: Path) -> None:
    assert contract.report_file(tmp_path / "tiny", 3) == tmp_path / "tiny" / "attempts" / "3" / "runtime.json"


def test_the_values_print_as_they_go_on_the_wire() -> None:
    """f-strings, str() and JSON see the value, not the member's name: the driver prints and reports them so."""
    assert f"{Exit.PREEMPTED}" == "5" and str(Prefix.PREEMPTED) == "Preempted:"
    assert json.dumps({"reason": CheckpointReason.PREEMPTION_NOTICE}) == '{"reason": "PreemptionNotice"}'
    assert contract.line(Prefix.GENERATION_LOST, "no generation worker for 30 s") == (
        "GenerationLost: no generation worker for 30 s"
    )


@pytest.mark.parametrize(
    ("said", "after"),
    [
        ("ConfigMismatch: spec.trainer.grpo.lr: 0.01 -> 0.02", "spec.trainer.grpo.lr: 0.01 -> 0.02"),
        (
            "Job entrypoint command failed with exit code 6, last available logs:\nINFO started\n"
            "ConfigMismatch: spec.trainer.grpo.lr: 0.01 -> 0.02\nINFO shutting down\n",
            "spec.trainer.grpo.lr: 0.01 -> 0.02",
        ),
        ("ConfigMismatch: the first\nConfigMismatch: the last", "the last"),
        ("RestoreFailed: ConfigMismatch: older driver", "older driver"),
        ("Traceback: boom", ""),
    ],
    ids=["the line alone", "quoted in KubeRay's message", "the last of two", "behind another prefix", "none"],
)
def test_the_operator_reads_back_what_the_driver_wrote_after_a_prefix(said: str, after: str) -> None:
    assert contract.said_after(Prefix.CONFIG_MISMATCH, said) == after
