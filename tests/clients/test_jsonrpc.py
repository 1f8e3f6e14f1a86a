"""One JSON-RPC dispatcher for both MCP servers: the bridge and ``flakebot mcp`` answer bad requests alike.

* every door: each bad line, sent to the bridge's stdio loop and to ``flakebot mcp``'s, gets the same error
  code and id from both (non-object params too: ``-32602``, where ``flakebot mcp`` used to read ``{}``);
  a notification and a response get no answer from either;
* read from the source: no module but ``clients/jsonrpc.py`` writes a JSON-RPC error code or parses a line.
"""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path
from typing import Any

import pytest
from test_bridge import exchange, shout  # noqa: F401  (the fixture)

from flakebot_magic.agent.stdio import serve_stdio
from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.config import Settings

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
JSONRPC = PACKAGE / "clients" / "jsonrpc.py"

BAD = [
    "{not json",
    "null",
    "42",
    '{"jsonrpc": "2.0", "id": 3}',
    '{"id": 4, "method": "ping"}',
    '{"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}',
    '{"jsonrpc": "2.0", "id": true, "method": "ping"}',
    '{"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": [1]}',
    '{"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": "x"}',
    '{"jsonrpc": "2.0", "id": 7, "method": "resources/list"}',
    '{"jsonrpc": "1.0", "id": 8, "method": "ping"}',
]
#: 2026-07-28 requests (the envelope in ``_meta``) that are refused: both servers answer with the same error
_VERSION = "io.modelcontextprotocol/protocolVersion"
_ENVELOPE = {_VERSION: "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
BAD_STATELESS = [
    ({"id": 20, "method": "server/discover", "params": {}}, -32602),
    ({"id": 21, "method": "server/discover", "params": {"_meta": {}}}, -32602),
    ({"id": 22, "method": "tools/list", "params": {"_meta": {**_ENVELOPE, _VERSION: "1999-01-01"}}}, -32022),
    ({"id": 23, "method": "tools/list", "params": {"_meta": {_VERSION: "2026-07-28"}}}, -32602),
    ({"id": 24, "method": "ping", "params": {"_meta": _ENVELOPE}}, -32601),
    ({"id": 25, "method": "resources/list", "params": {"_meta": _ENVELOPE}}, -32601),
    ({"id": 26, "method": "tools/call", "params": {"_meta": _ENVELOPE, "name": "ghost"}}, -32602),
]
SILENT = ['{"jsonrpc": "2.0", "method": "notifications/whatever"}', '{"jsonrpc": "2.0", "id": 9, "result": {}}']


def _agent(tmp_path: Path, *lines: str) -> list[Any]:
    out = io.BytesIO()
    settings = Settings(cache_dir=tmp_path / "cache")
    serve_stdio(settings, io.BytesIO("".join(line + "\n" for line in lines).encode()), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _shape(answer: Any) -> tuple[Any, Any]:
    return answer.get("id"), answer.get("error", {}).get("code")


@pytest.mark.parametrize("line", BAD)
def test_both_servers_answer_a_bad_request_alike(shout: CliTool, tmp_path: Path, line: str) -> None:  # noqa: F811
    (bridge,) = exchange(shout, line)
    (agent,) = _agent(tmp_path, line)
    assert _shape(bridge) == _shape(agent) and _shape(bridge)[1] is not None, (bridge, agent)
    assert "result" not in bridge and "result" not in agent


@pytest.mark.parametrize(("message", "code"), BAD_STATELESS)
def test_both_servers_refuse_a_bad_stateless_request_alike(
    shout: CliTool,  # noqa: F811
    tmp_path: Path,
    message: dict[str, Any],
    code: int,
) -> None:
    line = json.dumps({"jsonrpc": "2.0", **message})
    (bridge,) = exchange(shout, line)
    (agent,) = _agent(tmp_path, line)
    assert _shape(bridge) == _shape(agent) == (message["id"], code), (bridge, agent)
    assert bridge["error"].get("data") == agent["error"].get("data")  # -32022 names the same revisions


def test_both_servers_drop_a_line_over_the_cap_and_serve_the_next(shout: CliTool, tmp_path: Path) -> None:  # noqa: F811
    """A line past 4 MiB (the HTTP transport's cap too) is never held: one error with id null, then the next line."""
    from flakebot_magic.clients.jsonrpc import MAX_REQUEST_BYTES

    huge = '{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"pad": "' + "x" * MAX_REQUEST_BYTES + '"}}'
    ping = '{"jsonrpc": "2.0", "id": 2, "method": "ping"}'
    for answers in (exchange(shout, huge, ping), _agent(tmp_path, huge, ping)):
        assert [_shape(a) for a in answers] == [(None, -32600), (2, None)], answers
        assert answers[0]["error"]["data"] == {"maxBytes": MAX_REQUEST_BYTES}


def test_neither_answers_a_notification_or_a_response(shout: CliTool, tmp_path: Path) -> None:  # noqa: F811
    ping = '{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
    expected = [{"jsonrpc": "2.0", "id": 1, "result": {}}]
    assert exchange(shout, *SILENT, ping) == expected
    assert _agent(tmp_path, *SILENT, ping) == expected


def _own_protocol(path: Path) -> list[str]:
    """Where ``path`` writes a JSON-RPC error code (-32700 ... -32603) or decodes lines of a stream itself."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and node.operand.value in (32700, 32600, 32601, 32602, 32603)
        ):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} writes -{node.operand.value}")
        if isinstance(node, ast.Attribute) and node.attr == "readline" and path.parent.name in ("agent", "clients"):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} reads lines itself")
    return found


def test_only_the_dispatcher_speaks_json_rpc_errors() -> None:
    servers = [PACKAGE / "clients" / "bridge.py", *sorted((PACKAGE / "agent").glob("*.py"))]
    assert [hit for path in servers for hit in _own_protocol(path)] == []
    assert len(_own_protocol(JSONRPC)) >= 5  # the check sees the codes where they live
