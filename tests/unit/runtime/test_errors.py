"""The error vocabulary: one base, a retryable flag on every class, a docstring on every class."""

from __future__ import annotations

import pytest

from trainingrun_runtime import errors

ALL = [getattr(errors, name) for name in errors.__all__]


def test_every_error_derives_from_the_base() -> None:
    for cls in ALL:
        assert issubclass(cls, errors.TrainingRunError)
        assert issubclass(cls, Exception)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_error_says_whether_retrying_helps(cls: type[errors.TrainingRunError]) -> None:
    assert isinstance(cls.__dict__.get("retryable", cls.retryable), bool)
    assert "retryable" in cls.__dict__
    assert cls.__doc__ and "\n" not in cls.__doc__.strip()


def test_contract_names_are_all_present() -> None:
    assert set(errors.__all__) == {
        "TrainingRunError",
        "CheckpointCorrupt",
        "RestoreRefused",
        "InventoryMismatch",
        "PreflightError",
        "DigestError",
        "DataPlaneError",
        "ConfigMismatch",
    }


def test_a_corrupt_checkpoint_is_not_retryable_and_keeps_its_message() -> None:
    err = errors.CheckpointCorrupt("step_3/manifest.json: not valid JSON")
    assert not err.retryable
    assert str(err) == "step_3/manifest.json: not valid JSON"
