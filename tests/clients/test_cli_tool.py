"""The CLI client: --help parsed into keyword arguments, a real signature and a docstring."""

from __future__ import annotations

import html
import inspect
import json
import keyword
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flakebot_magic.clients.agents import strict_problems
from flakebot_magic.clients.cli_tool import CALL_KEYWORDS, CliTool
from flakebot_magic.clients.cli_tool_help import parse_help
from flakebot_magic.config import DEBIAN_REGISTRY, Settings
from flakebot_magic.errors import ToolError
from flakebot_magic.pipeline import Pipeline

GETOPTS = """Usage: /store/bin/pulldown-cmark [options]

Reads markdown from standard input and emits HTML.

Options:
    -h, --help          this help message
    -d, --dry-run       dry run, produce no output
    -T, --enable-tables 
                        enable GitHub-style tables
    -o, --output FILE   write here
"""

CLAP3 = """hexyl 0.8.0
A command-line hex viewer

USAGE:
    hexyl [OPTIONS] [FILE]

OPTIONS:
    -n, --length <N>            Only read N bytes from the input. The N argument can also include a unit with a decimal
                                prefix (kB, MB, ..) or binary prefix (kiB, MiB, ..).
                                Examples: --length=64, --length=4KiB
        --color <WHEN>          When to use colors. The auto-mode only displays colors if the output goes to an
                                interactive terminal [default: always]  [possible values: always, auto, never]
    -v, --no-squeezing          Displays all input data.
    -h, --help                  Prints help information
    -V, --version               Prints version information

ARGS:
    <FILE>    The file to display. If no FILE argument is given, read from STDIN.
"""

CLAP2 = """tool 1.0
Counts things

USAGE:
    tool [FLAGS] [OPTIONS] <INPUT>...

FLAGS:
    -h, --help       Prints help information
    -q, --quiet      Less output
    -v               Verbose output (may be repeated)

OPTIONS:
    -f, --format <format>    Output format [possible values: json, text]

ARGS:
    <INPUT>...    Files to count
"""

CLAP4_LONG = """Transforms text

Usage: tx [OPTIONS] [FILE]... <COMMAND>

Commands:
  upper  Upper-case the text
  help   Print this message or the help of the given subcommand(s)

Arguments:
  [FILE]...
          Files to read

Options:
  -i, --include <PATTERN>...
          Lines to keep

          Several patterns are allowed.

      --color[=<WHEN>]
          Colorize [default: auto] [possible values: always, auto, never]

  -h, --help
          Print help (see a summary with '-h')
"""

GNU = """Usage: cat [OPTION]... [FILE]...
Concatenate FILE(s) to standard output.

  -A, --show-all           equivalent to -vET
      --input=FILE         read names from FILE
      --help     display this help and exit
"""


def test_getopts_layout() -> None:
    spec = parse_help(GETOPTS)
    assert spec.parsed and spec.description == "Reads markdown from standard input and emits HTML."
    assert [(o.name, o.flags, o.value) for o in spec.options] == [
        ("dry_run", ("-d", "--dry-run"), None),
        ("enable_tables", ("-T", "--enable-tables"), None),
        ("output", ("-o", "--output"), "FILE"),
    ]
    assert spec.options[1].help == "enable GitHub-style tables"
    assert spec.arguments == ()


def test_clap3_layout() -> None:
    spec = parse_help(CLAP3)
    assert spec.description == "A command-line hex viewer" and spec.usage == "hexyl [OPTIONS] [FILE]"
    length, color, squeeze = spec.options
    assert (length.name, length.value, length.flag) == ("length", "N", "--length")
    assert length.help.endswith("Examples: --length=64, --length=4KiB")
    assert (color.default, color.choices) == ("always", ("always", "auto", "never"))
    assert squeeze.name == "no_squeezing" and not squeeze.takes_value
    (file,) = spec.arguments
    assert (file.name, file.required, file.repeatable) == ("file", False, False)  # [FILE] in the usage line


def test_clap2_layout() -> None:
    spec = parse_help(CLAP2)
    assert [o.name for o in spec.options] == ["quiet", "v", "format"]
    assert spec.options[1].repeatable
    assert spec.options[2].choices == ("json", "text")
    (inputs,) = spec.arguments
    assert inputs.required and inputs.repeatable


