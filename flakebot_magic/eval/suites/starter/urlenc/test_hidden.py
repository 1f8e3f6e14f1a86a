"""Hidden checks of urlenc: compared with urllib.parse.quote(text, safe="") and unquote."""

from urllib.parse import quote, unquote

import pytest


@pytest.mark.parametrize("text", ["", "plain", "a b/c?d=e&f", "100% ~sure_-.", "ünïcødé ✓", "#[]@!$'()*+,;"])
def test_encodes_like_urllib(tool, text):
    assert tool(input=text + "\n") == quote(text, safe="") + "\n"


@pytest.mark.parametrize("text", ["a%20b", "%E2%9C%93%20ok", "no-escapes"])
def test_decodes_like_urllib(tool, text):
    assert tool("--decode", input=text) == unquote(text) + "\n"
