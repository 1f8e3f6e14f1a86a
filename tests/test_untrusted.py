"""The one sanitizer for untrusted text, as properties over every string rather than a list of attacks.

The forbidden set is written here again from its definition (docs/SECURITY.md,
"Text shown to you"), not imported: a wrong set in the module must not make
its own test pass.
"""

from __future__ import annotations

import html
import re

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flakebot_magic.untrusted import (
    REPLACEMENT,
    is_safe,
    safe_data,
    safe_html,
    safe_line,
    safe_text,
    strip_sequences,
    styled_html,
)

C0 = {chr(c) for c in range(0x20)} - {"\t", "\n"}
C1 = {chr(c) for c in range(0x80, 0xA0)}
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
SEPARATORS = {"\u2028", "\u2029"}
SURROGATES = {chr(c) for c in range(0xD800, 0xE000)}
FORBIDDEN = C0 | C1 | BIDI | SEPARATORS | SURROGATES | {"\x7f"}
#: what may start an escape sequence: ESC and the 8-bit introducers
INTRODUCERS = {"\x1b", "\x90", "\x98", "\x9b", "\x9d", "\x9e", "\x9f"}

PROFILE = settings(max_examples=400, deadline=None, database=None)

#: characters likely to break a sanitizer: all of the forbidden ones, what follows ESC, and some ordinary text
_TRICKY = sorted(FORBIDDEN - SURROGATES) + list("[]P^_X\\()#%78c;0123456789m?@~ \t\nabcZ") + ["\ud800", "\udc9b"]
tricky_text = st.text(alphabet=st.sampled_from(_TRICKY), max_size=60) | st.text(max_size=60)
#: any character that is not forbidden (every script, emoji, joiners, U+FFFD, tab, newline)
allowed_char = st.characters(codec=None).filter(lambda c: c not in FORBIDDEN)
allowed_text = st.text(alphabet=allowed_char, max_size=40)

_ST = st.sampled_from(["\x07", "\x1b\\", "\x9c"])
_PAYLOAD = st.text(alphabet=st.characters(exclude_characters="\x07\x1b\x9c\n"), max_size=30)


@st.composite
def sequences(draw: st.DrawFn) -> str:
    """One complete escape sequence of any family, 7- or 8-bit."""
    family = draw(st.sampled_from(["csi", "string", "nf", "short"]))
    if family == "csi":
        intro = draw(st.sampled_from(["\x1b[", "\x9b"]))
        params = draw(st.text(alphabet=st.characters(min_codepoint=0x30, max_codepoint=0x3F), max_size=8))
        middle = draw(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x2F), max_size=2))
        return intro + params + middle + draw(st.characters(min_codepoint=0x40, max_codepoint=0x7E))
    if family == "string":  # OSC (titles, OSC 8 links, OSC 52 clipboard), DCS, SOS, PM, APC
        intro = draw(
            st.sampled_from(["\x1b]", "\x1bP", "\x1bX", "\x1b^", "\x1b_", "\x9d", "\x90", "\x98", "\x9e", "\x9f"])
        )
        return intro + draw(_PAYLOAD) + draw(_ST)
    if family == "nf":
        middle = draw(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x2F), min_size=1, max_size=2))
        return "\x1b" + middle + draw(st.characters(min_codepoint=0x30, max_codepoint=0x7E))
    final = draw(st.characters(min_codepoint=0x30, max_codepoint=0x7E, exclude_characters="[]PX^_"))
    return "\x1b" + final


@PROFILE
@given(tricky_text)
def test_no_forbidden_character_ever_comes_out(text: str) -> None:
    out = safe_text(text)
    assert not set(out) & FORBIDDEN, [hex(ord(c)) for c in set(out) & FORBIDDEN]
    assert is_safe(out)
    assert safe_text(out) == out  # idempotent
    assert len(out) <= len(text)


@PROFILE
@given(allowed_text)
def test_text_without_forbidden_characters_is_kept_exactly(text: str) -> None:
    assert is_safe(text)
    assert safe_text(text) == text  # every printable character, tab and newline, in order


@PROFILE
@given(st.lists(allowed_text | sequences(), max_size=12))
def test_sequences_go_whole_and_the_text_around_them_stays(parts: list[str]) -> None:
    text = "".join(parts)
    kept = "".join(p for p in parts if not p or p[0] not in INTRODUCERS)
    assert safe_text(text) == kept
    assert strip_sequences(text) == kept


_LONE = sorted(FORBIDDEN - INTRODUCERS - SEPARATORS - {"\r"})


@PROFILE
@given(st.lists(allowed_text | st.sampled_from(_LONE), max_size=12))
def test_a_lone_control_character_shows_as_one_replacement_character(parts: list[str]) -> None:
    expected = "".join(REPLACEMENT if p in FORBIDDEN else p for p in parts)
    assert safe_text("".join(parts)) == expected


