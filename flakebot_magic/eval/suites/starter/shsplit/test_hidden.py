"""Hidden checks of shsplit: words compared with Python's shlex.split (POSIX mode)."""

import shlex

import pytest

import flakebot_magic


@pytest.mark.parametrize(
    "line",
    [
        "ls -la /tmp",
        "echo 'single quoted' \"double quoted\"",
        'grep -e "a b" -- file\\ name',
        "a\\ b 'c d'e f",
        "  leading   and   trailing  ",
    ],
)
def test_words_like_shlex(tool, line):
    words = shlex.split(line)
    assert tool(input=line + "\n") == "".join(f"{w}\n" for w in words)


def test_unclosed_quote_is_an_error(tool):
    with pytest.raises(flakebot_magic.ToolError):
        tool(input="echo 'not closed\n")
