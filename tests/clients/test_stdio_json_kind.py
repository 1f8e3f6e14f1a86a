"""A second test-only kind, ``stdio-json`` (``tests/stdio_json_kind.py``), added by docs/ARCHITECTURE.md's recipe alone.

While the test's row is in :data:`~flakebot_magic.clients.kinds.KINDS`: the table knows it, the factory makes its
client from a fake store entry whose binary is a script, ``call(**arguments)`` returns the JSON the script wrote
(as the user, and confined), a model's tool call still reaches it through ``call(tool_call)``, and the structural
checks that iterate over every kind pass with it: no module decides by its name, its row says what a row must, it
has a hostile program. The confinement doors themselves (``tests/security/test_every_kind_confined.py``) build
their cases at import, so they see the row only when the session starts with it:
``pytest -p stdio_json_kind tests/security/test_every_kind_confined.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import test_kinds as structural
from kindtools import CHILD_PRELUDE, HOSTILE
from stdio_json_kind import HOSTILE_PROGRAM, StdioJsonTool, add_row, child_prelude

from flakebot_magic.clients import make_tool
from flakebot_magic.clients.base import ToolClient
from flakebot_magic.clients.contract import read_contract
from flakebot_magic.clients.kinds import KINDS, for_model, is_server, kind_of
from flakebot_magic.errors import ToolError
from flakebot_magic.sandbox import bubblewrap_works

#: the "binary" of the fake store entry: one JSON object in, one out
_ECHO = "#!/usr/bin/python3\nimport json, sys\nargs = json.load(sys.stdin)\nprint(json.dumps({'got': args}))\n"


@pytest.fixture
def stdio_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[ToolClient]]:
    """The test-only row in the table for this test only (and its hostile program, and its row in a child)."""
    rows = dict(KINDS)
    add_row(rows)
    for name, kind in rows.items():
        monkeypatch.setitem(KINDS, name, kind)
    monkeypatch.setitem(HOSTILE, StdioJsonTool.kind, HOSTILE_PROGRAM)
    monkeypatch.setitem(CHILD_PRELUDE, StdioJsonTool.kind, child_prelude())
    yield StdioJsonTool


def _tool(tmp_path: Path, script: str = _ECHO, **options: object) -> ToolClient:
    binary = tmp_path / "entry" / "bin" / "echo-json"
    binary.parent.mkdir(parents=True)
    binary.write_text(script)
    binary.chmod(0o755)
    return make_tool(
        "echo_json",
        binary,
        crate="echo-json",
        version="0.1.0",
        source_hash="0" * 32,
        store_path=binary.parent.parent,
        contract={"kind": "stdio-json", "bin": "echo-json"},
        **options,  # type: ignore[arg-type]
    )


def test_the_row_is_in_the_table_only_while_the_test_adds_it(stdio_kind: type[ToolClient]) -> None:
    assert "stdio-json" in KINDS and kind_of("stdio-json") is stdio_kind and not is_server("stdio-json")
    assert read_contract({"package": {"metadata": {"flakebot": {"kind": "stdio-json", "bin": "x"}}}}).kind == (
        "stdio-json"
    )
    assert stdio_kind.contract_text in for_model() and '"stdio-json"' in for_model()


def test_the_kind_is_not_shipped() -> None:
    assert "stdio-json" not in KINDS


def test_a_client_is_made_and_a_call_returns_the_json(stdio_kind: type[ToolClient], tmp_path: Path) -> None:
    tool = _tool(tmp_path, start=True)  # "start" starts nothing: it runs only when called
    assert type(tool) is stdio_kind and not tool.running
    assert tool.call(text="hi", n=2) == {"got": {"text": "hi", "n": 2}}  # type: ignore[attr-defined]
    assert tool.call() == {"got": {}}  # type: ignore[attr-defined]
    assert "echo_json.call(**arguments)" in tool.usage() and "(stdio JSON program)" in tool.usage()
    # a model's tool call goes through the same function, by the one rule of every door
    (openai,) = tool.openai_tools()
    message = tool.call({"id": "c1", "function": {"name": openai["function"]["name"], "arguments": '{"a": [1, 2]}'}})
    assert message == {"role": "tool", "tool_call_id": "c1", "content": '{"got": {"a": [1, 2]}}'}


def test_a_call_that_fails_says_so(stdio_kind: type[ToolClient], tmp_path: Path) -> None:
    tool = _tool(tmp_path, "#!/usr/bin/python3\nimport sys\nprint('not json')\n")
    with pytest.raises(ToolError, match="did not answer with one JSON value"):
        tool.call(a=1)  # type: ignore[attr-defined]


@pytest.mark.skipif(bool(bubblewrap_works()), reason="no bubblewrap")
def test_a_confined_call_returns_the_json_too(stdio_kind: type[ToolClient], tmp_path: Path) -> None:
    tool = _tool(tmp_path, confine=True)
    assert tool.confined_now
    assert tool.call(x="y") == {"got": {"x": "y"}}  # type: ignore[attr-defined]


def test_the_structural_checks_over_every_kind_pass_with_the_row(stdio_kind: type[ToolClient]) -> None:
    """tests/clients/test_kinds.py's and tests/security/test_every_kind_confined.py's, run with the row in the table.

    tests/test_architecture.py's ``test_every_kind_has_its_contract_documented`` cannot pass with a test-only row:
    it holds docs/tool-contract.md's sections equal to the table, and the shipped document has none for this kind.
    """
    confined = importlib.import_module("test_every_kind_confined") if _SECURITY in sys.path else _load_security()

    structural.test_no_module_decides_by_a_kinds_name()
    for name in KINDS:
        structural.test_each_row_is_a_client_class_that_says_how_its_kind_behaves(name)
    structural.test_the_first_row_is_the_default_kind_and_an_unknown_name_is_said_clearly()
    confined.test_every_kind_in_the_table_has_a_hostile_program()


_SECURITY = str(Path(__file__).resolve().parents[1] / "security")


def _load_security() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "test_every_kind_confined", f"{_SECURITY}/test_every_kind_confined.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
