"""The entrypoint: argument and config errors are exit code 2 (no Ray started); which failures are a failed restore."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainingrun_runtime.driver import entrypoint


def _argv(tmp_path: Path, config_json: str) -> list[str]:
    return ["--run", "r", "--attempt", "1", "--root", str(tmp_path), "--config-json", config_json]


def test_an_unknown_config_field_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert entrypoint.main(_argv(tmp_path, '{"trainer": {"grpo": {"clipEpsilon": 0.1}}}')) == entrypoint.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("BadConfig:") and "clipEpsilon" in err


def test_malformed_json_and_a_bad_resume_exit_2(tmp_path: Path) -> None:
    assert entrypoint.main(_argv(tmp_path, "{not json")) == entrypoint.EXIT_BAD_CONFIG
    assert entrypoint.main([*_argv(tmp_path, "{}"), "--resume", "yesterday"]) == entrypoint.EXIT_BAD_CONFIG


def test_a_missing_required_argument_is_a_usage_error_with_exit_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        entrypoint.main(["--run", "r", "--root", str(tmp_path), "--config-json", "{}"])
    assert exc.value.code == 2


def test_an_index_rebuild_failure_in_the_actor_is_a_failed_restore_and_a_superseded_driver_is_not() -> None:
    from trainingrun_runtime.driver import entrypoint
    from trainingrun_runtime.errors import (
        DataPlaneError,
        DigestError,
        PreflightError,
        Superseded,
    )

    assert entrypoint.is_restore_error(PreflightError("ledger disagrees with the index"))
    assert entrypoint.is_restore_error(DigestError("digest mismatch"))
    assert not entrypoint.is_restore_error(Superseded("attempt 3 owns the directory"))
    assert not entrypoint.is_restore_error(DataPlaneError("snapshot failed"))


def test_fallback_steps_are_parsed_and_need_a_pinned_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    opts = entrypoint.parse([*_argv(tmp_path, "{}"), "--resume", "30", "--fallback", "20,10"])
    assert opts.resume == "30" and opts.fallback == (20, 10)
    assert entrypoint.parse([*_argv(tmp_path, "{}"), "--resume", "30"]).fallback == ()
    assert entrypoint.main([*_argv(tmp_path, "{}"), "--fallback", "20"]) == entrypoint.EXIT_BAD_CONFIG
    assert "--fallback" in capsys.readouterr().err
    assert (
        entrypoint.main([*_argv(tmp_path, "{}"), "--resume", "30", "--fallback", "20,x"]) == entrypoint.EXIT_BAD_CONFIG
    )
