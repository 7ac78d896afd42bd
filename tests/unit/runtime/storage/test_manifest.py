"""The checkpoint manifest: a round trip through JSON (format 2, BLAKE3 per file; format 1, SHA-256 per file), and
every invalid manifest refused naming the key."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from support.bundles import RUN
from trainingrun_runtime.errors import CheckpointCorrupt
from trainingrun_runtime.storage import manifest
from trainingrun_runtime.storage.manifest import FileEntry, Manifest

B3 = "b" * 64


def sample_manifest() -> Manifest:
    return Manifest(
        format_version=manifest.FORMAT_VERSION,
        run=RUN,
        step=3,
        attempt=2,
        config_hash="abc",
        created="2025-01-02T03:04:05.678Z",
        files={"data_plane/a": FileEntry(size=3, digest="0" * 64)},
        replay_digest="d" * 64,
        replay_mode="authoritative",
        weights_sha256=None,
        extra={"k": [1, 2]},
    )


def test_a_manifest_survives_a_round_trip_through_json() -> None:
    m = sample_manifest()
    assert Manifest.from_json(m.to_json()) == m
    assert json.loads(m.to_json())["weights_sha256"] is None


def test_this_version_writes_format_2_with_a_blake3_per_file() -> None:
    assert manifest.FORMAT_VERSION == 2
    written = json.loads(sample_manifest().to_json())
    assert written["format_version"] == 2
    assert written["files"] == {"data_plane/a": {"size": 3, "blake3": "0" * 64}}


def test_a_format_1_manifest_with_a_sha256_per_file_is_read_as_format_1() -> None:
    d = sample_manifest().to_dict()
    d.update(format_version=1, files={"data_plane/a": {"size": 3, "sha256": "a" * 64}})
    m = Manifest.from_json(json.dumps(d).encode())
    assert m.format_version == 1
    assert m.files == {"data_plane/a": FileEntry(size=3, digest="a" * 64, algorithm="sha256")}
    assert json.loads(m.to_json()) == d  # read and written back unchanged


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.pop("replay_digest"), "required key 'replay_digest' is missing"),
        (lambda d: d.update(step="3"), "'step' must be int"),
        (lambda d: d.update(step=True), "'step' must be int"),
        (lambda d: d.update(format_version=99), "format_version 99 is not supported"),
        (lambda d: d.update(surprise=1), "unknown manifest keys ['surprise']"),
        (lambda d: d.update(format_version=3), "format_version 3 is not supported (this reader: [1, 2])"),
        (lambda d: d.update(files={"../etc/passwd": {"size": 1, "blake3": B3}}), "unsafe or reserved path"),
        (lambda d: d.update(files={"manifest.json": {"size": 1, "blake3": B3}}), "unsafe or reserved path"),
        (lambda d: d.update(files={"a": {"size": -1, "blake3": B3}}), "invalid size or blake3"),
        (lambda d: d.update(files={"a": {"size": 1, "blake3": "xyz"}}), "invalid size or blake3"),
        (lambda d: d.update(files={"a": {"size": 1, "blake3": B3.upper()}}), "invalid size or blake3"),
        # The checksum must be the format's: a SHA-256 in format 2, a BLAKE3 in format 1, or both, are refused.
        (lambda d: d.update(files={"a": {"size": 1, "sha256": B3}}), "files['a'] must be {size, blake3}"),
        (lambda d: d.update(files={"a": {"size": 1, "blake3": B3, "sha256": B3}}), "must be {size, blake3}"),
        (lambda d: d.update(format_version=1), "files['data_plane/a'] must be {size, sha256}"),
        (lambda d: d.update(format_version=1, files={"a": {"size": 1, "sha256": "xyz"}}), "invalid size or sha256"),
        (lambda d: d.update(weights_sha256=5), "weights_sha256 must be a string or null"),
        (lambda d: d.pop("weights_sha256"), "required key 'weights_sha256' is missing"),
        (lambda d: d.pop("extra"), "required key 'extra' is missing"),
        (lambda d: d.update(files=[]), "'files' must be dict"),
    ],
)
def test_an_invalid_manifest_is_refused_naming_the_key(
    mutate: Callable[[dict[str, object]], object], problem: str
) -> None:
    d = sample_manifest().to_dict()
    mutate(d)
    with pytest.raises(CheckpointCorrupt) as info:
        Manifest.from_json(json.dumps(d).encode(), where="x/manifest.json")
    assert str(info.value).startswith("x/manifest.json: ")
    assert problem in str(info.value)


def test_a_manifest_with_nan_is_not_valid_json() -> None:
    raw = sample_manifest().to_json().replace(b'"extra": {', b'"extra": {"x": NaN, ')
    with pytest.raises(CheckpointCorrupt, match="not valid JSON"):
        Manifest.from_json(raw)
