"""The credentials a control plane starts with (hack/testbed/credentials.py): the admin's token file and the
ServiceAccount key pair, with `cryptography` and without it (the openssl CLI). Files in tmp_path; no cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import credentials


def test_the_token_file_has_one_admin_in_system_masters_readable_by_this_user_only(tmp_path: Path) -> None:
    token = credentials.new_token()
    path = credentials.write_admin_token_file(tmp_path / "tokens.csv", token)
    assert path.read_text() == f"{token},admin,admin-uid,system:masters\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_tokens_are_long_random_hex() -> None:
    first, second = credentials.new_token(), credentials.new_token()
    assert len(first) == 64 and int(first, 16) >= 0
    assert first != second


@pytest.mark.parametrize("cryptography", [True, False], ids=["cryptography", "openssl"])
def test_the_public_key_is_the_private_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cryptography: bool
) -> None:
    if not cryptography:
        monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives", None)  # its import now fails
    private, public = tmp_path / "sa.key", tmp_path / "sa.pub"
    credentials.write_rsa_pair(private, public)
    derived = subprocess.run(
        ["openssl", "rsa", "-in", str(private), "-pubout"], check=True, capture_output=True, text=True
    ).stdout
    assert public.read_text() == derived
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
