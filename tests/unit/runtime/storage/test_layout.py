"""The run directory and step names: what is refused."""

from __future__ import annotations

import pytest

from trainingrun_runtime.storage import layout
from trainingrun_runtime.storage.commit import BundleWriter


def test_run_names_and_steps_are_checked() -> None:
    with pytest.raises(ValueError, match="single path component"):
        BundleWriter("/tmp", "../escape")
    with pytest.raises(ValueError, match="non-negative int"):
        layout.step_dirname(-1)
