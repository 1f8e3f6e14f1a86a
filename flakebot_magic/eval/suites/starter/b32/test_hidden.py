"""Hidden checks of b32: RFC 4648 base32 compared with Python's base64.b32encode."""

import base64

import pytest


@pytest.mark.parametrize("text", ["", "f", "fo", "foo", "foob", "fooba", "foobar", "flakebot ✓"])
def test_encodes_like_python(tool, text):
    assert tool(input=text) == base64.b32encode(text.encode()).decode() + "\n"


def test_decodes(tool):
    assert tool("--decode", input=base64.b32encode(b"hidden checks").decode()) == "hidden checks"
