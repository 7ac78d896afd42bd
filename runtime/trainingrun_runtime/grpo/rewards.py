"""Rewards: a completion's score against its prompt's answer (`spec.trainer.reward`).

    exact     1.0 if the completion equals the answer once both are stripped of surrounding whitespace, else 0.0
    math      1.0 if the completion's final answer equals the answer as a number, else 0.0; the final answer is
              the content of the last `\\boxed{…}`, else the number after the last `#### `, else the last number
              in the text (`1,234`, `-0.5`, `3/4` and `$12` read as numbers; `72` equals `72.0`)
    function  `reward.function: "module:callable"`, called as `callable(prompt, completion, answer) -> float`;
              the module is imported from the YAML file's directory or PYTHONPATH locally, and from the runtime
              image on a cluster

A function that raises, or returns something that is not a finite number, fails the attempt with `RewardFailed`
naming the function and the sample, rather than scoring 0 silently. Pure standard library: the generation
workers call `score` on each completion they sample.
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Literal

from trainingrun_runtime.errors import InvalidSpec, RewardFailed

__all__ = ["Reward", "build", "final_number", "load_function", "numbers_equal"]

Kind = Literal["exact", "math", "function"]
FIELD = "spec.trainer.reward.function"

_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?"
_BOXED = re.compile(r"\\boxed\{")
_HASHES = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)


def _boxed(text: str) -> str | None:
    """The content of the last `\\boxed{…}` (braces inside it balanced), or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


def _as_number(text: str) -> Fraction | None:
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def final_number(completion: str) -> Fraction | None:
    """The completion's final answer as an exact number (see the module doc), or None when it has none."""
    boxed = _boxed(completion)
    if boxed is not None:
        return _as_number(boxed)
    hashes = _HASHES.findall(completion)
    if hashes:
        return _as_number(hashes[-1])
    found = _ANY_NUMBER.findall(completion)
    return _as_number(found[-1]) if found else None


def numbers_equal(completion: str, answer: str) -> bool:
    """Whether the completion's final number equals the answer's (the answer may itself end in `#### n`)."""
    got, want = final_number(completion), final_number(answer)
    return got is not None and want is not None and got == want


def load_function(spec: str, search_path: Sequence[Path] = ()) -> Callable[[str, str, str], object]:
    """The callable named by `"module:callable"` (dots allowed on both sides), with `search_path` tried first.

    InvalidSpec naming spec.trainer.reward.function when the name is malformed, the module cannot be imported, or
    the attribute is missing or not callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidSpec(f"{FIELD}: {spec!r} is not 'module:callable' (e.g. 'my_rewards:score')")
    for entry in reversed([str(p) for p in search_path]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as e:
        where = ", ".join(str(p) for p in search_path) or "PYTHONPATH"
        raise InvalidSpec(
            f"{FIELD}: cannot import module {module_name!r} ({e}); put it in {where} or, on a cluster, in the "
            "runtime image"
        ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InvalidSpec(f"{FIELD}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise InvalidSpec(f"{FIELD}: {spec!r} is a {type(obj).__name__}, not a function")
    return obj


class Reward:
    """One reward kind, ready to score: `score(prompt, completion, answer) -> float`."""

    def __init__(self, kind: Kind, function: Callable[[str, str, str], object] | None = None, name: str = "") -> None:
        if (kind == "function") != (function is not None):
            raise ValueError("a function reward needs its callable, and only it")
        self.kind, self._function, self.name = kind, function, name

    def score(self, prompt: str, completion: str, answer: str) -> float:
        if self.kind == "exact":
            return float(completion.strip() == answer.strip())
        if self.kind == "math":
            return float(numbers_equal(completion, answer))
        assert self._function is not None
        sample = f"prompt {_short(prompt)}, completion {_short(completion)}, answer {_short(answer)}"
        try:
            value = self._function(prompt, completion, answer)
        except Exception as e:
            raise RewardFailed(f"reward function {self.name} raised {type(e).__name__}: {e} on {sample}") from e
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardFailed(f"reward function {self.name} returned {value!r}, not a finite number, on {sample}")
        return float(value)


def build(kind: Kind, function: str | None = None, search_path: Sequence[Path] = ()) -> Reward:
    """The reward of `spec.trainer.reward` (`function` is the `module:callable` of kind `function`)."""
    if kind == "function":
        if not function:
            raise InvalidSpec(f"{FIELD}: reward.kind is function, so reward.function must name 'module:callable'")
        return Reward(kind, load_function(function, search_path), function)
    return Reward(kind)


def _short(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")
