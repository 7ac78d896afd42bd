"""The error vocabulary: one base, a one-line meaning on every class that says what to do."""

from __future__ import annotations

import pytest

from trainingrun_runtime import errors

ALL = [getattr(errors, name) for name in errors.__all__]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_error_derives_from_the_base_and_says_in_one_line_what_it_means(cls: type[Exception]) -> None:
    assert issubclass(cls, errors.TrainingRunError)
    assert cls.__doc__ and "\n" not in cls.__doc__.strip()


def test_a_failed_restore_names_its_cause_and_keeps_it() -> None:
    cause = errors.CheckpointCorrupt("step_3/manifest.json: not valid JSON")
    failed = errors.RestoreFailed(cause)
    assert failed.cause is cause
    assert str(failed) == "CheckpointCorrupt: step_3/manifest.json: not valid JSON"