def test_clap4_long_help() -> None:
    spec = parse_help(CLAP4_LONG)
    include, color = spec.options
    assert include.repeatable and include.help == "Lines to keep Several patterns are allowed."
    assert color.value_optional and color.choices == ("always", "auto", "never")
    assert spec.commands == ("upper",)
    assert [(a.name, a.repeatable, a.required) for a in spec.arguments] == [("file", True, False)]


def test_gnu_layout_and_reserved_names() -> None:
    spec = parse_help(GNU, CALL_KEYWORDS)
    assert [o.name for o in spec.options] == ["show_all", "input_"]  # `input=` is the call's own keyword
    assert spec.arguments[0].name == "file" and spec.arguments[0].repeatable


@pytest.mark.parametrize("text", ["", "just some words\nwithout any options"])
def test_unparseable_help(text: str) -> None:
    assert not parse_help(text).parsed


# -- the callable, over small scripts ---------------------------------------------------------


def _tool(tmp_path: Path, help_text: str, name: str = "tool", **fields: Any) -> CliTool:
    path = tmp_path / name
    # prints its arguments as JSON, or its help
    path.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"if sys.argv[1:] == ['--help']:\n    print({help_text!r})\n    sys.exit(0)\n"
        "data = sys.stdin.read()\nprint(json.dumps({'argv': sys.argv[1:], 'stdin': data}))\n"
    )
    path.chmod(0o755)
    # the interpreter of this stand-in is not in the sandbox the --help probe runs in: give its help
    fields.setdefault("_help", help_text.strip())
    return CliTool(
        name=name, binary=path, crate=name, version="1.0.0", source_hash="0" * 32, store_path=tmp_path, **fields
    )


def _run(tool: CliTool, *args: Any, **kwargs: Any) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(tool(*args, **kwargs))
    return result


def test_signature_and_docstring(tmp_path: Path) -> None:
    hexyl = _tool(tmp_path, CLAP3, "hexyl")
    signature = inspect.signature(hexyl)
    assert list(signature.parameters) == [
        "args",
        "input",
        "timeout",
        "env",
        "raw",
        "length",
        "color",
        "no_squeezing",
        "file",
    ]
    assert signature.parameters["no_squeezing"].default is False
    assert "Literal['always', 'auto', 'never']" in str(signature.parameters["color"].annotation)
    assert signature.return_annotation is str
    doc = hexyl.__doc__
    assert doc.startswith("hexyl: hexyl 1.0.0. A command-line hex viewer")
    assert "color : 'always' | 'auto' | 'never', optional" in doc
    assert "--color <WHEN>: When to use colors." in doc and "The tool's default: always." in doc
    assert "Raises\n------\nToolError" in doc
    assert CliTool.__doc__.startswith("A deployed command-line tool")  # the class keeps its own


def test_keyword_arguments_become_options(tmp_path: Path) -> None:
    hexyl = _tool(tmp_path, CLAP3, "hexyl")
    assert _run(hexyl, length=4, color="never", no_squeezing=True)["argv"] == [
        "--length",
        "4",
        "--color",
        "never",
        "--no-squeezing",
    ]
    assert _run(hexyl, no_squeezing=False, length=None)["argv"] == []
    assert _run(hexyl, file=Path("a.bin"), length=2)["argv"] == ["--length", "2", "a.bin"]
    assert _run(hexyl, file="-weird")["argv"] == ["--", "-weird"]
    assert _run(hexyl, length="-1")["argv"] == ["--length=-1"]
    # a first plain str still goes to standard input ("read from STDIN" in the help)
    assert _run(hexyl, "bytes", length=1) == {"argv": ["--length", "1"], "stdin": "bytes"}
    assert _run(hexyl, input=b"\x00raw", color="always")["stdin"] == "\x00raw"


def test_repeatable_and_optional_value_options(tmp_path: Path) -> None:
    tx = _tool(tmp_path, CLAP4_LONG, "tx")
    assert _run(tx, include=["a", "b"])["argv"] == ["--include", "a", "--include", "b"]
    assert _run(tx, color=True)["argv"] == ["--color"]
    assert _run(tx, color="never")["argv"] == ["--color=never"]
    assert _run(tx, "upper", file=["x", "y"])["argv"] == ["upper", "x", "y"]
    counter = _tool(tmp_path, CLAP2, "count")
    assert _run(counter, v=3)["argv"] == ["-v", "-v", "-v"]


