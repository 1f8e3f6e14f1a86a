"""The proof record (issue 24): its file round-trips, a damaged one is a clear error, and its key is stable."""

from __future__ import annotations

import json

import pytest

from flakebot_magic.errors import DeployError
from flakebot_magic.records.proof import PROOF_FORMAT, Proof
from flakebot_magic.records.proof_key import ProofKey

KEY = ProofKey("4b825dc642cb6eb9a060e54bf8d69288fbee4904", "ab12", "rustc 1.95.0", ("nix", "build"))


def _proof(**changes: object) -> Proof:
    fields: dict[str, object] = {
        "key": KEY,
        "backend": "nix",
        "flake_lock": "sha256-ab",
        "tool": "/nix/store/abc-tinyecho-0.2.0",
        "nar_hash": "sha256-AAAA",
        "crate": "tinyecho",
        "version": "0.2.0",
        "checksum": "f00",
        "tests": {"passed": 1, "failed": 0, "ignored": 0},
        "main": "tinyecho",
        "contract": {"kind": "cli", "bin": "tinyecho"},
        "session": {"model": "m", "summaries": ["did it"]},
    }
    fields.update(changes)
    return Proof(**fields)  # type: ignore[arg-type]


def test_the_proof_file_round_trips_and_is_deterministic() -> None:
    proof = _proof()
    assert Proof.from_text(proof.text()) == proof
    assert proof.text() == _proof().text()  # equal builds, equal files, equal store paths
    assert json.loads(proof.text())["format"] == PROOF_FORMAT


def test_passed_means_some_ran_and_none_failed() -> None:
    assert _proof().passed
    assert not _proof(tests={"passed": 3, "failed": 1}).passed
    assert not _proof(tests={}).passed


def test_the_key_is_the_one_proof_key_of_the_proof_cache() -> None:
    """A proof that travels is keyed as this machine's proof cache keys a passing test run (issue 23)."""
    from flakebot_magic.records import proof, proofs

    assert proof.ProofKey is proofs.ProofKey
    assert Proof.from_text(_proof().text()).key.digest() == KEY.digest()
    assert _proof(backend="cargo").text() != _proof().text()  # what built the binary is in the proof, beside the key


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        json.dumps({"format": 99}),
        json.dumps({"format": PROOF_FORMAT, "tool": "x"}),
        json.dumps({**json.loads(_proof().text()), "key": {"source": 1}}),
        # a count too large for a float (a pulled proof is a teammate's file): OverflowError, before red team 5
        _proof().text().replace('"passed": 1', '"passed": 1e999'),
    ],
)
def test_a_damaged_proof_is_a_clear_error(text: str) -> None:
    with pytest.raises(DeployError, match="is not a flakebot proof"):
        Proof.from_text(text, where="/nix/store/x-proof")
