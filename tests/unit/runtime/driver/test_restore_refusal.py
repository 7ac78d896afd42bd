"""Why a restore failed, by whose fault: the step's (it failed verification), the config's (a ConfigMismatch that
names each changed field as the TrainingRun spells it, and the fix), or neither (interrupted: retried).

`refusal` is the pure mapping; `choose` is driven over a run directory on disk with `checkpointer.select` replaced,
so that an index that does not fit this buffer (PreflightError) is told apart without building a bundle.
"""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest

from trainingrun_runtime import config
from trainingrun_runtime.dataplane import checkpointer
from trainingrun_runtime.driver import controller, restore
from trainingrun_runtime.errors import (
    CheckpointCorrupt,
    ConfigMismatch,
    DataPlaneError,
    DigestError,
    LedgerError,
    PreflightError,
    RestoreFailed,
    RestoreInterrupted,
    RestoreRefused,
)
from trainingrun_runtime.grpo import trainer
from trainingrun_runtime.storage import layout, manifest

RUN = "tiny"
SAVED = config.RuntimeConfig.model_validate({"trainer": {"grpo": {"groupSize": 4, "lr": 0.003}, "promptsPerStep": 8}})


def edited(**grpo: object) -> config.RuntimeConfig:
    """SAVED with `grpo` fields changed."""
    return config.RuntimeConfig.model_validate(
        {"trainer": {"grpo": {"groupSize": 4, "lr": 0.003, **grpo}, "promptsPerStep": 8}}
    )


def saved_manifest(
    step: int,
    cfg: config.RuntimeConfig = SAVED,
    *,
    math: bool = True,
    policy_format: str | None = trainer.POLICY_FORMAT,
) -> manifest.Manifest:
    """A manifest as the driver writes it under `cfg` (its files beside the point here)."""
    extra: dict[str, object] = {"config_math": config.math_fields(cfg)} if math else {}
    if policy_format is not None:
        extra["policy_format"] = policy_format
    return manifest.Manifest(
        format_version=manifest.FORMAT_VERSION,
        run=RUN,
        step=step,
        attempt=1,
        config_hash=config.config_hash(cfg),
        created="2025-01-01T00:00:00Z",
        files={},
        replay_digest="0" * 64,
        replay_mode="authoritative",
        extra=extra,
    )


RUN_DIR = Path("/checkpoints") / RUN

REFUSALS: list[tuple[str, BaseException, type[BaseException]]] = [
    # (case, the error the restore met, what it is raised as)
    ("a checksum mismatch", CheckpointCorrupt("step_4/policy/model.pt: checksum mismatch"), RestoreFailed),
    ("a manifest that does not parse", CheckpointCorrupt("step_4/manifest.json: not valid JSON"), RestoreFailed),
    ("no recorded step verifies", restore.NoRecordedCheckpointVerifies("none", []), RestoreFailed),
    ("a replay digest that does not match", DigestError("digest mismatch"), RestoreFailed),
    ("an index that does not hold together", PreflightError("duplicate group id"), RestoreFailed),
    ("a ledger that does not fit the loader", LedgerError("uid 9 served, the loader is at 4"), RestoreFailed),
    (
        "a file of the step gone after verification",
        FileNotFoundError(errno.ENOENT, "No such file", str(RUN_DIR / "step_4" / "train_dataloader.pt")),
        RestoreFailed,
    ),
    ("the math changed", ConfigMismatch("spec.trainer.grpo.lr: 0.003 -> 0.01"), ConfigMismatch),
    ("an I/O error", OSError(errno.EIO, "Input/output error", str(RUN_DIR / "step_4" / "policy")), RestoreInterrupted),
    ("a stale NFS handle", OSError(errno.ESTALE, "Stale file handle"), RestoreInterrupted),
    ("a missing file elsewhere", FileNotFoundError(errno.ENOENT, "gone", "/models/tok.json"), RestoreInterrupted),
    ("a timeout", TimeoutError("TransferQueue did not answer within 60 s"), RestoreInterrupted),
    ("the data plane failed", DataPlaneError("storage unit died"), RestoreInterrupted),
    ("a restore onto a used data plane", RestoreRefused("already read"), RestoreInterrupted),
    ("a bug", KeyError("loader"), RestoreInterrupted),
]  # fmt: skip


