"""`trainingrun export RUN_DIR [--step N] OUT`: a checkpoint's policy as a Hugging Face model directory.

    RUN_DIR/step_N ─► verify every checksum ─► policy/: the weights' shards of every trainer rank that wrote them,
        gathered into one model (or an earlier version's model.pt), each file read through its checked descriptor
        ─► the model its manifest's math describes (grpo.workload: the built-in one, or the one from model.path,
           whose directory gives the config and the tokenizer) ─► OUT/config.json, model.safetensors,
           generation_config.json, tokenizer files

What comes out loads with `AutoModelForCausalLM.from_pretrained(OUT)` and `AutoTokenizer.from_pretrained(OUT)` and
generates. Without `--step` the newest complete step is taken (a damaged newer one is skipped, as a restore would);
with it, exactly that step, or an error naming why not. OUT must not exist or be empty: nothing is overwritten.
Reads the checkpoint only; on a cluster, run it in a pod that mounts the checkpoint volume (docs/runtime.md).

    python -m trainingrun_runtime.export RUN_DIR [--step N] OUT       (what `trainingrun export` runs)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from trainingrun_runtime import config
from trainingrun_runtime.errors import CheckpointCorrupt, InvalidSpec, TrainingRunError
from trainingrun_runtime.grpo import sharding, trainer, workload
from trainingrun_runtime.storage import files, layout, verification

__all__ = ["ExportError", "export", "main"]


class ExportError(TrainingRunError):
    """The checkpoint cannot be exported (none complete, another policy format, OUT in the way): see the message."""


def _chosen(run_dir: Path, step: int | None) -> verification.VerifiedBundle:
    if step is not None:
        path = run_dir / layout.step_dirname(step)
        if not path.is_dir():
            raise ExportError(f"{path} does not exist")
        try:
            return verification.open_verified(path, run=run_dir.name)
        except CheckpointCorrupt as e:
            raise ExportError(f"{path} is not a complete checkpoint: {e}") from e
    found = verification.discover(run_dir.parent, run_dir.name)
    if found.chosen is None:
        why = "; ".join(f"{p.name}: {reason}" for p, reason in found.skipped) or "no step_N directory in it"
        raise ExportError(f"{run_dir} holds no complete checkpoint ({why})")
    return found.chosen


def _trainer_config(math: dict[str, Any]) -> config.TrainerConfig:
    """The `spec.trainer` the manifest's math fields describe (the fields outside the math keep their defaults)."""
    nested: dict[str, Any] = {}
    for path, value in math.items():
        parts = path.split(".")
        if parts[0] != "trainer":
            continue
        node = nested
        for part in parts[1:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return config.TrainerConfig.model_validate(nested)


def export(run_dir: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Write the policy of `run_dir`'s newest complete step (or of `step`) to `out`; returns the step directory."""
    run_dir, out = Path(run_dir), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty directory; give a new one")
    bundle = _chosen(run_dir, step)
    m = bundle.manifest
    policy_format = m.extra.get("policy_format")
    if policy_format not in trainer.FORMATS:
        raise ExportError(
            f"{bundle.path} holds policy format {policy_format!r}, not {trainer.POLICY_FORMAT!r} (the hand-written "
            "model of earlier versions has no Hugging Face form); export it with the version that wrote it"
        )
    math = m.extra.get("config_math")
    if not isinstance(math, dict):
        raise ExportError(f"{bundle.path}/manifest.json lists no math fields, so its model cannot be rebuilt")
    cfg = _trainer_config(math)
    entries = bundle.entries(layout.POLICY)
    state = None
    if policy_format == trainer.LEGACY_FORMAT:
        if trainer.MODEL_FILE not in entries:
            raise ExportError(f"{bundle.path}: no {layout.POLICY}/{trainer.MODEL_FILE} in its manifest")
        with files.open_checked(bundle.path / layout.POLICY / trainer.MODEL_FILE, entries[trainer.MODEL_FILE]) as f:
            state = torch.load(f, weights_only=True)
    try:
        work = workload.Workload(cfg, with_prompts=False)
        model = work.new_model()
    except InvalidSpec as e:  # a model of the user's own: its directory gives the config and the tokenizer
        raise ExportError(f"the run's model directory is needed for its config and tokenizer: {e}") from e
    if state is not None:
        model.load_state_dict(state)
    else:  # the shards of every rank that wrote it, gathered into the one model (DCP reshards to one process)
        sharding.load(bundle.path / layout.POLICY, model, None, entries)
    if trainer.weights_sha256(model.state_dict()) != m.weights_sha256:
        raise ExportError(f"{bundle.path}: the loaded weights do not match the manifest's weights_sha256")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    work.tokenizer.save_pretrained(out)
    (out / "trainingrun.json").write_text(
        json.dumps({"run": m.run, "step": m.step, "weights_sha256": m.weights_sha256, "source": str(bundle.path)})
        + "\n"
    )
    return bundle.path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="trainingrun export", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("run_dir", help="a run's directory (ROOT/local/<run> locally; /checkpoints/<path>/<ns>/<run>)")
    p.add_argument("out", help="a new directory for the Hugging Face model")
    p.add_argument("--step", type=int, default=None, help="this step_N (default: the newest complete one)")
    a = p.parse_args(argv)
    try:
        step_dir = export(a.run_dir, a.out, a.step)
    except TrainingRunError as e:
        print(f"trainingrun export: error: {e}", file=sys.stderr)
        return 2
    print(f"{step_dir} exported to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
