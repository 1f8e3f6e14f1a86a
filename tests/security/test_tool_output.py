"""Attacks on the kernel's memory through a tool's output: every read of it is bounded.

A hostile tool floods what the kernel reads from it: 300 MB of standard
output from a CLI call, a 300 MB MCP "message" without a newline, an HTTP
answer past the cap (with and without a ``Content-Length``), a log line of
tens of megabytes. Each time the kernel keeps at most its cap, the call fails
with a clear ``ToolError`` (or the kept text says what was dropped), and the
tool works again afterwards.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.clients.contract import ToolContract
from flakebot_magic.clients.http import HttpTool
from flakebot_magic.clients.http_net import ResponseTooLarge
from flakebot_magic.clients.lifecycle import LOG_LINE_CHARS, LogBuffer, ToolProcess
from flakebot_magic.clients.mcp import MAX_MESSAGE_BYTES, McpTool
from flakebot_magic.errors import ToolError
from flakebot_magic.host.exchange import STDERR_BYTES
from flakebot_magic.host.process import allowed_env

MiB = 1024 * 1024


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _cli(tmp_path: Path, name: str, body: str) -> CliTool:
    binary = _script(tmp_path / "bin" / name, "#!/bin/sh\n" + body)
    return CliTool(name=name, binary=binary, crate=name, version="1", source_hash="0", store_path=tmp_path, _help="")


def test_a_cli_tool_printing_300_mb_is_stopped(tmp_path: Path) -> None:
    flood = _cli(tmp_path, "flood", "head -c 314572800 /dev/zero\necho done > " + str(tmp_path / "finished") + "\n")
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"more than 64 MiB to standard output and was stopped"):
        flood()
    assert time.monotonic() - started < 60
    assert not (tmp_path / "finished").exists()  # stopped, not drained to the end
    # the tool still works for an ordinary call
    assert _cli(tmp_path, "fine", "echo ok\n")() == "ok\n"


def test_a_cli_tools_stderr_is_kept_up_to_its_cap_with_a_note(tmp_path: Path) -> None:
    noisy = _cli(tmp_path, "noisy", "head -c 20000000 /dev/zero | tr '\\0' e >&2\necho result\nexit 2\n")
    with pytest.raises(ToolError) as caught:
        noisy()
    stderr = caught.value.stderr
    assert len(stderr) < STDERR_BYTES + 200
    assert "more bytes dropped (truncated at" in stderr
    assert len(str(caught.value)) < 4000


_MCP_FLOOD = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    method = message["method"]
    if method == "tools/call" and message["params"]["name"] == "flood":
        chunk = b"x" * (1 << 20)
        out = sys.stdout.buffer
        try:
            for _ in range(300):  # 300 MB, no newline
                out.write(chunk)
            out.flush()
        except BrokenPipeError:
            sys.exit(0)
        continue
    if method == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "f", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "flood", "inputSchema": {"type": "object", "properties": {}}},
                            {"name": "ok", "inputSchema": {"type": "object", "properties": {}}}]}
    else:
        result = {"content": [{"type": "text", "text": "fine"}]}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\\n")
    sys.stdout.flush()
"""


def _python_mcp(tmp_path: Path, binary: str, source: str, *, name: str = "") -> McpTool:
    """An MCP tool whose server, ``bin/BINARY`` under ``tmp_path``, is the Python ``source``."""
    return McpTool(
        name=name or binary,
        binary=_script(tmp_path / "bin" / binary, f"#!{sys.executable}\n{source}"),
        crate=binary,
        version="1",
        source_hash="0",
        store_path=tmp_path,
        contract=ToolContract(kind="mcp", bin=binary),
    )


@pytest.fixture
def mcp_flood(tmp_path: Path) -> Iterator[McpTool]:
    tool = _python_mcp(tmp_path, "flood", _MCP_FLOOD, name="mcpflood")
    yield tool
    tool.close()
    lifecycle.unregister(tool)


def test_an_mcp_message_of_300_mb_without_newline_is_not_held(mcp_flood: McpTool) -> None:
    mcp_flood.start()
    with pytest.raises(ToolError, match=r"longer than 32 MiB .* it was stopped"):
        mcp_flood.flood()
    assert len(mcp_flood.session._buffer) <= MAX_MESSAGE_BYTES + 1
    assert not mcp_flood.running
    assert mcp_flood.ok() == "fine"  # the next call starts it again