@pytest.mark.parametrize(("case", "error", "kind"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_restore_failure_is_the_steps_fault_only_when_the_step_failed_verification(
    case: str, error: BaseException, kind: type[BaseException]
) -> None:
    raised = restore.refusal(error, RUN_DIR)
    assert type(raised) is kind, case
    if kind is ConfigMismatch:
        assert raised is error
    else:
        assert isinstance(raised, RestoreFailed | RestoreInterrupted) and raised.cause is error


class RayTaskError(Exception):
    """Stands in for `ray.exceptions.RayTaskError` (no Ray in unit tests): the remote error, kept as `cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"remote: {cause}")
        self.cause = cause


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (RayTaskError(CheckpointCorrupt("step_4/policy/model.pt: loaded weights hash differs")), RestoreFailed),
        (RayTaskError(OSError(errno.EIO, "Input/output error")), RestoreInterrupted),
        (RestoreFailed(CheckpointCorrupt("x")), RestoreFailed),
        (RestoreInterrupted(RayTaskError(TimeoutError("slow"))), RestoreInterrupted),
    ],
    ids=["a remote corrupt step", "a remote I/O error", "already ours", "ours around Ray's"],
)
def test_the_cause_a_wrapper_keeps_decides(error: BaseException, kind: type[BaseException]) -> None:
    raised = restore.refusal(error, RUN_DIR)
    assert type(raised) is kind
    assert not isinstance(getattr(raised, "cause", None), RayTaskError | RestoreFailed | RestoreInterrupted)


def test_a_config_mismatch_names_each_changed_field_as_the_trainingrun_spells_it_old_to_new_and_the_fix() -> None:
    with pytest.raises(ConfigMismatch) as refused:
        restore.check_config(saved_manifest(4), edited(lr=0.01, groupSize=8))
    message = str(refused.value)
    assert message.startswith("spec.trainer.grpo.groupSize: 4 -> 8; spec.trainer.grpo.lr: 0.003 -> 0.01 ")
    assert "step_4" in message and "set them back" in message and "another name" in message


def test_one_changed_field_is_named_alone() -> None:
    with pytest.raises(ConfigMismatch, match=r"^spec\.trainer\.grpo\.lr: 0\.003 -> 0\.01 \(.*set it back"):
        restore.check_config(saved_manifest(4), edited(lr=0.01))


def test_a_manifest_that_lists_no_fields_names_spec_trainer() -> None:
    with pytest.raises(ConfigMismatch, match=r"^spec\.trainer: .*lists no fields.*set it back"):
        restore.check_config(saved_manifest(4, math=False), edited(lr=0.01))


def test_a_checkpoint_of_the_hand_written_model_is_refused_under_the_same_math_rather_than_loaded() -> None:
    """Before grpo.builtin, the built-in model was a hand-written transformer, and its manifests carry no policy
    format: under the same spec its checkpoint would pass the config hash, then fail to load and be taken for a
    corrupt step (and the run's checkpoints passed over one by one). It is a config mismatch instead, which keeps
    them all and says what to do."""
    with pytest.raises(ConfigMismatch, match=r"^step_4 holds the hand-written model.*another name from scratch"):
        restore.check_config(saved_manifest(4, policy_format=None), SAVED)
    restore.check_config(saved_manifest(4), SAVED)


def test_a_checkpoint_of_one_trainers_files_resumes_on_one_worker_and_more_are_refused_naming_the_field() -> None:
    """An earlier version saved the policy as one trainer's `model.pt` and `optimizer.pt` (optimizer state by
    position, not by name), which only one rank can load; a sharded checkpoint resumes on any number."""
    restore.check_config(saved_manifest(4, policy_format=trainer.LEGACY_FORMAT), SAVED)
    two = SAVED.model_copy(update={"trainer": SAVED.trainer.model_copy(update={"trainer_workers": 2})})
    with pytest.raises(ConfigMismatch, match=r"^spec\.trainer\.trainerWorkers: 2, but step_4 .*trainerWorkers: 1"):
        restore.check_config(saved_manifest(4, policy_format=trainer.LEGACY_FORMAT), two)
    restore.check_config(saved_manifest(4), two)


def test_a_checkpoint_trained_on_other_rows_of_the_data_file_is_refused_naming_the_field() -> None:
    """The loader's place points into the rows as they were: the same path with other rows would resume silently on
    other prompts."""
    saved = saved_manifest(4)
    trained = dataclasses.replace(saved, extra={**saved.extra, "data_fingerprint": "a" * 64})
    restore.check_data(trained, "a" * 64)
    with pytest.raises(ConfigMismatch, match=r"^spec\.trainer\.data\.path: the file's rows changed since step_4"):
        restore.check_data(trained, "b" * 64)
    restore.check_data(saved, "b" * 64)  # the built-in task's manifests have no fingerprint


def test_harmless_fields_never_refuse() -> None:
    harmless = SAVED.model_copy(update={"trainer": SAVED.trainer.model_copy(update={"steps": 10_000, "log_every": 1})})
    restore.check_config(saved_manifest(4), harmless)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("trainer.grpo.group_size", "spec.trainer.grpo.groupSize"),
        ("trainer.model.d_ff", "spec.trainer.model.dFf"),
        ("trainer.prompts_per_step", "spec.trainer.promptsPerStep"),
        ("trainer.sampler.max_staleness", "spec.trainer.sampler.maxStaleness"),
    ],
)
def test_a_math_field_is_named_by_its_path_in_the_spec(path: str, field: str) -> None:
    assert restore.spec_field(path) == field


# -- choose: a PreflightError is the config's fault when the math changed


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory whose step_2 and step_4 have manifests written under SAVED (nothing else: select is faked)."""
    for step in (2, 4):
        path = tmp_path / RUN / layout.step_dirname(step)
        path.mkdir(parents=True)
        (path / layout.MANIFEST).write_bytes(saved_manifest(step).to_json())
    return tmp_path


def select_raising(error: Exception) -> object:
    def select(*_args: object, **_kwargs: object) -> checkpointer.Selection | None:
        raise error

    return select


@pytest.mark.parametrize("resume", ["latest", "4"])
def test_an_index_that_does_not_fit_because_the_group_size_changed_is_a_config_mismatch_naming_it(
    run_dir: Path, resume: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpointer, "select", select_raising(PreflightError("group size is 4, this buffer uses 8")))
    cfg = edited(groupSize=8)
    with pytest.raises(ConfigMismatch, match=r"^spec\.trainer\.grpo\.groupSize: 4 -> 8 "):
        restore.choose(str(run_dir), RUN, resume, cfg, controller.replay_config(cfg.trainer), fallback=(2,))


def test_an_index_that_does_not_fit_under_the_same_math_is_the_steps_fault(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpointer, "select", select_raising(PreflightError("duplicate group id 'g3'")))
    with pytest.raises(RestoreFailed) as failed:
        restore.choose(str(run_dir), RUN, "4", SAVED, controller.replay_config(SAVED.trainer))
    assert isinstance(failed.value.cause, PreflightError)


def test_an_io_error_while_verifying_the_pinned_step_is_not_passed_over_nor_blamed_on_it(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpointer, "select", select_raising(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(RestoreInterrupted) as interrupted:
        restore.choose(str(run_dir), RUN, "4", SAVED, controller.replay_config(SAVED.trainer), fallback=(2,))
    assert isinstance(interrupted.value.cause, OSError) and interrupted.value.cause.errno == errno.EIO


def test_a_pinned_step_that_fails_verification_with_no_fallback_left_is_the_steps_fault(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpointer, "select", select_raising(CheckpointCorrupt("policy/model.pt: checksum mismatch")))
    with pytest.raises(RestoreFailed) as failed:
        restore.choose(str(run_dir), RUN, "4", SAVED, controller.replay_config(SAVED.trainer), fallback=(2,))
    assert isinstance(failed.value.cause, restore.NoRecordedCheckpointVerifies)
    assert [path.name for path, _ in failed.value.cause.rejected] == ["step_4", "step_2"]
