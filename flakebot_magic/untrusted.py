"""Text flakebot did not write, made safe to show: the one rule for terminals, logs, the widget and the dashboard.

Build and test output, crate metadata and READMEs, a tool's help, logs and
error text, and every message that quotes them reach a person through a
terminal, a log file, a notebook or a web page. Any of them may carry what a
terminal or a browser obeys instead of showing: escape sequences (a title
change, a cleared screen, an OSC 52 clipboard write, an OSC 8 link), control
characters (a backspace or carriage return that overwrites what was printed),
bidirectional overrides that reorder text (Trojan Source). :func:`safe_text`
takes all of that out and keeps the text:

* an escape sequence (ECMA-48: CSI, OSC, DCS, SOS, PM, APC, and the two- and
  three-character ``ESC`` forms; their 8-bit C1 introducers too) is removed
  whole: it is an instruction, not text;
* every other forbidden character becomes U+FFFD ``�``, so an attempt stays
  visible: C0 controls but tab and newline, DEL, C1 controls (U+0080 to
  U+009F), the bidirectional controls (U+202A to U+202E, U+2066 to U+2069,
  and the marks U+200E, U+200F, U+061C), and lone surrogates (which would
  leave Python as raw bytes, or a traceback);
* a carriage return (alone or before a newline) and the Unicode line and
  paragraph separators become a newline: what a ``\\r`` would overwrite is
  shown on a line of its own;
* everything else (all printable text of every script, emoji and their
  joiners, tab, newline) is kept as it is, in order.

With ``style=True`` one family is kept: SGR, "Select Graphic Rendition"
(``ESC [`` digits, ``;`` and ``:``, then ``m``: colours, bold, inverse), which
changes only how the text after it looks. A terminal and JupyterLab's text
output render it, so a tool that draws with it (a QR code in inverse video)
shows what it drew. Every other sequence still goes, and so does an 8-bit SGR
(``\\x9b...m``), which is a C1 control. :func:`styled_html` renders what was
kept as ``<span>`` s with inline styles from a fixed table, the text escaped.

Where it applies: at the places untrusted text enters (a process's output
lines as :class:`~flakebot_magic.events.LogLine` events, every event's text,
every :class:`~flakebot_magic.errors.FlakebotError` message, crate metadata
as a registry hands it over, a tool's help, descriptions and kept logs) and,
as the last step, at each door (printed progress, the command's answers, run
logs, the widget's and the dashboard's HTML via :func:`safe_html`, the REST
API via :func:`safe_data`). What a deployed tool *returns* to its caller is
data and stays byte for byte as the tool wrote it: only what flakebot itself
prints, shows or logs goes through here.

>>> safe_text("ok\\x1b]52;c;ZXZpbA==\\x07 \\x1b[2Jdone\\x07\\rover\\u202e")
'ok done�\\nover�'
"""

from __future__ import annotations

import bisect
import dataclasses
import html
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "NOT_MATH",
    "REPLACEMENT",
    "is_safe",
    "make_fields_safe",
    "not_math",
    "safe_data",
    "safe_html",
    "safe_line",
    "safe_text",
    "strip_sequences",
    "styled_html",
]

#: what a forbidden character outside an escape sequence becomes
REPLACEMENT = "\ufffd"