_HTTP_BIG = """
import hmac, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        expected = "Bearer " + os.environ["FLAKEBOT_TOKEN"]
        if self.path != "/health" and not hmac.compare_digest(self.headers.get("Authorization", ""), expected):
            self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers(); return
        size = 5 * 1024 * 1024
        if self.path == "/declared":
            self.send_response(200); self.send_header("Content-Length", str(size)); self.end_headers()
        elif self.path == "/undeclared":  # no length: the body ends when the connection does
            self.send_response(200); self.send_header("Connection", "close"); self.end_headers()
        elif self.path == "/gzip":  # a small compressed answer that would inflate past the cap
            import gzip
            body = gzip.compress(b"\\0" * size)
            self.send_response(200); self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body); return
        else:
            self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
            self.wfile.write(b"ok"); return
        try:
            for _ in range(5):
                self.wfile.write(b"y" * (1024 * 1024))
        except OSError:
            pass
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def http_big(tmp_path: Path) -> Iterator[HttpTool]:
    binary = _script(tmp_path / "bin" / "big", f"#!{sys.executable}\n{_HTTP_BIG}")
    tool = HttpTool(
        name="httpbig",
        binary=binary,
        crate="big",
        version="1",
        source_hash="0",
        store_path=tmp_path,
        contract=ToolContract(kind="http", bin="big"),
    )
    tool.max_response = 1 * MiB
    yield tool
    tool.close()
    lifecycle.unregister(tool)


@pytest.mark.parametrize("path", ["/declared", "/undeclared"])
def test_an_http_answer_past_the_cap_is_dropped(http_big: HttpTool, path: str) -> None:
    with pytest.raises(ResponseTooLarge, match=r"1 MiB"):
        http_big.get(path)
    assert http_big.get("/small").text == "ok"


def test_a_compressed_http_answer_is_not_inflated(http_big: HttpTool) -> None:
    answer = http_big.get("/gzip")
    assert len(answer.content) < 1 * MiB  # as sent: httpx did not inflate it
    assert "content-encoding" not in answer.headers


def test_a_log_line_of_50_mb_is_cut(tmp_path: Path) -> None:
    logs = LogBuffer()
    process = ToolProcess(
        ["sh", "-c", "head -c 50000000 /dev/zero | tr '\\0' z >&2; echo >&2; echo after >&2"],
        env=allowed_env(),
        logs=logs,
        stdio=False,
    )
    process.start()
    deadline = time.monotonic() + 60
    while "after" not in logs.text() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.stop()
    text = logs.text()
    assert "after" in text
    assert len(text) < 4 * LOG_LINE_CHARS + 1000
    assert "more bytes of this line dropped" in text


#: input schemas an MCP server may send in ``tools/list``: each is data of a shape the JSON Schema spec does not
#: allow (a minimum too large, or not a number; an ``anyOf`` that is a string; properties that are a list)
_ODD_SCHEMAS = [
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1e999}}, "required": ["n"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": "abc"}}, "required": ["n"]},
    {"type": "object", "properties": {"n": {"type": "number", "minimum": [1]}}, "required": ["n"]},
    {"type": "object", "properties": {"n": {"anyOf": "string"}}, "required": ["n"]},
    {"type": "object", "properties": {"n": {"anyOf": [5]}}, "required": ["n"]},
    {"type": "object", "properties": {"n": {"oneOf": {}}}, "required": ["n"]},
    {"type": "object", "properties": [1, 2], "required": "n"},
    {"type": "object", "properties": {"n": 5}, "required": ["n", 7, None]},
    {"type": ["integer", 5], "properties": {"n": {"type": {"x": 1}}}, "required": ["n"]},
]

_MCP_ODD = """
import json, sys
SCHEMAS = json.loads(sys.argv[1] if len(sys.argv) > 1 else {schemas!r})
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    if message["method"] == "initialize":
        result = {{"protocolVersion": "2025-06-18", "capabilities": {{"tools": {{}}}}, "serverInfo": {{"name": "o", "version": "1"}}}}
    elif message["method"] == "tools/list":
        result = {{"tools": [{{"name": f"odd{{i}}", "inputSchema": s}} for i, s in enumerate(SCHEMAS)]}}
    else:
        result = {{"content": [{{"type": "text", "text": "fine"}}]}}
    sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": message["id"], "result": result}}) + "\\n")
    sys.stdout.flush()
"""


def test_an_mcp_servers_odd_input_schemas_describe_its_tools_never_a_traceback(tmp_path: Path) -> None:
    """Before (red team 5), a ``minimum`` of ``1e999`` or ``"abc"`` in one tool's schema ended the client's
    start (the build's read of its tools, every load) with ``OverflowError``/``ValueError``."""
    import json

    source = _MCP_ODD.format(schemas=json.dumps(_ODD_SCHEMAS))
    tool = _python_mcp(tmp_path, "odd", source)
    try:
        tool.start()
        assert len(tool.functions()) == len(_ODD_SCHEMAS)
        assert "odd.odd0(" in tool.usage()
    finally:
        tool.close()
        lifecycle.unregister(tool)
