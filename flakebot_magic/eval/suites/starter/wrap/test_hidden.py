"""Hidden checks of wrap: greedy filling compared with Python's textwrap.fill, paragraph by paragraph."""

import textwrap

import pytest

TEXT = (
    "The quick brown fox jumps over the lazy dog while the compiler proves every step of the way "
    "and the tests say what the tool does"
)


@pytest.mark.parametrize("width", [10, 20, 33, 80])
def test_fills_like_textwrap(tool, width):
    assert tool("--width", str(width), input=TEXT) == textwrap.fill(TEXT, width) + "\n"


def test_default_width_is_80(tool):
    assert tool(input=TEXT) == textwrap.fill(TEXT, 80) + "\n"


def test_paragraphs_stay_apart(tool):
    first, second = "alpha beta gamma delta", "epsilon zeta eta theta"
    expected = textwrap.fill(first, 12) + "\n\n" + textwrap.fill(second, 12) + "\n"
    assert tool("--width", "12", input=f"{first}\n\n{second}\n") == expected


def test_line_breaks_inside_a_paragraph_are_spaces(tool):
    assert tool("--width", "40", input="one\ntwo\nthree") == "one two three\n"
