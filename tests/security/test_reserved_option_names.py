"""A tool's ``--help`` naming options after the call's own keywords (``--raw``) or Python's (``--class``).

Issue 19: a tool whose help lists ``--raw`` broke ``inspect.signature`` (``raw``
is also flakebot's keyword), so the tool could not be called by keyword at
all. Every option now gets a distinct keyword of its own (``raw_``,
``class_``; docs/tool-contract.md), the signature builds, each keyword runs
the tool with its real flag, and flakebot's own keywords keep their meaning.
The class of names is covered as a property in tests/clients/test_cli_tool.py.
"""

from __future__ import annotations

import inspect
import keyword
from pathlib import Path

from flakebot_magic.clients.cli_tool import CALL_KEYWORDS, CliTool

#: every name the call takes or Python refuses as a parameter (a flag must start with a letter or digit)
NAMES = sorted({*CALL_KEYWORDS, *keyword.kwlist, *keyword.softkwlist} - {"_"})


def _tool(tmp_path: Path) -> CliTool:
    script = tmp_path / "argv"
    # prints each argument on a line, and marks its output with colour (raw=True keeps that)
    script.write_text("#!/bin/sh\nprintf '\\033[1m'\nprintf '%s\\n' \"$@\"\n")
    script.chmod(0o755)
    help_text = "Usage: argv [OPTIONS]\n\nOptions:\n" + "".join(f"      --{n} <V>    the {n} option\n" for n in NAMES)
    return CliTool(
        name="argv", binary=script, crate="argv", version="1", source_hash="0", store_path=tmp_path, _help=help_text
    )


def test_a_tool_with_raw_and_keyword_options_gets_a_signature_and_each_option_reaches_the_tool(tmp_path: Path) -> None:
    tool = _tool(tmp_path)
    signature = inspect.signature(tool)  # raised ValueError ("duplicate parameter name: 'raw'") before
    keywords = {option.flag.removeprefix("--"): option.name for option in tool.spec.options}
    assert sorted(keywords) == NAMES  # nothing lost: every option of the help is a keyword
    assert keywords["raw"] == "raw_" and keywords["class"] == "class_" and keywords["input"] == "input_"
    assert set(keywords.values()) <= set(signature.parameters) and len(set(keywords.values())) == len(NAMES)
    for flag, name in keywords.items():
        assert tool(**{name: "v"}) == f"--{flag}\nv\n"  # the tool gets its own flag, from a real call


def test_flakebots_own_keywords_keep_their_meaning_beside_the_tools(tmp_path: Path) -> None:
    tool = _tool(tmp_path)
    assert tool(raw_="r", timeout_="t") == "--raw\nr\n--timeout\nt\n"  # escape sequences stripped: raw is False
    assert tool(raw=True, raw_="r", timeout=30) == "\x1b[1m--raw\nr\n"  # raw=True is flakebot's: output as written
