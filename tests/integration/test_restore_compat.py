"""A checkpoint written by an earlier trainingrun restores with this one.

`tests/fixtures/bundle-format-1/compat/step_2` was written by main at 58dd19e (before the runtime moved into
subpackages): bundle format 1 (a SHA-256 per file), data-plane sidecar format 2, four committed groups of rows in
the storage units' column files, trained with `config.json` beside it. A driver of this version, given the same
config (with a later step limit, which does not change the math), must select it, verify every checksum (SHA-256,
as format 1 has them), restore TransferQueue, the replay index, the loader place and the policy from it, and train
on to the new limit, saving in format 2 (BLAKE3). Its policy files (and their manifest entries) were converted once
to the built-in model of `grpo.builtin` by `convert_policy.py` beside it; the rest is as 58dd19e wrote it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from support import launcher
from trainingrun_runtime.driver import events
from trainingrun_runtime.storage import layout, verification

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "bundle-format-1"
RUN = "compat"


def test_a_bundle_written_before_the_runtime_moved_restores_and_trains_on(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE / RUN, tmp_path / RUN)
    saved = verification.verify(tmp_path / RUN / "step_2")
    assert saved.format_version == 1
    sidecar = torch.load(tmp_path / RUN / "step_2" / layout.REPLAY_METADATA, weights_only=True)
    assert len(sidecar["replay"]["groups"]) == 4  # the fixture holds rows, so the storage units' files are read
    config = json.loads((FIXTURE / "config.json").read_text())
    config["trainer"]["steps"] = 4

    proc = launcher.start(
        run=RUN, attempt=2, root=tmp_path, config=config, num_cpus=6, event_log=tmp_path / "events.jsonl"
    )
    assert proc.wait(500) == 0, proc.output()[-3000:]

    by_name = {e["event"]: e for e in events.read(tmp_path / "events.jsonl")}
    assert by_name["checkpoint_selected"]["step"] == 2
    assert by_name["tq_restored"]["step"] == 2
    assert by_name["index_restored"]["groups"] == 4
    assert by_name["index_restored"]["digest"] == saved.replay_digest
    assert by_name["pumps_started"]["step"] == 2
    assert by_name["finished"]["step"] == 4
    resumed = verification.verify(tmp_path / RUN / "step_4")
    assert (resumed.step, resumed.format_version) == (4, 2)  # what this version saves: a BLAKE3 per file