#: characters no output of :func:`safe_text` contains (a regular expression character class)
_FORBIDDEN = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f"  # C0 but tab and newline, DEL, C1
    "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidirectional marks, embeddings, overrides, isolates
    "\u2028\u2029"  # line and paragraph separators
    "\ud800-\udfff"  # lone surrogates (surrogateescape'd bytes)
)
#: an ECMA-48 control string (OSC, DCS, SOS, PM, APC), 7- or 8-bit, ended by ST or BEL, on one line:
#: an introducer, a body up to the first stopper, a terminator there. Found by :func:`_string_spans` in one pass
#: (as one regex, a line of unended introducers was scanned to its end once per introducer: issue 33)
_INTRODUCER = re.compile(r"\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]")
_STOPPER = re.compile(r"[\x07\x1b\x9c\n]")
#: a control sequence: CSI, parameters, intermediates, final byte
_CSI = r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]"
#: ESC with intermediates and a final (nF: character sets, ``ESC # 8``), or ESC and one final
#: (Fp, Fe, Fs: ``ESC c`` resets the terminal, ``ESC 7`` saves the cursor); not the introducers
#: of the two forms above, which are sequences only when complete
_ESC = r"\x1b[\x20-\x2f]+[\x30-\x7e]|\x1b[\x30-\x4f\x51-\x57\x59-\x5a\x5c\x60-\x7e]"
_SEQUENCE = re.compile(f"{_CSI}|{_ESC}")
#: the one sequence ``style=True`` keeps: SGR in its 7-bit form (how the text after it looks, nothing else)
_SGR = re.compile(r"\x1b\[[0-9;:]*m")
_UNSAFE = re.compile(f"{_CSI}|{_ESC}|\r\n?|[{_FORBIDDEN}]")
_ANY_UNSAFE = re.compile(f"[\r{_FORBIDDEN}]")
_NEWLINES = {"\r", "\r\n", "\u2028", "\u2029"}


