"""Hidden checks of sha256: digests compared with Python's hashlib, the sha256sum output format."""

import hashlib

import pytest


@pytest.mark.parametrize("text", ["", "a", "flakebot\n", "x" * 10_000, "ünïcødé"])
def test_digest_like_hashlib(tool, text):
    assert tool(input=text) == hashlib.sha256(text.encode()).hexdigest() + "  -\n"


def test_binary_input(tool):
    data = bytes(range(256)) * 4
    assert tool(input=data) == hashlib.sha256(data).hexdigest() + "  -\n"
