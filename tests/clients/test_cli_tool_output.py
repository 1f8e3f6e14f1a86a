"""A CLI tool's result is data: plain text (no ANSI escapes), bytes to standard input, text to a file-only tool."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.clients.cli_tool import PLAIN_ENV, CliTool, strip_ansi
from flakebot_magic.errors import ToolError

STDIN_HELP = """Usage: colour [OPTIONS] [FILE]

Reads FILE, or standard input when no FILE is given.
"""
FILE_HELP = """Usage: mdfile [OPTIONS] <FILE>

Arguments:
  <FILE>  the markdown file to render

Options:
  -h, --help  Print help
"""
TWO_FILES_HELP = """Usage: cmp2 <LEFT> <RIGHT>

Arguments:
  <LEFT>   first file
  <RIGHT>  second file
"""

#: a stand-in tool: colours its report unless NO_COLOR is set (the way many tools do), reports what it got
COLOUR_TOOL = """
import json, os, sys
if sys.argv[1:] == ['--help']:
    print(HELP); sys.exit(0)
data = sys.stdin.buffer.read()
files = {a: open(a, encoding='utf-8').read() for a in sys.argv[1:] if os.path.isfile(a)}
missing = [a for a in sys.argv[1:] if not a.startswith('-') and not os.path.isfile(a)]
if missing and not FILE_OK_WITHOUT_STDIN:
    sys.stderr.write("\\x1b[31mthread 'main' panicked: No such file or directory (os error 2)\\x1b[0m\\n"); sys.exit(101)
report = json.dumps({'stdin': data.hex(), 'files': list(files.values()), 'paths': list(files), 'env': {k: os.environ.get(k) for k in ('NO_COLOR', 'CLICOLOR', 'TERM')}})
# one escape even a NO_COLOR tool lets through (a cursor move), to be stripped
prefix = '' if os.environ.get('NO_COLOR') else '\\x1b[38;5;242m'
print(prefix + report + '\\x1b[0m\\x1b]0;title\\x07')
"""


def _tool(tmp_path: Path, help_text: str, name: str, *, file_ok: bool = False, **fields: Any) -> CliTool:
    path = tmp_path / name
    path.write_text(
        f"#!{sys.executable}\nHELP = {help_text!r}\nFILE_OK_WITHOUT_STDIN = {file_ok!r}\n" + COLOUR_TOOL,
        encoding="utf-8",
    )
    path.chmod(0o755)
    fields.setdefault("_help", help_text.strip())
    return CliTool(
        name=name, binary=path, crate=name, version="1.0.0", source_hash="0" * 32, store_path=tmp_path, **fields
    )


def _report(out: str) -> dict[str, Any]:
    assert "\x1b" not in out, repr(out)
    result: dict[str, Any] = json.loads(out)
    return result


def test_strip_ansi_removes_colour_cursor_and_title_sequences() -> None:
    text = "\x1b[38;5;242m00000000\x1b[0m \x1b[1;32mok\x1b[m\x1b[2K\x1b]0;title\x07\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\x1bM"
    assert strip_ansi(text) == "00000000 oklink"
    assert strip_ansi("plain\ttext\n") == "plain\ttext\n"


def test_a_tool_starts_asking_for_plain_text_and_escapes_are_stripped(tmp_path: Path) -> None:
    colour = _tool(tmp_path, STDIN_HELP, "colour")
    report = _report(colour("hi"))
    assert report["env"] == PLAIN_ENV
    assert bytes.fromhex(report["stdin"]) == b"hi"


def test_raw_keeps_the_escapes_and_does_not_ask_for_plain_text(tmp_path: Path) -> None:
    colour = _tool(tmp_path, STDIN_HELP, "colour")
    out = colour("hi", raw=True)
    assert out.startswith("\x1b[38;5;242m{") and "\x1b]0;title\x07" in out
    assert json.loads(strip_ansi(out))["env"]["NO_COLOR"] is None


def test_a_calls_env_overrides_the_plain_defaults(tmp_path: Path) -> None:
    colour = _tool(tmp_path, STDIN_HELP, "colour")
    assert _report(colour("hi", env={"TERM": "xterm-256color"}))["env"]["TERM"] == "xterm-256color"


def test_positional_bytes_are_the_input_of_a_tool_that_reads_stdin(tmp_path: Path) -> None:
    colour = _tool(tmp_path, STDIN_HELP, "colour")
    assert bytes.fromhex(_report(colour(b"\x00\xffdata"))["stdin"]) == b"\x00\xffdata"


def test_positional_bytes_for_a_tool_not_known_to_read_stdin_say_to_use_input(tmp_path: Path) -> None:
    mdfile = _tool(tmp_path, FILE_HELP, "mdfile")
    with pytest.raises(TypeError, match=r"input=b'\.\.\.'"):
        mdfile(b"data")
    colour = _tool(tmp_path, STDIN_HELP, "colour")
    with pytest.raises(TypeError, match="input="):
        colour("--flag", b"late bytes")


def test_text_for_a_tool_that_reads_one_file_goes_through_a_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # this test's own temporary directory: /tmp is shared with every other run on the machine
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    mdfile = _tool(tmp_path, FILE_HELP, "mdfile")
    assert not mdfile.reads_stdin
    report = _report(mdfile("# Hi\n\nsome *text*"))
    assert report["files"] == ["# Hi\n\nsome *text*"] and report["stdin"] == ""
    assert report["paths"][0].startswith(str(scratch)), report  # it went through this test's directory
    assert list(scratch.iterdir()) == []  # removed after the call
    real = tmp_path / "doc.md"
    real.write_text("from a file", encoding="utf-8")
    assert _report(mdfile(str(real)))["files"] == ["from a file"]  # a path stays a path


def test_text_where_a_file_is_wanted_fails_with_what_to_do_not_a_bare_panic(tmp_path: Path) -> None:
    cmp2 = _tool(tmp_path, TWO_FILES_HELP, "cmp2")  # two file arguments: no guessing which the text is
    with pytest.raises(ToolError) as caught:
        cmp2("# some text", "more text")
    message = str(caught.value)
    assert "reads files, not text" in message and "'# some text' is not a file" in message
    assert "pathlib.Path" in message and "\x1b" not in message
