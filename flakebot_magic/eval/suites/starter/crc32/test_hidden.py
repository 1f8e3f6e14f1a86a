"""Hidden checks of crc32: CRC-32 compared with zlib.crc32."""

import zlib

import pytest


def expected(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}  -\n"


@pytest.mark.parametrize("text", ["", "a", "The quick brown fox jumps over the lazy dog", "y" * 5000, "ünïcødé"])
def test_like_python(tool, text):
    assert tool(input=text) == expected(text.encode())


def test_binary_input(tool):
    data = bytes(range(256)) * 3
    assert tool(input=data) == expected(data)
