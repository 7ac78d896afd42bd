"""Rewards: exact and math answers score as a grader would; a user's function is found, called and held to
finite numbers, and every failure names the function, the field or the sample."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainingrun_runtime.errors import InvalidSpec, RewardFailed
from trainingrun_runtime.grpo import rewards


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [("  42\n", "42", 1.0), ("42.", "42", 0.0), ("forty-two", "42", 0.0), ("a b", "a b", 1.0)],
)
def test_an_exact_reward_compares_the_stripped_texts(completion: str, answer: str, score: float) -> None:
    assert rewards.build("exact").score("q", completion, answer) == score


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("So the total is 3 + 4 = 7", "7"),
        ("The answer is \\boxed{1,234}.", "1234"),
        ("\\boxed{\\frac{1}{2}} ... no, \\boxed{3/4}", "0.75"),
        ("She pays $12 in all.\n#### 12", "12"),
        ("#### 72.0 and then some chatter 5", "Natalia sold 72 clips.\n#### 72"),
        ("It is -0.5", "-1/2"),
    ],
)
def test_a_math_reward_reads_the_final_answer_as_a_number(completion: str, answer: str) -> None:
    assert rewards.build("math").score("q", completion, answer) == 1.0


@pytest.mark.parametrize(
    ("completion", "answer"),
    [("7 then 8", "7"), ("no number at all", "7"), ("\\boxed{7} but #### 8", "8"), ("\\boxed{x}", "7")],
)
def test_a_math_reward_scores_zero_when_the_final_answer_differs_or_is_missing(completion: str, answer: str) -> None:
    assert rewards.build("math").score("q", completion, answer) == 0.0


def _module(tmp_path: Path, name: str, body: str) -> Path:
    (tmp_path / f"{name}.py").write_text(body)
    return tmp_path


def test_a_function_reward_is_imported_from_the_search_path_and_called_with_prompt_completion_answer(
    tmp_path: Path,
) -> None:
    d = _module(
        tmp_path,
        "tr_reward_len",
        "def score(prompt, completion, answer):\n    return len(prompt + completion + answer) / 10\n",
    )
    reward = rewards.build("function", "tr_reward_len:score", [d])
    assert reward.score("ab", "cd", "efg") == 0.7


def test_a_function_that_raises_fails_naming_itself_and_the_sample(tmp_path: Path) -> None:
    d = _module(tmp_path, "tr_reward_raises", "def score(p, c, a):\n    raise KeyError('units')\n")
    reward = rewards.build("function", "tr_reward_raises:score", [d])
    with pytest.raises(RewardFailed, match=r"tr_reward_raises:score raised KeyError: 'units' on prompt '2\+2'"):
        reward.score("2+2", "4", "4")


@pytest.mark.parametrize("value", ["math.nan", "math.inf", "'1.0'", "None", "True"])
def test_a_function_that_returns_no_finite_number_fails_rather_than_scoring_zero(tmp_path: Path, value: str) -> None:
    name = f"tr_reward_bad_{abs(hash(value))}"
    d = _module(tmp_path, name, f"import math\ndef score(p, c, a):\n    return {value}\n")
    reward = rewards.build("function", f"{name}:score", [d])
    with pytest.raises(RewardFailed, match=rf"{name}:score returned .*not a finite number, on prompt 'p'"):
        reward.score("p", "c", "a")
    assert math.isfinite(rewards.build("exact").score("p", "c", "a"))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", r"is not 'module:callable'"),
        ("tr_no_such_module_xyz:f", r"cannot import module 'tr_no_such_module_xyz'.*runtime image"),
        ("tr_reward_attrs:missing", r"module 'tr_reward_attrs' has no 'missing'"),
        ("tr_reward_attrs:CONSTANT", r"is a int, not a function"),
    ],
)
def test_a_reward_function_that_cannot_be_used_is_refused_naming_the_field(
    tmp_path: Path, spec: str, message: str
) -> None:
    d = _module(tmp_path, "tr_reward_attrs", "CONSTANT = 3\n")
    with pytest.raises(InvalidSpec, match=rf"spec\.trainer\.reward\.function: .*{message}"):
        rewards.build("function", spec, [d])


def test_a_function_reward_without_a_function_is_refused() -> None:
    with pytest.raises(InvalidSpec, match=r"reward\.function must name"):
        rewards.build("function")
