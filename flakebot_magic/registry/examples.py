"""What a request shows instead of naming: the shape of an example says what it is.

People often write an example where a crate's description would use a
name: "turn myVariableName into my_variable_name" means camel case and snake
case, "check a string against ^\\d+$" means a regex, "a string like
deadbeef" means hex, "é👍🏽" means Unicode. Their words say nothing a crate's
text holds (``myvariablename`` is in no description), so :func:`named` reads
the example's shape and gives the words crates use for it, which
:func:`with_names` adds to the request, for its words (:func:`.ranking.concepts`)
and for its meaning (the embedding a directory registry searches with). A shape is
recognised, never a particular example: any camelCase identifier, any
regular expression with a character class or an anchor, any hex string.

Examples
--------
>>> named("how do I turn myVariableName into my_variable_name?")
('camel case', 'snake case')
>>> named("check that a string fits ^\\\\d+$"), named("render markdown to html")
(('regex',), ())
"""

from __future__ import annotations

import re

__all__ = ["SHAPES", "named", "with_names"]

#: (what an example of the shape is called in crates' words, what it cannot lack (None: nothing to check first),
#: the shape): camelCase and snake_case identifiers, a regular expression (a class such as ``\d`` or ``[a-z]``, an
#: anchored pattern, ``.*``), a hex string (8 or more hex digits, or 6 or more with both a digit and a letter), a
#: link, an ISO date, a version number, a UUID, an email address, and text beyond ASCII (an accent, an emoji).
#: The first check spares a plain request the shape's pattern (a search reads its examples twice: words and meaning).
SHAPES: tuple[tuple[str, re.Pattern[str] | None, re.Pattern[str]], ...] = (
    ("camel case", re.compile("[A-Z]"), re.compile(r"\b[a-z]+(?:[A-Z][a-z0-9]+)+\b")),
    ("snake case", re.compile("_"), re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")),
    (
        "regex",
        re.compile(r"[\\\[^$*+]"),
        re.compile(r"\\[dDwWsSb]|\[[^\]\s]-[^\]\s]\]|(?:^|\s)\^\S|\S[+*]\$(?:\s|$)|\.\*|\.\+"),
    ),
    (
        "hex",
        re.compile(r"\d|[a-f]{8}"),
        re.compile(r"\b(?:[a-f]{8,}|(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{6,})\b"),
    ),
    ("url", re.compile("[/.]"), re.compile(r"\b(?:https?|ftp)://\S|\bwww\.\w", re.I)),
    ("date", re.compile("-"), re.compile(r"\b\d{4}-\d{2}-\d{2}\b")),
    ("version", re.compile(r"\."), re.compile(r"\bv?\d+\.\d+\.\d+\b")),
    ("uuid", re.compile("-"), re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-", re.I)),
    ("email", re.compile("@"), re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+\.[a-z]{2,}\b", re.I)),
    ("unicode", None, re.compile(r"[^\x00-\x7f‘’“”–—…]")),
)


def named(query: str) -> tuple[str, ...]:
    """The names of the shapes of the examples in ``query`` (:data:`SHAPES`), in that table's order.

    Examples
    --------
    >>> named("a string like 'deadbeef' from bytes"), named("split 'é👍🏽' into characters")
    (('hex',), ('unicode',))
    >>> named("parse 2024-03-01 and https://example.org")
    ('url', 'date')
    """
    return tuple(name for name, hint, shape in SHAPES if (hint is None or hint.search(query)) and shape.search(query))


def with_names(query: str) -> str:
    """``query`` followed by the names of the examples it shows, as it is searched (by words and by meaning).

    Examples
    --------
    >>> with_names("turn myVariableName into my_variable_name"), with_names("wrap text")
    ('turn myVariableName into my_variable_name camel case snake case', 'wrap text')
    """
    return " ".join([query, *named(query)])
