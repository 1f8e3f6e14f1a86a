"""Hidden checks of thousands: separators compared with Python's format(n, ",")."""

import pytest

import flakebot_magic

NUMBERS = [0, 7, 999, 1000, -1000, 1234567, -987654321, 2**62]


def test_english(tool):
    assert tool(input="".join(f"{n}\n" for n in NUMBERS)) == "".join(f"{n:,}\n" for n in NUMBERS)


def test_german_uses_dots(tool):
    expected = "".join(f"{n:,}".replace(",", ".") + "\n" for n in NUMBERS)
    assert tool("--locale", "de", input="".join(f"{n}\n" for n in NUMBERS)) == expected


def test_not_a_number_fails(tool):
    with pytest.raises(flakebot_magic.ToolError):
        tool(input="12a\n")
