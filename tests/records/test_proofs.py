"""Proofs kept by what they prove: a proof of one key proves no other, a record is whole or absent, even when killed."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flakebot_magic.host.crashpoints import ENV, POINTS
from flakebot_magic.records.proof_key import ProofKey
from flakebot_magic.records.proofs import ProofStore

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
KEY = ProofKey("src" * 8, "lock" * 8, "rustc 1.95.0\nhost: x86_64", ("test", "--locked"), "all")
#: a different value for each field (the format too): each must give another key
OTHER = {"source": "src2", "lock": "lock2", "toolchain": "rustc 1.96.0", "flags": ("test",), "selection": "lib"}


def test_a_recorded_proof_is_found_reused_with_its_time(tmp_path: Path) -> None:
    store = ProofStore(tmp_path / "proofs")
    assert store.find(KEY) is None
    made = store.record(KEY, passed=3, ignored=1, suites=2, seconds=1.5)
    assert not made.reused
    found = store.find(KEY)
    assert found is not None and found.reused
    assert (found.passed, found.ignored, found.suites, found.proven_at) == (3, 1, 2, made.proven_at)
    assert found.summary() == {"key": KEY.digest(), "reused": True, "proven_at": made.proven_at, "seconds": 1.5}
    for field in OTHER:  # a proof of one key proves no other
        assert store.find(dataclasses.replace(KEY, **{field: OTHER[field]})) is None


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b"[]", b'{"key": {}}', b"x" * 70000, "other key"],
    ids=["empty", "torn", "list", "no-key", "huge", "other-key"],
)
def test_a_damaged_or_foreign_record_is_no_proof(tmp_path: Path, content: bytes | str) -> None:
    store = ProofStore(tmp_path)
    store.record(KEY, passed=1, ignored=0, suites=1, seconds=0.1)
    path = tmp_path / f"{KEY.digest()}.json"
    if content == "other key":  # a record renamed to this key's name still names its own key
        other = dataclasses.replace(KEY, source="elsewhere")
        store.record(other, passed=1, ignored=0, suites=1, seconds=0.1)
        os.replace(tmp_path / f"{other.digest()}.json", path)
    else:
        assert isinstance(content, bytes)
        path.write_bytes(content)
    assert store.find(KEY) is None
    store.record(KEY, passed=1, ignored=0, suites=1, seconds=0.1)  # proven again, written anew
    assert store.find(KEY) is not None


_RECORD = """
import sys
from pathlib import Path
from flakebot_magic.records.proof_key import ProofKey
from flakebot_magic.records.proofs import ProofStore
ProofStore(Path(sys.argv[1])).record(ProofKey("s", "l", "t", ("test",)), passed=2, ignored=0, suites=1, seconds=0.5)
print("recorded", flush=True)
"""
PROOF_POINTS = sorted(p for p in POINTS if p.startswith("proof."))


def test_the_proof_points_are_the_records_steps() -> None:
    assert PROOF_POINTS == ["proof.proven", "proof.recorded"]


@pytest.mark.parametrize("point", PROOF_POINTS)
def test_killed_at_each_crash_point_the_proof_is_whole_or_absent(tmp_path: Path, point: str) -> None:
    env = {**os.environ, ENV: point, "PYTHONPATH": str(PACKAGE.parent)}
    done = subprocess.run([sys.executable, "-c", _RECORD, str(tmp_path)], env=env, capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and b"recorded" not in done.stdout
    store = ProofStore(tmp_path)
    key = ProofKey("s", "l", "t", ("test",))
    found = store.find(key)
    if point == "proof.proven":
        assert found is None  # the tests run again: nothing claims a proof that was not written
    else:
        assert found is not None and found.passed == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    store.record(key, passed=2, ignored=0, suites=1, seconds=0.5)
    assert store.find(key) is not None
