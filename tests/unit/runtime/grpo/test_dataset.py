"""The user's data file: JSONL and Parquet read alike; everything wrong with it is refused naming path, field and
row, before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainingrun_runtime.errors import InvalidSpec
from trainingrun_runtime.grpo import dataset

ROWS = [{"question": "2+2?", "solution": "4", "extra": 1}, {"question": "3*3?", "solution": 9, "extra": 2}]


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_jsonl_file_with_custom_field_names_reads_in_file_order_with_numeric_answers_as_text(tmp_path: Path) -> None:
    d = dataset.load(_jsonl(tmp_path / "d.jsonl", ROWS), "question", "solution")
    assert (d.prompts, d.answers, len(d)) == (("2+2?", "3*3?"), ("4", "9"), 2)


def test_a_parquet_file_reads_as_the_same_data_with_the_same_fingerprint(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist([{**r, "solution": str(r["solution"])} for r in ROWS]), tmp_path / "d.parquet")
    from_parquet = dataset.load(tmp_path / "d.parquet", "question", "solution")
    from_jsonl = dataset.load(_jsonl(tmp_path / "d.jsonl", ROWS), "question", "solution")
    assert (from_parquet.prompts, from_parquet.answers) == (from_jsonl.prompts, from_jsonl.answers)
    assert from_parquet.fingerprint == from_jsonl.fingerprint


def test_the_fingerprint_changes_when_one_answer_does(tmp_path: Path) -> None:
    a = dataset.load(_jsonl(tmp_path / "a.jsonl", ROWS), "question", "solution")
    b = dataset.load(_jsonl(tmp_path / "b.jsonl", [ROWS[0], {**ROWS[1], "solution": 10}]), "question", "solution")
    assert a.fingerprint != b.fingerprint


def test_a_missing_file_is_refused_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.trainer\.data\.path: .*nope\.jsonl does not exist"):
        dataset.load(tmp_path / "nope.jsonl")


def test_a_file_of_another_format_is_refused_naming_the_formats(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("prompt,answer\n")
    with pytest.raises(InvalidSpec, match=r"spec\.trainer\.data\.path: .*d\.csv is neither \.jsonl nor \.parquet"):
        dataset.load(tmp_path / "d.csv")


def test_an_unknown_field_is_refused_naming_the_field_the_row_and_the_fields_there_are(tmp_path: Path) -> None:
    with pytest.raises(
        InvalidSpec, match=r"spec\.trainer\.data\.promptField: .* line 1 has no field 'prompt'; it has: extra, question"
    ):
        dataset.load(_jsonl(tmp_path / "d.jsonl", ROWS), "prompt", "solution")
    pq.write_table(pa.Table.from_pylist([{"q": "x", "a": "y"}]), tmp_path / "d.parquet")
    with pytest.raises(
        InvalidSpec, match=r"spec\.trainer\.data\.answerField: .* no column 'answer'; its columns: q, a"
    ):
        dataset.load(tmp_path / "d.parquet", "q", "answer")


def test_a_line_that_is_not_json_is_refused_naming_its_number(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"prompt": "a", "answer": "b"}\n{"prompt": \n')
    with pytest.raises(InvalidSpec, match=r"d\.jsonl line 2 is not JSON"):
        dataset.load(tmp_path / "d.jsonl")


def test_a_prompt_that_is_not_text_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match=r"line 1: 'prompt' is int 5, not text$"):
        dataset.load(_jsonl(tmp_path / "d.jsonl", [{"prompt": 5, "answer": "5"}]))


def test_an_empty_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text("\n\n")
    with pytest.raises(InvalidSpec, match=r"holds no rows"):
        dataset.load(tmp_path / "d.jsonl")
    pq.write_table(
        pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), tmp_path / "e.parquet"
    )
    with pytest.raises(InvalidSpec, match=r"holds no rows"):
        dataset.load(tmp_path / "e.parquet")
