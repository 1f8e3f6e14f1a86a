"""Hidden checks of sha1sum: SHA-1 digests compared with hashlib."""

import hashlib

import pytest


def expected(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest() + "  -\n"


@pytest.mark.parametrize("text", ["", "a", "The quick brown fox jumps over the lazy dog", "y" * 5000, "ünïcødé"])
def test_like_python(tool, text):
    assert tool(input=text) == expected(text.encode())


def test_binary_input(tool):
    data = bytes(range(256)) * 3
    assert tool(input=data) == expected(data)
