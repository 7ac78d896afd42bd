"""The entrypoint: argument and config errors are exit code 2 (no Ray started); a failed restore exits by whose fault
it is: 3 the step's (it failed verification), 6 the config's (its math differs), 7 neither (retried)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from trainingrun_runtime.contract import Exit
from trainingrun_runtime.driver import entrypoint, events, setup
from trainingrun_runtime.errors import (
    CheckpointCorrupt,
    ConfigMismatch,
    DataPlaneError,
    DigestError,
    PreflightError,
    RestoreFailed,
    RestoreInterrupted,
    Superseded,
)


def _argv(tmp_path: Path, config_json: str) -> list[str]:
    return ["--run", "r", "--attempt", "1", "--root", str(tmp_path), "--config-json", config_json]


def test_an_unknown_config_field_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert entrypoint.main(_argv(tmp_path, '{"trainer": {"grpo": {"clipEpsilon": 0.1}}}')) == Exit.BAD_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("BadConfig:") and "clipEpsilon" in err


def test_malformed_json_and_a_bad_resume_exit_2(tmp_path: Path) -> None:
    assert entrypoint.main(_argv(tmp_path, "{not json")) == Exit.BAD_CONFIG
    assert entrypoint.main([*_argv(tmp_path, "{}"), "--resume", "yesterday"]) == Exit.BAD_CONFIG


def test_a_missing_required_argument_is_a_usage_error_with_exit_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        entrypoint.main(["--run", "r", "--root", str(tmp_path), "--config-json", "{}"])
    assert exc.value.code == 2


RESTORE_EXITS: list[tuple[str, BaseException, int, str, str]] = [
    # (case, the error, exit code, the last stderr line, status.runtime.restoreError)
    (
        "the step failed verification",
        RestoreFailed(CheckpointCorrupt("step_4/policy/model.pt: checksum mismatch")),
        Exit.RESTORE_FAILED,
        "RestoreFailed: CheckpointCorrupt: step_4/policy/model.pt: checksum mismatch",
        "CheckpointCorrupt: step_4/policy/model.pt: checksum mismatch",
    ),
    (
        "the actor's index rebuild found the index and the rows apart",
        PreflightError("the data plane's rows differ from the index"),
        Exit.RESTORE_FAILED,
        "RestoreFailed: PreflightError: the data plane's rows differ from the index",
        "PreflightError: the data plane's rows differ from the index",
    ),
    (
        "the actor's index rebuild found another digest",
        DigestError("digest mismatch"),
        Exit.RESTORE_FAILED,
        "RestoreFailed: DigestError: digest mismatch",
        "DigestError: digest mismatch",
    ),
    (
        "the checkpoint's math differs from the config",
        ConfigMismatch("spec.trainer.grpo.lr: 0.003 -> 0.01 (changed since step_4 was trained)"),
        Exit.CONFIG_MISMATCH,
        "ConfigMismatch: spec.trainer.grpo.lr: 0.003 -> 0.01 (changed since step_4 was trained)",
        "ConfigMismatch: spec.trainer.grpo.lr: 0.003 -> 0.01 (changed since step_4 was trained)",
    ),
    (
        "I/O interrupted the restore",
        RestoreInterrupted(OSError(5, "Input/output error")),
        Exit.RESTORE_INTERRUPTED,
        "RestoreInterrupted: OSError: [Errno 5] Input/output error (not the checkpoint's fault: a new attempt may "
        "succeed)",
        "RestoreInterrupted: OSError: [Errno 5] Input/output error (not the checkpoint's fault: a new attempt may "
        "succeed)",
    ),
]


@pytest.mark.parametrize(("case", "error", "code", "line", "report"), RESTORE_EXITS, ids=[r[0] for r in RESTORE_EXITS])
def test_a_failed_restore_exits_with_the_code_and_prefix_of_whose_fault_it_is(
    case: str, error: BaseException, code: int, line: str, report: str
) -> None:
    assert entrypoint.restore_exit(error) == entrypoint.RestoreExit(code, line, report), case


@pytest.mark.parametrize(
    "error",
    [Superseded("attempt 3 owns the directory"), DataPlaneError("snapshot failed"), RuntimeError("a bug")],
    ids=["superseded", "data plane", "a bug"],
)
def test_the_actors_other_errors_are_no_restore_failure(error: BaseException) -> None:
    assert entrypoint.restore_exit(error) is None


def test_fallback_steps_are_parsed_and_need_a_pinned_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    opts = entrypoint.parse([*_argv(tmp_path, "{}"), "--resume", "30", "--fallback", "20,10"])
    assert opts.resume == "30" and opts.fallback == (20, 10)
    assert entrypoint.parse([*_argv(tmp_path, "{}"), "--resume", "30"]).fallback == ()
    assert entrypoint.main([*_argv(tmp_path, "{}"), "--fallback", "20"]) == Exit.BAD_CONFIG
    assert "--fallback" in capsys.readouterr().err
    assert entrypoint.main([*_argv(tmp_path, "{}"), "--resume", "30", "--fallback", "20,x"]) == Exit.BAD_CONFIG


def test_the_recorded_manifest_hashes_are_parsed_for_the_pinned_and_fallback_steps_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pinned = [*_argv(tmp_path, "{}"), "--resume", "30", "--fallback", "20"]
    opts = entrypoint.parse([*pinned, "--manifest-blake3", f"30={'a' * 64},20={'b' * 64}"])
    assert opts.manifest_blake3 == {30: "a" * 64, 20: "b" * 64}
    assert entrypoint.parse(pinned).manifest_blake3 == {}
    for bad, says in [
        (f"10={'a' * 64}", "not the --resume step or a --fallback one"),
        (f"30={'a' * 64},30={'b' * 64}", "names it twice"),
        ("30=abc", "64 lowercase hex digits"),
        (f"30={'A' * 64}", "64 lowercase hex digits"),
        ("a" * 64, "STEP=HEX"),
    ]:
        assert entrypoint.main([*pinned, "--manifest-blake3", bad]) == Exit.BAD_CONFIG, bad
        err = capsys.readouterr().err
        assert "--manifest-blake3" in err and says in err, (bad, err)


def _owned_old_run_dir(root: Path, run: str, uid: str) -> Path:
    run_dir = root / run
    (run_dir / "step_10").mkdir(parents=True)
    (run_dir / "owner.json").write_text(json.dumps({"runUid": uid, "attempt": 2}))
    return run_dir


def test_the_run_directory_of_the_old_layout_is_moved_before_the_event_log_opens_and_the_move_is_an_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """setup stops (Superseded) right after the move: what is checked needs no Ray."""
    _owned_old_run_dir(tmp_path, "r", "uid-1")
    root = tmp_path / "ns"
    reached: list[setup.DriverOptions] = []

    def stop(opts: setup.DriverOptions, ev: events.EventLog) -> setup.Setup:
        reached.append(opts)
        raise Superseded("stop here")

    monkeypatch.setattr(setup, "setup_single_controller", stop)
    argv = ["--run", "r", "--attempt", "3", "--root", str(root), "--legacy-root", str(tmp_path)]
    assert entrypoint.main([*argv, "--run-uid", "uid-1", "--config-json", "{}"]) == Exit.FAILED
    assert reached and reached[0].legacy_root == str(tmp_path)
    assert (root / "r" / "step_10").is_dir() and not (tmp_path / "r").exists()
    names = [e["event"] for e in events.read(events.default_path(root, "r", 3))]
    assert names == ["driver_started", "run_dir_moved"]


def test_without_a_legacy_root_nothing_is_moved(tmp_path: Path) -> None:
    _owned_old_run_dir(tmp_path, "r", "uid-1")
    opts = entrypoint.parse(["--run", "r", "--attempt", "1", "--root", str(tmp_path / "ns"), "--config-json", "{}"])
    assert opts.legacy_root is None
    assert setup.adopt_legacy_run_dir(dataclasses.replace(opts, run_uid="uid-1")) is None
    assert (tmp_path / "r" / "step_10").is_dir() and not (tmp_path / "ns").exists()


def test_a_run_directory_of_another_run_stays_where_it_is(tmp_path: Path) -> None:
    _owned_old_run_dir(tmp_path, "r", "uid-of-another-namespace")
    argv = ["--run", "r", "--attempt", "1", "--root", str(tmp_path / "ns"), "--legacy-root", str(tmp_path)]
    opts = entrypoint.parse([*argv, "--run-uid", "uid-1", "--config-json", "{}"])
    assert setup.adopt_legacy_run_dir(opts) is None
    assert (tmp_path / "r" / "step_10").is_dir() and not (tmp_path / "ns").exists()
