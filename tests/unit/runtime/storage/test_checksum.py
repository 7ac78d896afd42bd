"""The file checksums of a bundle: each format's algorithm, and hashers for both."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import blake3
import pytest

from trainingrun_runtime.storage import checksum


def test_format_1_files_carry_sha256_and_format_2_files_blake3_which_this_version_writes() -> None:
    assert dict(checksum.ALGORITHMS) == {1: "sha256", 2: "blake3"}
    assert checksum.CURRENT == checksum.ALGORITHMS[max(checksum.ALGORITHMS)] == "blake3"


@pytest.mark.parametrize(
    ("algorithm", "reference"),
    [("blake3", lambda b: blake3.blake3(b).hexdigest()), ("sha256", lambda b: hashlib.sha256(b).hexdigest())],
)
def test_a_hasher_fed_in_pieces_gives_the_algorithms_digest_of_the_whole(
    algorithm: str, reference: Callable[[bytes], str]
) -> None:
    data = bytes(range(256)) * 1000
    h = checksum.new(algorithm)
    for at in range(0, len(data), 4096):
        h.update(memoryview(data)[at : at + 4096])
    assert h.hexdigest() == reference(data)
    assert checksum.is_hex_digest(h.hexdigest())


def test_an_unknown_algorithm_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown checksum algorithm 'md5' \(known: \['blake3', 'sha256'\]\)"):
        checksum.new("md5")
