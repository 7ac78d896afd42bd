"""TRL's GRPOTrainer as a TrainingRun's driver: recorded checkpoints, resume, the notice, reports (docs/sdk.md).

The model is `spec.trainer.model.path` (a Hugging Face directory), or, without one, a tiny Llama with a word-level
tokenizer made on the spot, so that the example runs on a CPU with nothing to download. The task is made on the
spot too: a prompt is a few digits, and the reward is the share of the completion's words that are the prompt's
last digit. `spec.trainer` gives `steps`, `seed` and `grpo.lr`, `grpo.groupSize`.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from trainingrun_runtime import sdk
from trainingrun_runtime.sdk.trl import TrainingRunCallback

WORDS = [str(d) for d in range(10)]


def tiny_model(directory: Path, seed: int) -> Path:
    """A 2-layer Llama over the ten digits, and its tokenizer, saved with save_pretrained."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins the words with spaces
    PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=words, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    ).save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def last_digit_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
    """The share of each completion's words that are its prompt's last digit."""
    rewards: list[float | None] = []
    for prompt, completion in zip(prompts, completions, strict=True):
        said = completion.split()
        rewards.append(sum(w == prompt.split()[-1] for w in said) / len(said) if said else 0.0)
    return rewards


def main() -> int:
    from datasets import Dataset
    from trl.trainer.grpo_config import GRPOConfig
    from trl.trainer.grpo_trainer import GRPOTrainer

    run = sdk.attach()
    settings = run.trainer
    seed, steps = int(settings.get("seed", 0)), int(settings.get("steps", 40))
    grpo = settings.get("grpo", {})
    model = settings.get("model", {}).get("path") or str(tiny_model(Path(tempfile.mkdtemp()), seed))
    draw = random.Random(seed)
    prompts = [" ".join(draw.choices(WORDS, k=3)) for _ in range(64)]
    group = int(grpo.get("groupSize", 4))
    args = GRPOConfig(
        output_dir=str(run.run_dir / "trl-output"),  # on the checkpoint volume: a save moves into step_N by rename
        max_steps=steps, learning_rate=float(grpo.get("lr", 1e-3)), seed=seed, num_generations=group,
        per_device_train_batch_size=group * 2, max_completion_length=6, logging_steps=1, save_strategy="no",
        use_cpu=True, report_to="none", disable_tqdm=True,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=last_digit_reward, args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), callbacks=[TrainingRunCallback(run)],
    )  # fmt: skip
    resume = run.resume_dir()  # the newest recorded step: the Trainer's checkpoint directory, verified
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    if run.notice:  # the callback saved on the notice and stopped the Trainer
        run.stop()
    run.finish(trainer.state.global_step)
    return sdk.OK


if __name__ == "__main__":
    raise SystemExit(main())