@PROFILE
@given(allowed_text, allowed_text, st.sampled_from(["\r", "\r\n", "\u2028", "\u2029"]))
def test_a_carriage_return_cannot_overwrite_a_line(before: str, after: str, newline: str) -> None:
    assume(not (newline == "\r" and after.startswith("\n")))  # that is one CRLF, a single newline
    assert safe_text(before + newline + after) == before + "\n" + after


def test_a_lone_esc_or_an_unfinished_sequence_leaves_its_text_visible() -> None:
    assert safe_text("\x1b") == REPLACEMENT
    assert safe_text("\x1b]0;title without end") == REPLACEMENT + "]0;title without end"
    assert safe_text("\x1b[31") == REPLACEMENT + "[31"
    assert safe_text("\x9d8;;http://evil.example/\nclick") == REPLACEMENT + "8;;http://evil.example/\nclick"


@PROFILE
@given(tricky_text)
def test_a_line_stays_one_line(text: str) -> None:
    out = safe_line(text)
    assert "\n" not in out and "\t" not in out and is_safe(out)
    assert out == safe_text(text).replace("\n", " ").replace("\t", " ")


@PROFILE
@given(tricky_text)
def test_html_has_no_markup_and_no_forbidden_character(text: str) -> None:
    out = safe_html(text)
    assert not set(out) & (FORBIDDEN | set("<>\"'"))
    assert html.unescape(out) == safe_text(text)  # escaped, nothing lost


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=20,
)


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@PROFILE
@given(json_like)
def test_every_string_in_data_is_made_safe(value: object) -> None:
    out = safe_data(value)
    assert all(is_safe(s) for s in _strings(out))
    if all(is_safe(s) for s in _strings(value)):
        assert out == value


# -- issue 37: colour and style (SGR) kept, nothing else -----------------------------------------------------------

#: an SGR sequence written here from its definition: ESC [, parameters of digits, ';' and ':', then 'm'
SGR_SEQUENCE = re.compile(r"\x1b\[[0-9;:]*m")
_SGR_PARAMS = st.text(alphabet=st.sampled_from("0123456789;:"), max_size=12)
sgr = _SGR_PARAMS.map(lambda params: f"\x1b[{params}m")
#: what may come out with style=True: SGR sequences and the characters that are allowed anywhere
styled_parts = st.lists(allowed_text | sgr | sequences(), max_size=12)


@PROFILE
@given(tricky_text | styled_parts.map("".join))
def test_with_style_no_sequence_but_sgr_ever_comes_out(text: str) -> None:
    """The property of docs/SECURITY.md 7a: take the SGR sequences out of what comes out, and nothing forbidden
    is left; every ESC that comes out starts an SGR sequence."""
    out = safe_text(text, style=True)
    rest = SGR_SEQUENCE.sub("", out)
    assert not set(rest) & FORBIDDEN, [hex(ord(c)) for c in set(rest) & FORBIDDEN]
    assert out.count("\x1b") == len(SGR_SEQUENCE.findall(out))
    assert safe_text(out, style=True) == out  # idempotent
    assert len(out) <= len(text)
    assert safe_text(out) == safe_text(text)  # keeping style changes nothing else


@PROFILE
@given(styled_parts)
def test_sgr_sequences_are_kept_in_place_and_every_other_sequence_goes(parts: list[str]) -> None:
    kept = "".join(p for p in parts if SGR_SEQUENCE.fullmatch(p) or not any(c in INTRODUCERS for c in p))
    assert safe_text("".join(parts), style=True) == kept


@PROFILE
@given(tricky_text | styled_parts.map("".join))
def test_styled_html_is_escaped_text_in_spans_of_a_fixed_style(text: str) -> None:
    out = styled_html(text)
    spans = re.compile(
        r"<span style='(?:[a-z-]+:(?:#[0-9a-f]{6}|var\(--jp-[a-z0-9-]+, #[0-9a-f]{3}\)|[a-z]+|0\.7);?)+'>|</span>"
    )
    text_only = spans.sub("", out)
    assert "<" not in text_only and ">" not in text_only and "'" not in text_only
    assert html.unescape(text_only) == safe_text(text)  # the characters shown are exactly the safe text


def test_a_qr_code_drawn_in_inverse_video_shows() -> None:
    drawn = "\x1b[7m  \x1b[0m\x1b[49m  \x1b[0m\n"  # what the qrcode crate's qrencode prints per module
    assert safe_text(drawn, style=True) == drawn
    assert "background-color:var(--jp-content-font-color0" in styled_html(drawn)