def test_bad_keywords_and_values(tmp_path: Path) -> None:
    hexyl = _tool(tmp_path, CLAP3, "hexyl")
    with pytest.raises(
        TypeError,
        match=r"unexpected keyword argument 'lenght': did you mean length=4\? "
        "Its options are: color, file, length, no_squeezing",
    ):
        hexyl(lenght=4)
    with pytest.raises(TypeError, match=r"'bogus': plain command-line arguments go as strings: hexyl\(\"--bogus\""):
        hexyl(bogus=1)
    with pytest.raises(ValueError, match="color must be one of 'always', 'auto', 'never', not 'blue'"):
        hexyl(color="blue")


def test_plain_arguments_when_the_help_cannot_be_parsed(tmp_path: Path) -> None:
    odd = _tool(tmp_path, "odd tool, no options listed", "odd")
    assert not odd.spec.parsed
    assert list(inspect.signature(odd).parameters) == ["args", "input", "timeout", "env", "raw"]
    assert "could not parse this tool's --help" in odd.__doc__
    assert "could not parse" in odd.usage()
    assert _run(odd, "--x", "1")["argv"] == ["--x", "1"]
    with pytest.raises(TypeError, match="its --help could not be parsed"):
        odd(x=1)
    (function,) = odd.openai_tools()
    assert set(function["function"]["parameters"]["properties"]) == {"args"}
    assert "could not be parsed" in function["function"]["description"]


def test_for_agents(tmp_path: Path) -> None:
    hexyl = _tool(tmp_path, CLAP3, "hexyl")
    (tool,) = hexyl.openai_tools()
    function = tool["function"]
    assert function["name"] == "hexyl" and function["strict"] is True
    assert strict_problems(function["parameters"]) == []
    properties = function["parameters"]["properties"]
    assert properties["color"]["enum"] == ["always", "auto", "never", None]
    assert properties["no_squeezing"]["type"] == ["boolean", "null"]
    assert "input" in properties  # it reads standard input
    call = {
        "id": "x",
        "function": {
            "name": "hexyl",
            "arguments": json.dumps(
                {"length": "2", "color": None, "no_squeezing": True, "file": None, "input": "ab", "args": None}
            ),
        },
    }
    message = hexyl.call(call)
    assert message["tool_call_id"] == "x"
    assert json.loads(message["content"]) == {"argv": ["--length", "2", "--no-squeezing"], "stdin": "ab"}
    bridge = hexyl.mcp_config()["mcpServers"]["hexyl"]
    assert bridge["args"][-1] == str(hexyl.binary) and "--kind" in bridge["args"]
    usage = hexyl.usage()
    assert usage.startswith("### `hexyl`: hexyl 1.0.0 (command-line tool)")
    assert '\nhexyl("some input text")\n' in usage  # the plain call, no option for show (issue 12)


def test_a_timeout_stops_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = tmp_path / "spawner"
    script.write_text(f"#!/bin/sh\nsleep 30 &\necho $! > {pidfile}\nwait\n")
    script.chmod(0o755)
    # its help given: a --help that hangs as the call does is a probe with no answer, refused (issue 34)
    spawner = CliTool(
        name="spawner", binary=script, crate="s", version="1", source_hash="0", store_path=tmp_path, _help="Usage: x"
    )
    with pytest.raises(ToolError, match=r"time limit of 0\.5 s"):
        spawner(timeout=0.5)
    child = int(pidfile.read_text())
    # SIGKILL to the group is sent before ToolError is raised; the kernel takes a moment to end the
    # orphaned child on a busy machine, so allow it one second (a leak would live for 30 s)
    deadline = time.monotonic() + 1.0
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(child)


