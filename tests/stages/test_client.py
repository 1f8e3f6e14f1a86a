"""The client stage: a CliTool over a real deployed binary (tinyecho) and over small shell scripts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from hostile_text import typeset_as_math
from IPython.lib.pretty import pretty

from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.clients.cli_tool_help import reads_stdin
from flakebot_magic.errors import ToolError


@pytest.fixture
def echo(tinyecho_tool: CliTool) -> CliTool:
    """tinyecho, built by the real pipeline once per session: tests using it carry the cargo mark."""
    return tinyecho_tool


def _script(tmp_path: Path, name: str, body: str, **fields: object) -> CliTool:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    options: dict[str, object] = {"crate": name, "version": "1.0.0", "source_hash": "0" * 32, "store_path": tmp_path}
    options.update(fields)
    return CliTool(name=name, binary=path, **options)  # type: ignore[arg-type]


ARGS = 'if [ "$1" = --help ]; then echo "usage: args [WORDS]..."; exit 0; fi\nprintf "%s|" "$@"\n'


# -- calling -----------------------------------------------------------------------------


@pytest.mark.cargo
def test_stdout_is_returned(echo: CliTool) -> None:
    assert echo(input="hi there\n") == "HI THERE\n"


@pytest.mark.cargo
def test_input_text_and_bytes(echo: CliTool) -> None:
    assert echo(input="grüße") == "GRüßE"  # to_ascii_uppercase leaves the rest alone
    assert echo(input=b"raw\x00bytes") == "RAW\x00BYTES"
    assert echo(input="") == ""


@pytest.mark.cargo
def test_a_plain_str_goes_to_stdin_of_a_tool_that_reads_it(echo: CliTool) -> None:
    assert echo.reads_stdin
    assert echo("shout me") == "SHOUT ME"


@pytest.mark.cargo
def test_later_arguments_are_options(echo: CliTool) -> None:
    # the first plain str is the input; what follows goes on the command line
    assert echo("ignored", "-x") == "-x\n"


@pytest.mark.cargo
def test_a_path_goes_as_an_argument(echo: CliTool, tmp_path: Path) -> None:
    assert echo(Path("dir/file.txt")) == "dir/file.txt\n"
    assert echo(tmp_path) == f"{tmp_path}\n"


@pytest.mark.cargo
def test_numbers_and_options_go_as_arguments(echo: CliTool) -> None:
    assert echo(1, 2.5) == "1 2.5\n"
    assert echo("-n", "words") == "-n words\n"


@pytest.mark.cargo
def test_with_input_given_a_plain_str_is_an_argument(echo: CliTool) -> None:
    assert echo("words", input="not read") == "words\n"


def test_a_tool_that_does_not_read_stdin_gets_str_as_arguments(tmp_path: Path) -> None:
    args = _script(tmp_path, "args", ARGS)
    assert not args.reads_stdin
    assert args("plain") == "plain|"
    assert args("two words", Path("p")) == "two words|p|"


def test_env_is_added_to_the_environment(tmp_path: Path) -> None:
    greet = _script(tmp_path, "greet", 'echo "$GREETING $HOME"\n')
    assert greet(env={"GREETING": "hello"}) == f"hello {os.environ['HOME']}\n"


@pytest.mark.cargo
def test_non_zero_exit_is_a_tool_error(echo: CliTool) -> None:
    with pytest.raises(ToolError) as caught:
        echo("--fail")
    error = caught.value
    assert error.returncode == 3
    assert error.stderr == "tinyecho: failing as asked\n"
    assert str(error) == f"{echo.name} exited with status 3: tinyecho: failing as asked"


def test_non_zero_exit_without_stderr(tmp_path: Path) -> None:
    quiet = _script(tmp_path, "quiet", "exit 7\n")
    with pytest.raises(ToolError, match=r"quiet exited with status 7: \(no error output\)") as caught:
        quiet()
    assert (caught.value.returncode, caught.value.stderr) == (7, "")


@pytest.mark.cargo
def test_timeout_is_a_tool_error(echo: CliTool) -> None:
    started = time.monotonic()
    with pytest.raises(ToolError) as caught:
        echo("--sleep", timeout=0.3)
    assert time.monotonic() - started < 10
    assert caught.value.returncode is None
    assert "ran past its time limit of 0.3 s" in str(caught.value)
    assert "timeout=" in str(caught.value)  # says how to allow more


def test_the_default_timeout_applies(tmp_path: Path) -> None:
    # its help given: a --help that hangs as its calls do is a probe with no answer, refused (issue 34)
    slow = _script(tmp_path, "slow", "exec sleep 30\n", timeout=0.2, _help="usage: slow")
    with pytest.raises(ToolError, match=r"time limit of 0\.2 s"):
        slow()


def test_timeout_leaves_no_child_running(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # the tool starts a child of its own and waits for it
    spawner = _script(tmp_path, "spawner", f"sleep 30 &\necho $! > {pidfile}\nwait\n", _help="usage: spawner")
    with pytest.raises(ToolError):
        spawner(timeout=0.5)
    child = int(pidfile.read_text())
    try:
        deadline = time.monotonic() + 1
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- describing --------------------------------------------------------------------------


@pytest.mark.cargo
def test_help_is_the_binarys_help(echo: CliTool) -> None:
    assert echo.help.startswith("Usage: tinyecho [WORDS]...")
    assert "standard input" in echo.help


def test_help_of_a_tool_without_help(tmp_path: Path) -> None:
    mute = _script(tmp_path, "mute", "exit 1\n")
    assert mute.help == ""
    assert not mute.reads_stdin
    assert mute.example() == 'mute("some text")'  # no help: a plain argument (issue 37; issue 21 had mute())


@pytest.mark.cargo
def test_repr_shows_crate_version_store_path_and_an_example(echo: CliTool) -> None:
    # what IPython shows for `echo` (repr() itself is one line: pydoc's help() starts with it)
    text = pretty(echo)
    assert text.startswith(f"<flakebot tool {echo.name}: tinyecho 0.2.0, cargo, {echo.store_path}>")
    assert f'call:    {echo.name}("some input text")' in text
    assert str(echo.store_path) in text and str(echo.binary) in text
    assert echo.source_hash in text
    assert "Echo words, or shout standard input" in text  # the crate's description


@pytest.mark.cargo
def test_repr_html_shows_crate_version_store_path_and_an_example(echo: CliTool) -> None:
    page = echo._repr_html_()
    assert "<code>tinyecho 0.2.0</code>" in page
    assert f"<code>{echo.store_path}</code>" in page
    assert f"<code>{echo.source_hash}</code>" in page
    assert f"<code>{echo.name}(&quot;some input text&quot;)</code>" in page


def test_repr_html_escapes(tmp_path: Path) -> None:
    tool = _script(tmp_path, "args", ARGS, crate="<b>x</b>", provenance={"description": "<script>alert(1)</script>"})
    page = tool._repr_html_()
    assert "<script>" not in page and "<b>x</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "call:    args()" in pretty(tool)  # never --help passed as data (issue 37): args.help shows the help


def test_repr_of_a_tool_that_does_not_read_stdin(tmp_path: Path) -> None:
    text = pretty(_script(tmp_path, "args", ARGS))
    assert "call:    args()" in text and '"--help"' not in text
    assert "standard input" not in text


@pytest.mark.parametrize(
    ("help_text", "expected"),
    [
        ("Reads standard input when no FILE is given", True),
        ("-  read from stdin", True),
        ("Reads from the input and writes HTML", True),
        ("Usage: tool [OPTIONS] FILE", False),
        ("", False),
    ],
)
def test_reads_stdin(help_text: str, expected: bool) -> None:
    assert reads_stdin(help_text) is expected


def test_a_tool_that_echoes_its_arguments_has_no_help(tmp_path: Path) -> None:
    """``safe_name --help`` printing ``--help`` back is not a help text: no `--help` hint, no "— --help." doc."""
    parrot = _script(tmp_path, "parrot", 'echo "$@"\n')
    assert parrot.help == ""
    assert parrot.example() == 'parrot("some text")' and "--help" not in parrot._repr_html_().split("Call it:")[1][:60]
    assert not parrot.__doc__.splitlines()[0].endswith("--help.")
    assert parrot("a", "b") == "a b\n"  # it still runs as it is


def test_a_tool_whose_binary_is_gone_says_how_to_get_it_back(tmp_path: Path) -> None:
    """After ``%flakebot clean --all`` a loaded tool is one message, not subprocess's FileNotFoundError."""
    args = _script(tmp_path, "args", ARGS)
    assert args("x") == "x|"
    Path(args.binary).unlink()
    with pytest.raises(ToolError) as caught:
        args("x")
    message = str(caught.value)
    assert "is gone" in message and "%flakebot rebuild args" in message and "%flakebot load args" in message
    assert not isinstance(caught.value.__context__, FileNotFoundError)


def test_the_card_is_not_typeset_as_math(tmp_path: Path) -> None:
    tool = _script(tmp_path, "args", ARGS, provenance={"description": "costs $5 or $6"})
    page = tool._repr_html_()
    assert "costs $5 or $6" in page and typeset_as_math(page) == []
