"""The user's data: prompts and answers from a JSONL or Parquet file (`spec.trainer.data`).

    data: {path: problems.jsonl, promptField: question, answerField: answer}
    load(path, prompt_field, answer_field) ─► Dataset(prompts, answers)   row i of the file is dataset index i

The prompt loader (`prompt_loader`) shuffles the indices by the run's seed, and its place is in every checkpoint,
so a resumed run continues with the next prompt; `Dataset.fingerprint` (SHA-256 over the rows read) lets a resume
refuse a file that changed underneath it. Everything wrong with the file is an `InvalidSpec` that names the path,
the field and the row, raised before any training: a missing file, another suffix, a line that is not JSON, a row
without the field (the fields it has are listed), a prompt that is not text, an empty dataset. An answer may be a
number (GSM8K's are): it is kept as its text. Standard library, and pyarrow for Parquet (imported only then).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trainingrun_runtime.errors import InvalidSpec

__all__ = ["SUFFIXES", "Dataset", "load"]

SUFFIXES = (".jsonl", ".parquet")
FIELD = "spec.trainer.data"


@dataclasses.dataclass(frozen=True)
class Dataset:
    """The prompts and answers of one file, in file order."""

    path: Path
    prompts: tuple[str, ...]
    answers: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def fingerprint(self) -> str:
        """SHA-256 over every (prompt, answer) read, in order: equal for the same data, whatever the file format."""
        h = hashlib.sha256()
        for prompt, answer in zip(self.prompts, self.answers, strict=True):
            h.update(json.dumps([prompt, answer], ensure_ascii=False).encode())
            h.update(b"\n")
        return h.hexdigest()


def load(path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer") -> Dataset:
    """Read and check the file; see the module doc for what is refused."""
    p = Path(path)
    if p.suffix not in SUFFIXES:
        raise InvalidSpec(f"{FIELD}.path: {p} is neither .jsonl nor .parquet; convert it to one of them")
    if not p.is_file():
        raise InvalidSpec(f"{FIELD}.path: {p} does not exist (locally a path is relative to the YAML file's directory)")
    rows = _jsonl_rows(p) if p.suffix == ".jsonl" else _parquet_rows(p, prompt_field, answer_field)
    prompts, answers = [], []
    for where, row in rows:
        prompts.append(_text(row, prompt_field, "promptField", p, where, numbers=False))
        answers.append(_text(row, answer_field, "answerField", p, where, numbers=True))
    if not prompts:
        raise InvalidSpec(f"{FIELD}.path: {p} holds no rows; a run needs at least one prompt")
    return Dataset(p, tuple(prompts), tuple(answers))


def _jsonl_rows(p: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    with p.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidSpec(f"{FIELD}.path: {p} line {number} is not JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise InvalidSpec(f"{FIELD}.path: {p} line {number} is a {type(row).__name__}, not a JSON object")
            yield f"line {number}", row


def _parquet_rows(p: Path, prompt_field: str, answer_field: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(p).names
    except Exception as e:
        raise InvalidSpec(f"{FIELD}.path: {p} is not a Parquet file ({e})") from e
    for field, key in ((prompt_field, "promptField"), (answer_field, "answerField")):
        if field not in names:
            raise InvalidSpec(f"{FIELD}.{key}: {p} has no column {field!r}; its columns: {', '.join(names)}")
    table = pq.read_table(p, columns=[prompt_field, answer_field])
    for number, row in enumerate(table.to_pylist()):
        yield f"row {number}", row


def _text(row: Mapping[str, Any], field: str, key: str, p: Path, where: str, *, numbers: bool) -> str:
    if field not in row:
        raise InvalidSpec(f"{FIELD}.{key}: {p} {where} has no field {field!r}; it has: {', '.join(sorted(row))}")
    value = row[field]
    if isinstance(value, str):
        return value
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise InvalidSpec(
        f"{FIELD}.{key}: {p} {where}: {field!r} is {type(value).__name__} {value!r}, not text"
        + (" or a number" if numbers else "")
    )
