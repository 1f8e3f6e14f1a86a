"""What a command-line tool prints, as the terminal would show it: :class:`TerminalText` and :func:`tool_result`.

A tool's result is data: started with ``NO_COLOR=1`` and ``TERM=dumb``, its
output comes back without escape sequences. Some tools draw with colour and
style all the same: the ``qrcode`` crate's ``qrencode`` prints a QR code as
spaces in inverse video (SGR ``ESC [7m``), so its plain text is blank. Such a
result is a :class:`TerminalText`: a ``str`` whose value is the plain text (the
data, as before), and which shows what the tool drew wherever it is shown
(``print``, ``str()``, a notebook's display: JupyterLab renders SGR in text
output). What it keeps of the tool's output is
:func:`flakebot_magic.untrusted.safe_text` with ``style=True``: SGR only, never
another sequence.
"""

from __future__ import annotations

import re
from typing import Any

from ..untrusted import safe_text, strip_sequences

__all__ = ["TerminalText", "shown_help", "tool_result"]

_SGR = re.compile(r"\x1b\[[0-9;:]*m")


class TerminalText(str):
    """Text whose value is plain data, shown (``print``, ``str()``, IPython's display) as :attr:`styled`.

    ``styled`` is made safe to show, SGR styling kept (colours, inverse video).

    >>> t = TerminalText("  ", "\\x1b[7m  \\x1b[0m")
    >>> t == "  ", str(t) == "\\x1b[7m  \\x1b[0m"
    (True, True)
    """

    styled: str

    def __new__(cls, plain: str, styled: str) -> TerminalText:
        made = super().__new__(cls, plain)
        made.styled = safe_text(styled, style=True)
        return made

    def __str__(self) -> str:
        return self.styled

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.styled)  # a notebook renders the styling; a terminal draws it

    def __reduce__(self) -> tuple[Any, ...]:
        return (TerminalText, (str.__str__(self), self.styled))

    @property
    def plain(self) -> str:
        """The text as a plain ``str`` (the value)."""
        return str.__str__(self)


def tool_result(out: str) -> str:
    """A tool's standard output as its result: plain text, a :class:`TerminalText` when it drew with style.

    >>> tool_result("\\x1b[1mok\\x1b[0m\\x1b]0;title\\x07") == "ok", type(tool_result("plain")).__name__
    (True, 'str')
    """
    plain = strip_sequences(out)
    return TerminalText(plain, out) if _SGR.search(out) else plain


def shown_help(name: str, text: str) -> str:
    """A tool's help as :attr:`~.cli_tool.CliTool.help` gives it: the text, shown as text (not a quoted repr);
    when there is none, it shows why and what to do instead (``""`` is still its value)."""
    if text:
        return TerminalText(strip_sequences(text), text)
    return TerminalText(
        "",
        f"{name} printed no help for --help or -h (it took them as data, or prints nothing): it takes plain "
        f'arguments, e.g. {name}("some text"); {name}.usage() says how it is called.',
    )
