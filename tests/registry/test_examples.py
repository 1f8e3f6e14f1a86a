"""The shapes of examples in a request (camelCase, a regex, a hex string ...) and the words they add to its concepts."""

from __future__ import annotations

import doctest

import pytest

from flakebot_magic.registry import examples
from flakebot_magic.registry.examples import named
from flakebot_magic.registry.ranking import concepts


def test_doctests() -> None:
    assert doctest.testmod(examples).failed == 0


@pytest.mark.parametrize(
    ("request_text", "shapes"),
    [
        ("rename fooBar and getUserId", ("camel case",)),
        ("make user_id and max_retry_count", ("snake case",)),
        ("does the line fit [0-9]+ ?", ("regex",)),
        ("match \\w+@\\w+ in a log", ("regex",)),
        ("print cafebabe or 00ff10 from a buffer", ("hex",)),
        ("open www.example.org", ("url",)),
        ("compare v1.2.3 with 1.10.0", ("version",)),
        ("a key like 123e4567-e89b-12d3-a456-426614174000", ("hex", "uuid")),
        ("mail someone@example.com", ("email",)),
        ("naïve café", ("unicode",)),
    ],
)
def test_each_shape_is_recognised_in_examples_no_table_holds(request_text: str, shapes: tuple[str, ...]) -> None:
    assert named(request_text) == shapes


@pytest.mark.parametrize(
    "plain",
    [
        "render markdown to html",
        "Convert CommonMark and GitHub flavoured text",  # product names are no camelCase example
        "parse a TOML config file, then print it",
        "a decade of faded beads",  # English words of hex letters are shorter than a hex string
        "what's the “best” way — quickly…",  # typographic punctuation is not text beyond ASCII to process
        "version 2 of the file",
        "a user-visible, well-known word",
    ],
)
def test_ordinary_wording_shows_no_example(plain: str) -> None:
    assert named(plain) == ()


def test_an_examples_name_becomes_a_concept_of_the_request() -> None:
    found = {c.word for c in concepts("turn myVariableName into my_variable_name")}
    assert {"camel", "snake", "case"} <= found
    assert "regex" in {c.word for c in concepts("does a string fit ^\\d+$")}
    assert "regex" not in {c.word for c in concepts("does a string fit a pattern")}