def _gone(pid: int) -> bool:
    """No such process, or only its zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# -- real tools from the offline registry ------------------------------------------------------------


@pytest.fixture(scope="module")
def debian(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    cache = os.environ.get("FLAKEBOT_CACHE_DIR")
    return Settings(
        cache_dir=Path(cache) if cache else tmp_path_factory.mktemp("cache"),
        registry=str(DEBIAN_REGISTRY),
        backend="cargo",
    )


offline = pytest.mark.skipif(not (DEBIAN_REGISTRY / "pulldown-cmark-0.9.2").is_dir(), reason="run `make install` first")


@pytest.mark.cargo
@offline
def test_pulldown_cmark_options_as_keywords(debian: Settings) -> None:
    md = Pipeline(debian).run("Render Markdown text to HTML.", name="md")
    assert "enable_tables" in inspect.signature(md).parameters
    assert md("# Hi") == "<h1>Hi</h1>\n"
    assert md("| a |\n|---|\n| 1 |", enable_tables=True).startswith("<table>")
    assert not md("| a |\n|---|\n| 1 |").startswith("<table>")
    assert md("~~x~~", enable_strikethrough=True) == "<p><del>x</del></p>\n"


@pytest.mark.cargo
@offline
def test_hexyl_options_as_keywords(debian: Settings) -> None:
    hexyl = Pipeline(debian).run("a hex viewer for binary data", name="hexyl")
    out = hexyl(input=b"\x00\x01\x02\x03\x04", length=4, color="never", border="none")
    assert out.split()[:5] == ["00000000", "00", "01", "02", "03"] and " 04" not in out
    assert "Literal['always', 'auto', 'never']" in str(inspect.signature(hexyl).parameters["color"].annotation)
    with pytest.raises(ValueError, match="border must be one of"):
        hexyl(input=b"", border="fancy")


def test_the_first_call_shown_is_the_plain_one_never_a_flag_for_show(tmp_path: Path) -> None:
    md = _tool(tmp_path, GETOPTS, "md")  # its first flag is --dry-run
    (function,) = md.functions().values()
    assert function.example == 'md("some input text")' == md.example()
    assert '>>> md("some input text")  # doctest: +SKIP' in md.__doc__
    assert "dry_run=True" not in md.__doc__ + md.usage() + md._repr_html_()
    assert _run(md, "some input text") == {"argv": [], "stdin": "some input text"}  # the call does what it shows
    hexyl = _tool(tmp_path, CLAP3, "hexyl")  # reads files or standard input: still no option
    assert hexyl.functions()["hexyl"].example == 'hexyl("some input text")'
    cat = _tool(tmp_path, GNU, "cat")  # reads its FILE arguments: the argument it needs, no option
    assert not cat.reads_stdin and cat.functions()["cat"].example == 'cat(file="file")'


def test_summaries_end_in_a_full_stop(tmp_path: Path) -> None:
    hexyl = _tool(tmp_path, CLAP3, "hexyl")
    assert hexyl.__doc__.startswith("hexyl: hexyl 1.0.0. A command-line hex viewer.\n")
    (function,) = hexyl.openai_tools()
    assert function["function"]["description"].startswith("A command-line hex viewer. Returns the tool's standard")
    md = _tool(tmp_path, GETOPTS, "md")  # a description with its own full stop gets no second one
    assert md.functions()["md"].description.startswith("Reads markdown from standard input and emits HTML. Returns")


def test_help_and_the_question_mark_read_well(tmp_path: Path) -> None:
    import pydoc

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.lib.pretty import pretty

    md = _tool(tmp_path, GETOPTS, "md")
    assert repr(md) == "<flakebot tool md: md 1.0.0 (cli, cargo)>"
    page = pydoc.render_doc(md, "Help on %s:", renderer=pydoc.plaintext)  # what help(md) prints
    lines = page.splitlines()
    # pydoc prints the object as its repr, cut at 100 characters, then its docstring
    assert lines[:4] == [
        "Help on CliTool in module flakebot_magic.clients.cli_tool:",
        "",
        "<flakebot tool md: md 1.0.0 (cli, cargo)>",
        "    md: md 1.0.0. Reads markdown from standard input and emits HTML.",
    ]
    assert "..." not in lines[2] and "Parameters" in page and "Examples" in page
    # IPython's `md` shows how to call it; `md?` its one-line form, signature and docstring
    assert pretty(md).splitlines()[0] == f"<flakebot tool md: md 1.0.0, cargo, {md.store_path}>"
    assert 'call:    md("some input text")' in pretty(md)
    shell = InteractiveShell()
    try:
        shell.push({"md": md})
        info = shell.object_inspect("md", detail_level=0)
        assert info["string_form"] == repr(md)
        assert info["docstring"].startswith("md: md 1.0.0. Reads markdown from standard input and emits HTML.")
        definition = info["definition"] or ""
        assert "    dry_run: bool = False," in definition and "ForwardRef" not in definition
    finally:
        shell.clear_instance()


# -- option names the call cannot take as they are ------------------------------------------

#: a long flag as help texts write them (what the parser takes for an option)
_FLAG = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,10}", fullmatch=True).filter(
    lambda f: f.lower() not in ("help", "version")
)
_NAMES = st.lists(
    _FLAG | st.sampled_from(sorted({*CALL_KEYWORDS, *keyword.kwlist, *keyword.softkwlist} - {"_"})),
    min_size=1,
    max_size=8,
    unique_by=str.lower,
)


@settings(max_examples=200, deadline=None, database=None)
@given(_NAMES, st.lists(st.booleans(), min_size=8, max_size=8))
def test_any_options_give_a_signature_whose_keywords_map_back_to_their_flags(
    flags: list[str], takes_value: list[bool]
) -> None:
    lines = [
        f"  --{flag}{' <VALUE>' if value else ''}    option {flag}"
        for flag, value in zip(flags, takes_value, strict=False)
    ]
    tool = CliTool(
        name="t", binary="/bin/true", crate="t", version="1", source_hash="0", store_path="/tmp",
        _help="Usage: t [OPTIONS]\n\nOptions:\n" + "\n".join(lines) + "\n  -h, --help    Print help\n",
    )  # fmt: skip
    signature = inspect.signature(tool)  # builds: no name twice, none invalid
    own = [p for p in signature.parameters if p not in CALL_KEYWORDS]
    assert [o.flag for o in tool.spec.options] == [f"--{flag}" for flag in flags]
    assert own == [o.name for o in tool.spec.options]
    for option, value in zip(tool.spec.options, takes_value, strict=False):
        assert option.name not in CALL_KEYWORDS and not keyword.iskeyword(option.name)
        expected = [option.flag, "x"] if value else [option.flag]
        assert tool.argv(**{option.name: "x" if value else True}) == expected  # the tool's own flag


def test_a_wrong_keyword_in_a_notebook_shows_the_callers_line_not_flakebots_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In IPython ``hexyl(lenght=4)`` shows the message, no traceback through the client's code."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell()
    shell.user_ns["hexyl"] = _tool(tmp_path, CLAP3, "hexyl")
    shell.run_cell("hexyl(lenght=4)")
    shown = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # IPython's colours
    assert shown.strip() == (
        "ToolArgumentError: hexyl() got an unexpected keyword argument 'lenght': did you mean length=4? "
        "Its options are: color, file, length, no_squeezing."
    )
    assert "cli.py" not in shown and "raise TypeError" not in shown, shown


# -- the tool card shows the call a person makes ----------------------------------------------

_WITH_RESERVED = """t 1.0
Usage: t [OPTIONS] [FILE]

