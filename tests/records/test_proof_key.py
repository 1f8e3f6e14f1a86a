"""The proof key: every field of it matters, nothing else is in it, and it survives JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from flakebot_magic.records.proof_key import PROOF_KEY_FORMAT, ProofKey

KEY = ProofKey("src" * 8, "lock" * 8, "rustc 1.95.0\nhost: x86_64", ("test", "--locked"), "all")
#: a different value for each field but the format: each must give another key
OTHER = {"source": "src2", "lock": "lock2", "toolchain": "rustc 1.96.0", "flags": ("test",), "selection": "lib"}


def test_the_key_has_the_fields_the_proof_depends_on_and_nothing_else() -> None:
    assert [f.name for f in dataclasses.fields(ProofKey)] == [*OTHER, "format"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        KEY.source = "x"  # type: ignore[misc]


@pytest.mark.parametrize("field", [*OTHER, "format"])
def test_every_field_changes_the_digest(field: str) -> None:
    changed = dataclasses.replace(KEY, **{field: OTHER.get(field, PROOF_KEY_FORMAT + 1)})
    assert changed != KEY and changed.digest() != KEY.digest()


def test_the_digest_is_the_same_for_an_equal_key_and_survives_json() -> None:
    again = ProofKey.from_dict(json.loads(json.dumps(KEY.as_dict())))
    assert again == KEY and again.digest() == KEY.digest() == ProofKey(*dataclasses.astuple(KEY)).digest()


@pytest.mark.parametrize(
    "data",
    [None, [], {}, {**KEY.as_dict(), "format": 0}, {**KEY.as_dict(), "flags": "test"}, {**KEY.as_dict(), "lock": 1}],
)
def test_anything_but_a_key_of_this_format_is_no_key(data: object) -> None:
    assert ProofKey.from_dict(data) is None
