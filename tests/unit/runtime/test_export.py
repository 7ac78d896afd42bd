"""`trainingrun export`: a checkpoint's policy comes out as a Hugging Face directory that transformers loads and
generates from, with the checkpoint's very weights; a checkpoint it cannot export is an error that says why."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainingrun_runtime import export
from trainingrun_runtime.grpo import trainer

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "bundle-format-1" / "compat"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory holding one complete checkpoint of the built-in model (the compat fixture's step_2)."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "compat"))


def test_the_exported_model_loads_with_transformers_has_the_checkpoints_weights_and_generates(
    run_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert export.export(run_dir, tmp_path / "out") == run_dir / "step_2"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    saved = json.loads((run_dir / "step_2" / "manifest.json").read_text())["weights_sha256"]
    assert trainer.weights_sha256(model.state_dict()) == saved
    ids = torch.tensor([tok("1 2")["input_ids"]])
    out = model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert out.shape == (1, ids.shape[1] + 2)
    assert json.loads((tmp_path / "out" / "trainingrun.json").read_text())["step"] == 2


def test_a_missing_step_is_named(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(export.ExportError, match=r"step_7 does not exist"):
        export.export(run_dir, tmp_path / "out", step=7)


def test_a_damaged_step_is_not_exported_and_a_run_with_none_left_says_why(run_dir: Path, tmp_path: Path) -> None:
    model = run_dir / "step_2" / "policy" / "model.pt"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 1
    model.write_bytes(bytes(data))
    with pytest.raises(export.ExportError, match=r"step_2 is not a complete checkpoint"):
        export.export(run_dir, tmp_path / "out", step=2)
    with pytest.raises(export.ExportError, match=r"holds no complete checkpoint \(step_2: .*model\.pt"):
        export.export(run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_existing_output_directory_is_never_written_into(run_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    with pytest.raises(export.ExportError, match=r"out exists and is not an empty directory"):
        export.export(run_dir, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]


def test_a_checkpoint_of_the_hand_written_model_is_refused_naming_its_format(run_dir: Path, tmp_path: Path) -> None:
    manifest = run_dir / "step_2" / "manifest.json"
    doc = json.loads(manifest.read_text())
    del doc["extra"]["policy_format"]
    manifest.write_text(json.dumps(doc, sort_keys=True, indent=2) + "\n")
    with pytest.raises(export.ExportError, match=r"policy format None, not 'hf-dcp/1'.*version that wrote it"):
        export.export(run_dir, tmp_path / "out")


def test_the_command_line_exits_2_with_one_line_naming_the_problem(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainingrun_runtime.export", str(tmp_path / "nothing"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("trainingrun export: error: ") and "holds no complete checkpoint" in done.stderr