Options:
  --raw          print raw bytes
  --env <NAME>   the environment to use
  -u, --upper    upper-case the output
  -h, --help     Print help
"""


@pytest.mark.parametrize("help_text", [CLAP3, _WITH_RESERVED], ids=["hexyl", "options named raw and env"])
def test_the_card_and_usage_show_the_user_facing_signature_the_internal_keywords_still_work(
    tmp_path: Path, help_text: str
) -> None:
    tool = _tool(tmp_path, help_text, "t")
    [fn] = tool.functions().values()
    shown = fn.signature_text()
    internal = set(fn.hidden)
    assert internal == {"env", "raw"}  # flakebot's plumbing: one call's environment, escapes kept
    parameters = inspect.signature(tool).parameters
    # every parameter of the call except the internal ones, in order, and no other
    expected = [
        f"*{name}" if p.kind is p.VAR_POSITIONAL else f"{name}={p.default!r}"
        for name, p in parameters.items()
        if name not in internal
    ]
    assert shown == f"t({', '.join(expected)})"
    assert "*args" in shown and "input=None" in shown and "timeout=None" in shown
    assert not internal & {part.split("=")[0] for part in shown[2:-1].split(", ")}
    for view in (tool._repr_html_(), tool.usage()):
        assert shown in html.unescape(view)
        assert not re.search(r"\b(env|raw)=", html.unescape(view))
    # the tool's own --raw and --env are its options (raw_, env_): shown, as any option is
    if help_text is _WITH_RESERVED:
        assert "raw_=False" in shown and "env_=None" in shown
        assert _run(tool, raw_=True, env_="prod")["argv"] == ["--raw", "--env", "prod"]
    # the internal keywords are still there to call with: an environment for one call, escapes left in
    assert internal <= set(parameters)
    assert _run(tool, input="ab", env={"FLAKEBOT_X": "1"}, raw=True) == {"argv": [], "stdin": "ab"}
