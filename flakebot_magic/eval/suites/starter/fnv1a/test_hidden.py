"""Hidden checks of fnv1a: the 64-bit FNV-1a hash, computed here in Python from its definition."""

import pytest


def fnv1a_64(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return value


@pytest.mark.parametrize("text", ["", "a", "foobar", "flakebot\n", "z" * 3000])
def test_hash_matches_the_definition(tool, text):
    assert tool(input=text) == f"{fnv1a_64(text.encode()):016x}\n"


def test_known_vector(tool):
    assert tool(input="foobar") == "85944171f73967e8\n"
