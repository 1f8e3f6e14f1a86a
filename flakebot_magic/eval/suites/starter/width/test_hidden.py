"""Hidden checks of width: terminal columns of ASCII, CJK, fullwidth forms and combining marks."""

import pytest

CASES = [
    ("", 0),
    ("hello", 5),
    ("日本語", 6),
    ("ｆｕｌｌ", 8),  # fullwidth Latin letters
    ("e\u0301", 1),  # e and a combining acute accent
    ("한국어 text", 11),
    ("tab-free ascii, punctuation!", 28),
]


@pytest.mark.parametrize(("line", "columns"), CASES)
def test_one_line(tool, line, columns):
    assert tool(input=line + "\n") == f"{columns}\n"


def test_every_line(tool):
    text = "".join(line + "\n" for line, _ in CASES[1:])
    assert tool(input=text) == "".join(f"{columns}\n" for _, columns in CASES[1:])
