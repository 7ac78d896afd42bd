"""`sdk.record`: the one book of an attempt's reports and its save rule, which the built-in driver and a program share.

Pure: no files but a manifest object, no clock but the one passed in."""

from __future__ import annotations

import pathlib

from trainingrun_runtime import contract
from trainingrun_runtime.sdk import notice, record, reporting
from trainingrun_runtime.storage import manifest, verification

Reason = contract.CheckpointReason
NOW = 1_000_000.0


def bundle(step: int, *, attempt: int = 1, reason: str | None = "Periodic") -> verification.VerifiedBundle:
    m = manifest.Manifest(
        format_version=1, run="demo", step=step, attempt=attempt, config_hash="c", created="2026-12-07T00:00:00Z",
        files={}, replay_digest="d", replay_mode="none", weights_sha256=None,
        extra={} if reason is None else {"reason": reason},
    )  # fmt: skip
    return verification.VerifiedBundle(pathlib.Path(f"/ckpt/demo/step_{step}"), m, manifest_blake3="b3")


def resumed_at(step: int, attempt: int = 2) -> record.AttemptRecord:
    book = record.AttemptRecord(attempt)
    book.resumed(record.resumed_report(bundle(step)), [contract.BadCheckpointReport(step=step + 3, problem="torn")])
    return book


def commit(book: record.AttemptRecord, step: int, reason: Reason = Reason.PERIODIC) -> contract.CheckpointReport:
    return book.committed(step, pathlib.Path(f"/ckpt/demo/step_{step}"), manifest_blake3="h", reason=reason)


def test_a_fresh_attempt_reports_step_zero_no_checkpoint_and_at_most_the_listed_number_of_orphans() -> None:
    book = record.AttemptRecord(1, orphaned=range(reporting.ORPHANS_LISTED + 5))
    status = book.status()
    assert (status["attempt"], status["step"], status["lastCheckpoint"], status["finished"]) == (1, 0, None, False)
    assert status["orphanedCheckpoints"] == list(range(5, reporting.ORPHANS_LISTED + 5))
    assert "metrics" not in status


def test_a_resumed_attempt_reports_the_step_it_resumed_from_with_its_reason_and_the_steps_it_refused() -> None:
    status = resumed_at(6).status()
    last = status["lastCheckpoint"]
    assert last is not None  # attempt: the one that wrote the step, not the one resuming from it
    assert (last["step"], last["attempt"], last["manifestBlake3"], last.get("reason")) == (6, 1, "b3", "Periodic")
    assert status["step"] == 6
    assert status["badCheckpoints"] == [{"step": 9, "problem": "torn"}]


def test_a_bundle_from_before_reasons_were_recorded_resumes_without_one() -> None:
    assert "reason" not in record.resumed_report(bundle(4, reason=None))


def test_progress_and_a_commit_move_the_report_and_the_lineage_counts_the_resumed_and_written_steps() -> None:
    book = resumed_at(6)
    book.progress(8, 0.5, {"loss": 1.25})
    last = commit(book, 8)
    status = book.status(finished=True)
    assert (status["step"], status["reward"], status["metrics"], status["finished"]) == (8, 0.5, {"loss": 1.25}, True)
    assert status["lastCheckpoint"] == last
    assert (last["attempt"], last["reason"]) == (2, "Periodic")
    assert 4 in book.lineage and 6 in book.lineage and 8 in book.lineage
    assert 7 not in book.lineage
    assert "checkpointSeconds" not in status  # no save waited for yet
    book.waited_for_save(0.25)
    book.waited_for_save(0.5)
    assert book.status()["checkpointSeconds"] == 0.75


def test_the_save_rule_saves_every_save_period_steps_and_the_last_step_but_never_a_step_twice() -> None:
    book = resumed_at(6)

    def due(step: int) -> Reason | None:
        return book.save_reason(step, save_period=3, now=NOW, last_step=10)

    assert [due(s) for s in (6, 7, 8, 9, 10)] == [None, None, None, Reason.PERIODIC, Reason.FINAL]
    commit(book, 9)
    assert due(9) is None


def test_after_a_notice_only_the_notices_save_counts_and_only_while_it_fits_before_the_deadline() -> None:
    book = record.AttemptRecord(1)
    commit(book, 3)
    book.save_s = 10.0
    plenty = notice.Notice(deadline=NOW + 60, reason="preStop", requested=NOW)
    short = notice.Notice(deadline=NOW + 12, reason="preStop", requested=NOW)

    def due(step: int, n: notice.Notice, step_s: float | None = None) -> Reason | None:
        return book.save_reason(step, save_period=3, now=NOW, notice=n, step_s=step_s)

    assert due(4, plenty) is Reason.PREEMPTION_NOTICE  # not a save_period step: saved all the same
    assert due(6, short) is None  # a save takes 10 s, with half again to spare: 15 s > 12 s
    assert due(4, plenty, step_s=40.0) is None  # a step in flight first, then the save: too late
    commit(book, 4, Reason.PREEMPTION_NOTICE)
    assert due(5, plenty) is None  # answered: no second save on the same notice


def test_a_checkpoint_of_this_attempt_answers_the_notice_once_and_a_resumed_one_never() -> None:
    book = resumed_at(6)
    assert not book.answers_notice()  # step 6 is an older attempt's: it does not answer for this one
    commit(book, 7)
    assert book.answers_notice()
    last = book.status()["lastCheckpoint"]
    assert last is not None and (last["step"], last["reason"]) == (7, "PreemptionNotice")
    assert not book.answers_notice()


def test_a_failed_restore_reports_the_message_and_the_bad_steps_and_no_checkpoint() -> None:
    status = record.restore_error(3, "no recorded checkpoint verifies", [{"step": 4, "problem": "torn"}])
    assert (status["attempt"], status["step"], status["lastCheckpoint"]) == (3, 0, None)
    assert (status["restoreError"], status["badCheckpoints"]) == (
        "no recorded checkpoint verifies",
        [{"step": 4, "problem": "torn"}],
    )
