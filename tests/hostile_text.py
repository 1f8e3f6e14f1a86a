"""A hostile payload for every place untrusted text enters, and the check every door must pass.

:data:`PAYLOAD` holds every C0 control but tab and newline, DEL, every C1
control, one of each escape-sequence family (CSI: a clear screen, colours;
OSC: a title, an OSC 8 link, an OSC 52 clipboard write; DCS, SOS, PM, APC;
an nF character-set switch; ``ESC c``, the terminal reset; the 8-bit CSI and
OSC), a carriage return that would overwrite a line, backspaces, the
bidirectional overrides, embeddings, isolates and marks, and HTML markup.
:data:`RAW_8BIT` is the same 8-bit forms as bytes (what a program writes that
is not UTF-8).

:func:`marked` wraps the payload between a source's markers (``DESC-KEPT``):
a door that shows the text must show the markers (nothing was lost) and no
character of :data:`FORBIDDEN` (the attack failed). The forbidden set is
written here from its definition (docs/SECURITY.md, "Text shown to you"), not
imported from the sanitizer.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

__all__ = [
    "FORBIDDEN",
    "MARKUP",
    "PAYLOAD",
    "RAW_8BIT",
    "assert_shown_safely",
    "marked",
    "python_literal",
    "rust_bytes",
    "rust_string",
    "toml_string",
    "typeset_as_math",
]

C0 = "".join(chr(c) for c in range(0x20) if c not in (0x09, 0x0A))
C1 = "".join(chr(c) for c in range(0x80, 0xA0))
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
FORBIDDEN = frozenset(C0 + C1 + BIDI + "\x7f\u2028\u2029")

#: what an unescaped page would run: it must never appear as markup
MARKUP = ("<script>alert(1)</script>", "<img src=x onerror=alert(2)>")

SEQUENCES = (
    "\x1b[2J\x1b[H",  # CSI: clear the screen, cursor home
    "\x1b[31;1mred\x1b[0m",  # CSI: colours
    "\x1b]0;pwned title\x07",  # OSC 0: window title
    "\x1b]8;;http://evil.example/\x1b\\click me\x1b]8;;\x1b\\",  # OSC 8: a hyperlink
    "\x1b]52;c;ZXZpbCBjbGlwYm9hcmQ=\x07",  # OSC 52: write the clipboard
    "\x1bP1$r0m\x1b\\",  # DCS
    "\x1bXsos\x1b\\\x1b^pm\x1b\\\x1b_apc\x1b\\",  # SOS, PM, APC
    "\x1b(0",  # nF: switch to the line-drawing character set
    "\x1bc",  # RIS: reset the terminal
    "\x9b2J\x9d0;eight-bit title\x9c",  # 8-bit CSI and OSC
    "\x1b\u00e9",  # a lone ESC (before a letter it would be a sequence: ESC s saves the cursor)
)

PAYLOAD = (
    "".join(SEQUENCES)
    + "safe text\rEVIL OVERWRITE"
    + "abc\x08\x08\x08XYZ"
    + " \u202eevil\u202c \u2066isolated\u2069 "
    + C0
    + "\x7f"
    + C1
    + BIDI
    + "\u2028\u2029"
    + "".join(MARKUP)
)

RAW_8BIT = b"\x9b2J\x9d0;raw 8-bit title\x9c\x1b[2J"


def marked(source: str) -> str:
    """The payload between ``SOURCE-KEPT`` and ``SOURCE-END`` (one line: cargo and tests print it as one)."""
    return f"{source}-KEPT {PAYLOAD} {source}-END"


def assert_shown_safely(text: str, where: str, *, kept: tuple[str, ...] = (), html: bool = False) -> None:
    """``text`` (what a door showed) holds no forbidden character, each of ``kept``, and (``html``) no markup."""
    bad = sorted({f"U+{ord(c):04X}" for c in text if c in FORBIDDEN})
    assert not bad, f"{where}: forbidden characters reached the door: {bad}"
    for marker in kept:
        assert marker in text, f"{where}: {marker!r} is missing: the text around the payload was lost"
    if html:
        for markup in MARKUP:
            assert markup not in text, f"{where}: unescaped markup {markup!r}"


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (every character outside printable ASCII escaped)."""
    body = "".join(
        c if " " <= c <= "~" and c not in '"\\' else f"\\u{ord(c):04X}" if ord(c) < 0x10000 else f"\\U{ord(c):08X}"
        for c in text
    )
    return f'"{body}"'


def rust_string(text: str) -> str:
    """``text`` as a Rust string literal."""
    body = "".join(c if " " <= c <= "~" and c not in '"\\' else f"\\u{{{ord(c):x}}}" for c in text)
    return f'"{body}"'


def rust_bytes(data: bytes) -> str:
    """``data`` as a Rust byte-string literal."""
    return 'b"' + "".join(chr(b) if 0x20 <= b <= 0x7E and chr(b) not in '"\\' else f"\\x{b:02x}" for b in data) + '"'


def python_literal(text: str) -> str:
    """``text`` as Python source for a script (JSON escapes, read back with ``json.loads``)."""
    return f"json.loads({json.dumps(json.dumps(text))})"


class _Math(HTMLParser):
    """The texts with a ``$`` that JupyterLab's MathJax would typeset: not under an element of class
    ``mathjax_ignore`` (written here from MathJax's own default, not imported), nor in ``pre`` or ``code``."""

    SKIPPED = {"pre", "code", "script", "style", "textarea"}
    VOID = {"br", "img", "hr", "input", "wbr", "meta", "link"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[bool] = []  # per open element: does it (or an ancestor) keep MathJax out?
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        classes = (dict(attrs).get("class") or "").split()
        self.open.append(bool(self.open and self.open[-1]) or tag in self.SKIPPED or "mathjax_ignore" in classes)

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.VOID and self.open:
            self.open.pop()

    def handle_data(self, data: str) -> None:
        if "$" in data and not (self.open and self.open[-1]):
            self.found.append(data)


def typeset_as_math(page: str) -> list[str]:
    """The texts of the HTML ``page`` (an output, or a widget's value, as the node MathJax is given) that hold a
    ``$`` MathJax would read as a formula's delimiter ([] when none)."""
    parser = _Math()
    parser.feed(page)
    parser.close()
    return parser.found
