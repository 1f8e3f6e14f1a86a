"""Hidden checks of b64: encoding and decoding compared with Python's base64 module."""

import base64

import pytest


@pytest.mark.parametrize("text", ["", "f", "fo", "foo", "foob", "fooba", "foobar", "ünïcødé ✓"])
def test_encodes_like_python(tool, text):
    assert tool(input=text) == base64.b64encode(text.encode()).decode() + "\n"


def test_url_safe_alphabet(tool):
    data = bytes([0xFB, 0xFF, 0xBF]) * 3
    assert tool("--url-safe", input=data) == base64.urlsafe_b64encode(data).decode() + "\n"


def test_decodes(tool):
    assert tool("--decode", input="Zmxha2Vib3Q=\n") == "flakebot"


def test_bad_input_fails(tool):
    import flakebot_magic

    with pytest.raises(flakebot_magic.ToolError):
        tool("--decode", input="not base64!!")