def _string_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text``'s whole control strings are, left to right, in linear time.

    A string's body runs to the first stopper (BEL, ESC, ST, newline) after its introducer, and it is a
    string only when a terminator is there; no other sequence can hold an introducer, so these are exactly
    the strings a left-to-right scan for any sequence finds first.
    """
    stops = [m.start() for m in _STOPPER.finditer(text)]
    spans: list[tuple[int, int]] = []
    end = 0
    for intro in _INTRODUCER.finditer(text):
        if intro.start() < end:
            continue
        i = bisect.bisect_left(stops, intro.end())
        if i == len(stops):
            break  # no stopper after this one: none after any later one either
        stop = stops[i]
        ended = 2 if text.startswith("\x1b\\", stop) else 1 if text[stop] in "\x07\x9c" else 0
        if ended:
            spans.append((intro.start(), stop + ended))
            end = stop + ended
    return spans


def _without_strings(pattern: re.Pattern[str], replace: Any, text: str) -> str:
    """``pattern.sub(replace, ...)`` over ``text`` with its control strings (:func:`_string_spans`) removed."""
    spans = _string_spans(text)
    if not spans:
        return pattern.sub(replace, text)
    out: list[str] = []
    position = 0
    for start, end in spans:
        out.append(pattern.sub(replace, text[position:start]))
        position = end
    out.append(pattern.sub(replace, text[position:]))
    return "".join(out)


def _replace(match: re.Match[str]) -> str:
    found = match.group()
    if found in _NEWLINES:
        return "\n"
    if len(found) == 1:  # a forbidden character, a lone ESC among them
        return REPLACEMENT
    return ""  # a whole escape sequence


def _replace_keeping_style(match: re.Match[str]) -> str:
    found = match.group()
    return found if _SGR.fullmatch(found) else _replace(match)


def safe_text(text: str, *, style: bool = False) -> str:
    """``text`` with escape sequences removed and other control characters made visible; tab and newline kept.

    The module docstring has the rule; ``style=True`` keeps SGR sequences
    (colours, bold, inverse) and nothing else of the kind. Idempotent; never
    longer than ``text``.

    >>> safe_text("\\x1b[31mred\\x1b[0m\\tok\\r\\n")
    'red\\tok\\n'
    >>> safe_text("\\x1b[7m  \\x1b[0m\\x1b]0;title\\x07\\x1b[2J", style=True)
    '\\x1b[7m  \\x1b[0m'
    >>> safe_text("a\\bb \\u202eevil")
    'a�b �evil'
    """
    if _ANY_UNSAFE.search(text) is None:
        return text
    return _without_strings(_UNSAFE, _replace_keeping_style if style else _replace, text)


def safe_line(text: str) -> str:
    """:func:`safe_text` on one line: newlines and tabs become spaces (a cell of a table, a title).

    A crate description with a newline cannot fake a row of ``flakebot search``.

    >>> safe_line("fast\\n  99.00  trusted 1.0\\tbin")
    'fast   99.00  trusted 1.0 bin'
    """
    return safe_text(text).replace("\n", " ").replace("\t", " ")


def safe_html(text: str) -> str:
    """:func:`safe_text`, then HTML-escaped (quotes too): for an element's text or an attribute's value.

    >>> safe_html("<b onmouseover='x'>\\u202e")
    '&lt;b onmouseover=&#x27;x&#x27;&gt;�'
    """
    return html.escape(safe_text(text))


#: the class that keeps JupyterLab's MathJax out of an element: it typesets ``$...$`` in rendered HTML outputs and
#: in HTML widgets, so two dollar signs in a notice (``$HOME`` and ``$PATH``), a path or a crate's description
#: would read as a formula, its words run together in italics
NOT_MATH = "mathjax_ignore"


def not_math(markup: str) -> str:
    """``markup`` (already escaped) inside an element MathJax leaves alone: its text is shown as it is.

    MathJax looks at the classes of the elements under the node it typesets
    (an output, a widget's content), not above it: so the wrapper goes
    inside each HTML output and each HTML widget's value.

    >>> not_math("$HOME and $PATH")
    "<div class='mathjax_ignore'>$HOME and $PATH</div>"
    """
    return f"<div class='{NOT_MATH}'>{markup}</div>"


def safe_data(value: Any) -> Any:
    """JSON-like ``value`` with :func:`safe_text` applied to every string in it, keys included.

    >>> safe_data({"description": "x\\x1b]0;t\\x07", "n": [1, "\\u202e"]})
    {'description': 'x', 'n': [1, '�']}
    """
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, Mapping):
        return {safe_data(k): safe_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [safe_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(safe_data(v) for v in value)
    return value


def make_fields_safe(instance: Any, *, lines: Iterable[str] = (), styled: Iterable[str] = ()) -> None:
    """Apply :func:`safe_text` to every ``str`` field of a dataclass ``instance`` (frozen or not), in place.

    A tuple of strings is made safe item by item; the fields named in
    ``lines`` get :func:`safe_line`, those named in ``styled`` keep their SGR
    styling (``safe_text(..., style=True)``). Call it from ``__post_init__``:
    every instance is then safe from the moment it exists, whoever made it.
    """
    one_line, keep_style = set(lines), set(styled)
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        clean = safe_line if field.name in one_line else _styled if field.name in keep_style else safe_text
        if isinstance(value, str):
            made: Any = clean(value)
        elif isinstance(value, tuple) and all(isinstance(item, str) for item in value):
            made = tuple(clean(item) for item in value)
        else:
            continue
        if made != value:
            object.__setattr__(instance, field.name, made)


def _styled(text: str) -> str:
    return safe_text(text, style=True)


def strip_sequences(text: str) -> str:
    """``text`` without its escape sequences, and nothing else changed (a CLI tool's result without colours).

    This cleans data rather than making it safe to show (controls outside a
    sequence stay); :func:`safe_text` is for showing.

    >>> strip_sequences("\\x1b[38;5;242m00000000\\x1b[0m ok\\x9b1m")
    '00000000 ok'
    """
    return _without_strings(_SEQUENCE, "", text)


def is_safe(text: str) -> bool:
    """Whether ``text`` holds nothing :func:`safe_text` would change but tabs and newlines (and U+FFFD)."""
    return _ANY_UNSAFE.search(text) is None


#: SGR's basic colours (30-37 and 90-97; backgrounds 40-47, 100-107), as xterm draws them
_COLOURS = (
    "#000000", "#cd0000", "#00cd00", "#cdcd00", "#0000ee", "#cd00cd", "#00cdcd", "#e5e5e5",
    "#7f7f7f", "#ff0000", "#00ff00", "#ffff00", "#5c5cff", "#ff00ff", "#00ffff", "#ffffff",
)  # fmt: skip
#: the page's own colours, for an inverse with no colour given (JupyterLab's theme, light or dark)
_PAGE_TEXT, _PAGE_BACK = "var(--jp-content-font-color0, #000)", "var(--jp-layout-color0, #fff)"


def _colour_256(n: int) -> str:
    """xterm's 256-colour palette: 16 basic, a 6x6x6 cube, 24 greys."""
    if n < 16:
        return _COLOURS[n]
    if n < 232:
        n -= 16
        levels = [0 if v == 0 else 55 + 40 * v for v in (n // 36, n // 6 % 6, n % 6)]
        return "#{:02x}{:02x}{:02x}".format(*levels)
    grey = 8 + 10 * (n - 232)
    return f"#{grey:02x}{grey:02x}{grey:02x}"


def _extended(params: list[int], at: int) -> tuple[str | None, int]:
    """A ``38;5;N`` or ``38;2;R;G;B`` colour whose 38 (or 48) is ``params[at]``: the colour, and where to go on."""
    if at + 2 < len(params) and params[at + 1] == 5:
        return _colour_256(params[at + 2] % 256), at + 3
    if at + 4 < len(params) and params[at + 1] == 2:
        r, g, b = (min(v, 255) for v in params[at + 2 : at + 5])
        return f"#{r:02x}{g:02x}{b:02x}", at + 5
    return None, len(params)  # malformed: the rest of this sequence is ignored


_OFF = {22: (1, 2), 23: (3,), 24: (4,), 27: (7,)}


def _apply(state: dict[str, Any], code: str) -> None:
    """Apply one SGR sequence's parameters (``code``: what is between ``ESC [`` and ``m``) to ``state``."""
    params = [int(p) if p.isdigit() else 0 for p in re.split("[;:]", code)] if code else [0]
    at = 0
    while at < len(params):
        p = params[at]
        if p in (38, 48):
            colour, at = _extended(params, at)
            if colour is not None:
                state["fg" if p == 38 else "bg"] = colour
            continue
        at += 1
        if p == 0:
            state.clear()
        elif p in (1, 2, 3, 4, 7):
            state[str(p)] = True
        elif p in _OFF:
            for off in _OFF[p]:
                state.pop(str(off), None)
        elif 30 <= p <= 37 or 90 <= p <= 97:
            state["fg"] = _COLOURS[p - 30 if p < 90 else p - 82]
        elif 40 <= p <= 47 or 100 <= p <= 107:
            state["bg"] = _COLOURS[p - 40 if p < 100 else p - 92]
        elif p in (39, 49):
            state.pop("fg" if p == 39 else "bg", None)


def _style(state: dict[str, Any]) -> str:
    fg, bg = state.get("fg"), state.get("bg")
    if state.get("7"):  # inverse: the colours swap, the page's own where none was given
        fg, bg = bg or _PAGE_BACK, fg or _PAGE_TEXT
    parts = [f"color:{fg}" if fg else "", f"background-color:{bg}" if bg else ""]
    parts += ["font-weight:bold" if state.get("1") else "", "opacity:0.7" if state.get("2") else ""]
    parts += ["font-style:italic" if state.get("3") else "", "text-decoration:underline" if state.get("4") else ""]
    return ";".join(p for p in parts if p)


def _span(text: str, state: dict[str, Any]) -> str:
    if not text:
        return ""
    style = _style(state)
    return f"<span style='{style}'>{html.escape(text)}</span>" if style else html.escape(text)


def styled_html(text: str) -> str:
    """``text`` made safe to show, its SGR styling kept as ``<span style=...>`` s, every character escaped.

    The styles come from a fixed table (colours, bold, faint, italic,
    underline, inverse), never from the text: nothing the text says reaches
    the page but its characters, escaped, and how they look.

    >>> styled_html("a\\x1b[1;31mB<\\x1b[0mc\\x1b]8;;http://x\\x07")
    "a<span style='color:#cd0000;font-weight:bold'>B&lt;</span>c"
    """
    shown = safe_text(text, style=True)
    out: list[str] = []
    state: dict[str, Any] = {}
    at = 0
    for match in _SGR.finditer(shown):
        out.append(_span(shown[at : match.start()], state))
        _apply(state, match.group()[2:-1])
        at = match.end()
    out.append(_span(shown[at:], state))
    return "".join(out)
