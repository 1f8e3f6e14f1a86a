"""Hidden checks of hexenc: encoding against Python's bytes.hex, both cases, and decoding back."""

import pytest


@pytest.mark.parametrize("text", ["", "abc", "flakebot\n", "ünïcødé ✓"])
def test_encodes_like_bytes_hex(tool, text):
    assert tool(input=text) == text.encode().hex() + "\n"


def test_upper_case(tool):
    # U+00AB is two bytes in UTF-8, c2 ab
    assert tool("--upper", input="\x0f\u00ab") == "0FC2AB\n"


def test_decodes_hex_back(tool):
    assert tool("--decode", input="666c616b65626f74") == "flakebot"


def test_decode_ignores_whitespace(tool):
    assert tool("--decode", input="68 69\n") == "hi"
