"""Issue 37: a tool that draws with colour and style shows what it drew; its card never passes --help as data.

The stand-in is what the ``qrcode`` crate's ``qrencode`` does (its src/bin/qrencode.rs): it takes its first
argument as the text to encode, ``--help`` included, and prints the code as spaces in inverse video (SGR),
whatever NO_COLOR says. It adds what no tool may pass: a title change, a clipboard write, a screen clear.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.clients.terminal_text import TerminalText

QRENCODE = r"""
import sys
text = sys.argv[1]
dark, light = "\x1b[7m  \x1b[0m", "\x1b[49m  \x1b[0m"
rows = ["".join(dark if (ord(c) + i) % 2 else light for c in text[:8]) for i in range(3)]
print("\x1b]0;owned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J" + "\n".join(rows))
"""


@pytest.fixture
def qr(tmp_path: Path) -> CliTool:
    path = tmp_path / "qrencode"
    path.write_text(f"#!{sys.executable}\n{QRENCODE}", encoding="utf-8")
    path.chmod(0o755)
    return CliTool(name="qr", binary=path, crate="qrcode", version="0.12.0", source_hash="0" * 32, store_path=tmp_path)


def test_a_drawing_shows_and_its_value_is_the_plain_text(qr: CliTool) -> None:
    out = qr("https://example.com")
    assert isinstance(out, TerminalText)
    assert "\x1b" not in out and out.strip() == ""  # the value is data: plain, as before
    shown = str(out)
    assert "\x1b[7m  \x1b[0m" in shown  # printed or displayed, the code is there
    assert "\x1b]" not in shown and "\x1b[2J" not in shown  # and nothing but the styling


def test_a_notebook_displays_the_drawing(qr: CliTool) -> None:
    from IPython.lib.pretty import pretty

    assert "\x1b[7m" in pretty(qr("abc"))  # text/plain with SGR: JupyterLab renders it


#: what qrencode does with --help, in sh (the --help probe runs in the sandbox, which sees /bin/sh and the store)
SH_QRENCODE = '#!/bin/sh\nprintf "\\033[7m  \\033[0m\\033[49m  \\033[0m\\n"\n'


def _sh_tool(tmp_path: Path, name: str, script: str) -> CliTool:
    path = tmp_path / name
    path.write_text(script, encoding="utf-8")
    path.chmod(0o755)
    return CliTool(name=name, binary=path, crate=name, version="1", source_hash="0" * 32, store_path=tmp_path)


def test_a_tool_that_takes_help_as_data_has_no_help_and_says_so(tmp_path: Path) -> None:
    qr = _sh_tool(tmp_path, "qr", SH_QRENCODE)
    assert qr.help == ""  # --help drew a QR code of "--help": no words, no help
    assert "printed no help" in str(qr.help) and 'qr("some text")' in str(qr.help)
    assert "--help" not in qr.example()


def test_the_card_never_suggests_passing_help_as_data(qr: CliTool) -> None:
    shown = [qr.example(), qr.usage(), qr.summary(), qr._repr_html_()]
    assert not any('"--help"' in text or "&quot;--help&quot;" in text for text in shown), shown
    assert qr.example() == 'qr("some text")'  # what a tool deployed as published takes: text (qr() would panic)


def test_a_tool_with_help_shows_it_as_text(tmp_path: Path) -> None:
    from IPython.lib.pretty import pretty

    tool = _sh_tool(tmp_path, "hello", '#!/bin/sh\necho "Usage: hello [OPTIONS]"\necho\necho "Says hello."\n')
    assert tool.help.startswith("Usage: hello") and "--help" not in tool.example()
    assert pretty(tool.help).startswith("Usage: hello [OPTIONS]\n")  # shown as text, not a quoted repr
