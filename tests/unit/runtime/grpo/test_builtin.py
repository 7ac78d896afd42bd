"""The built-in example as Hugging Face parts keeps what the hand-written model had: the token ids, the reward,
one set of weights per seed."""

from __future__ import annotations

import random

import torch

from trainingrun_runtime import config
from trainingrun_runtime.grpo import builtin, task, trainer

TASK = config.TaskConfig(kind="reverse", digits=4, length=3, dataset_size=64)
MODEL = config.ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)


def test_the_tokenizer_gives_the_hand_written_models_token_ids() -> None:
    the_task = task.Task(TASK, seed=0)
    tok = builtin.tokenizer(TASK)
    prompts = builtin.Prompts(the_task)
    for index in range(10):
        assert tok(prompts.prompt_of(index))["input_ids"] == the_task.prompt_tokens(the_task.digits_of(index))


def test_partial_credit_on_the_decoded_completion_is_the_old_reward_on_its_tokens() -> None:
    """Every completion, special words included (they keep their place and count as wrong)."""
    the_task = task.Task(TASK, seed=0)
    tok = builtin.tokenizer(TASK)
    prompts = builtin.Prompts(the_task)
    rng = random.Random(0)
    for index in range(200):
        tokens = [rng.randrange(the_task.vocab_size) for _ in range(the_task.completion_len)]
        text = tok.decode(tokens, skip_special_tokens=True)
        old = the_task.reward(the_task.digits_of(index), tokens)
        assert builtin.partial_credit(prompts.prompt_of(index), text, prompts.answer_of(index)) == old, text


def test_the_same_seed_builds_the_same_weights_and_another_seed_others() -> None:
    the_task = task.Task(TASK, seed=0)
    torch.manual_seed(123)
    a = trainer.weights_sha256(builtin.model(MODEL, the_task, seed=0).state_dict())
    torch.manual_seed(456)
    b = trainer.weights_sha256(builtin.model(MODEL, the_task, seed=0).state_dict())
    c = trainer.weights_sha256(builtin.model(MODEL, the_task, seed=1).state_dict())
    assert a == b != c


def test_the_first_policy_is_not_nearly_constant() -> None:
    """PyTorch's default init, not GPT-2's N(0, 0.02): the first policy's next-token distributions differ by
    prompt, which is what gives GRPO a signal in the first steps."""
    the_task = task.Task(TASK, seed=0)
    m = builtin.model(MODEL, the_task, seed=0)
    tok = builtin.tokenizer(TASK)
    prompts = builtin.Prompts(the_task)
    ids = torch.tensor([tok(prompts.prompt_of(i))["input_ids"] for i in range(16)])
    with torch.no_grad():
        probs = m(input_ids=ids).logits[:, -1].softmax(-1)
    assert float(probs.std(dim=0).max()) > 0.005
