"""JSON written by somebody else is read by one parser, which says "not JSON" to nesting without end.

cargo's messages (which a build script or a test can forge), a model's replies and
function arguments, an MCP server's and an HTTP service's answers, an agent's
requests, a registry's records: before this rule each was read by ``json.loads``,
whose ``RecursionError`` on ``[[[[...`` 100,000 deep is no ``ValueError``, so it
passed every handler and ended the build, the call or the server with a
traceback. The rule: no module parses JSON but through
:func:`flakebot_magic.host.fsutil.load_json` (read here from the package's
source), which turns too deep a document into a ``ValueError``; the real doors
are attacked in ``test_forged_cargo_json.py`` (cargo's output) and below (an MCP
server's answer).
"""

from __future__ import annotations

import ast
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stdio_servers import mcp_server

import flakebot_magic
from flakebot_magic.errors import ToolError
from flakebot_magic.host.fsutil import MAX_JSON_DEPTH, load_json

PACKAGE = Path(flakebot_magic.__file__).parent
#: the one parser, the test doubles (a test's own scripts), and the suite author's hidden tests (trusted code)
#: the parser itself, the test doubles, and the unit cache's rustc wrapper (a stdlib-only script run in the sandbox)
EXEMPT = ("host/fsutil.py", "testing/", "eval/suites/", "sandbox/unit_wrapper.py")


def _json_parses(source: str) -> Iterator[str]:
    """Each call in ``source`` that parses JSON by itself: ``json.load(s)``, ``loads`` imported from
    ``json``, a ``JSONDecoder``, an HTTP response's ``.json()``."""
    tree = ast.parse(source)
    from_json = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "json"
        for alias in node.names
        if alias.name in ("load", "loads", "JSONDecoder")
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and (
                (isinstance(func.value, ast.Name) and func.value.id == "json" and func.attr in ("load", "loads"))
                or func.attr in ("JSONDecoder", "raw_decode")
                or (func.attr == "json" and not node.args)
            )
        ) or (isinstance(func, ast.Name) and func.id in from_json):
            yield ast.unparse(node)


def _modules() -> list[str]:
    return sorted(
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if not str(p.relative_to(PACKAGE)).startswith(EXEMPT)
    )


def test_no_module_parses_json_but_through_load_json() -> None:
    found = {m: list(_json_parses((PACKAGE / m).read_text(encoding="utf-8"))) for m in _modules()}
    assert {m: calls for m, calls in found.items() if calls} == {}
    assert len(found) > 100  # the scan saw the package


@pytest.mark.parametrize(
    "source",
    [
        "import json\njson.loads(x)\n",
        "import json\njson.load(f)\n",
        "from json import loads\nloads(x)\n",
        "from json import loads as parse\nparse(x)\n",
        "import json\njson.JSONDecoder().decode(x)\n",
        "answer.json()\n",
    ],
)
def test_the_structural_check_sees_each_way_of_parsing(source: str) -> None:
    assert list(_json_parses(source))


def _nested(depth: int, leaf: Any = 0) -> str:
    return (
        "".join('{"k":[' if i % 2 else "[" for i in range(depth))
        + json.dumps(leaf)
        + "".join("]}" if i % 2 else "]" for i in reversed(range(depth)))
    )


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(0, 120_000), as_bytes=st.booleans())
def test_load_json_reads_any_nesting_or_says_it_is_not_json(depth: int, as_bytes: bool) -> None:
    text = _nested(depth)
    try:
        data = load_json(text.encode() if as_bytes else text)
    except ValueError:
        assert depth > MAX_JSON_DEPTH // 2  # (two levels per pair above)
        return
    assert data == json.loads(text)  # shallow: exactly what the standard parser reads
    assert depth <= MAX_JSON_DEPTH


@pytest.fixture
def deep_server(tmp_path: Path) -> Path:
    """An MCP server that answers initialize, then ``[[[[...`` 100,000 deep to every request, then exits."""
    return mcp_server(
        tmp_path / "server.py",
        """
        print('[' * 100000 + ']' * 100000, flush=True)
        deep = '[' * 100000 + ']' * 100000
        print('{"jsonrpc": "2.0", "id": %d, "result": %s}' % (m['id'], deep), flush=True)
        sys.exit(0)
        """,
    )


def test_an_mcp_servers_answer_nested_without_end_is_a_tool_error(deep_server: Path) -> None:
    from flakebot_magic.clients.lifecycle import LogBuffer
    from flakebot_magic.clients.mcp import McpSession

    session = McpSession([sys.executable, str(deep_server)], env=dict(os.environ), name="deep", logs=LogBuffer())
    try:
        with pytest.raises(ToolError):
            session.request("tools/list", timeout=30)
    finally:
        session.stop()
