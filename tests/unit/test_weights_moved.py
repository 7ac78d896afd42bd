"""The check every exact-resume test adds (tests/support/weights.py): the compared checkpoints' weights moved."""

from __future__ import annotations

import pytest

from support import weights


def test_checkpoints_with_weights_of_their_own_pass() -> None:
    weights.assert_moved({4: "a" * 64, 8: "b" * 64, 12: "c" * 64})


def test_two_steps_with_the_same_weights_fail_naming_both_steps() -> None:
    with pytest.raises(AssertionError, match=r"did not move between steps \[\[4, 12\]\]"):
        weights.assert_moved({4: "a" * 64, 8: "b" * 64, 12: "a" * 64})


def test_a_single_checkpoint_is_not_enough_to_show_movement() -> None:
    with pytest.raises(AssertionError, match="1 checkpoint"):
        weights.assert_moved({4: "a" * 64})


def test_a_checkpoint_without_weights_fails_rather_than_counting_as_moved() -> None:
    with pytest.raises(AssertionError, match=r"no weights_sha256 for step\(s\) \[8\]"):
        weights.assert_moved({4: "a" * 64, 8: None})


def test_the_recorded_weights_are_read_from_the_status_history_and_latest_the_newest_record_of_a_step_winning() -> None:
    status = {
        "checkpoints": {
            "history": [
                {"step": 5, "attempt": 1, "weightsSha256": "a" * 64},
                {"step": 10, "attempt": 1, "weightsSha256": "b" * 64},
                {"step": 10, "attempt": 2, "weightsSha256": "c" * 64},
            ],
            "latest": {"step": 15, "attempt": 2, "weightsSha256": "d" * 64},
        }
    }
    assert weights.recorded(status) == {5: "a" * 64, 10: "c" * 64, 15: "d" * 64}
