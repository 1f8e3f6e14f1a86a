"""Serve a deployed command-line tool or HTTP service over MCP (stdio), so MCP clients can use it too.

An ``mcp`` tool is already an MCP server; for the other kinds
``tool.mcp_config()`` names this bridge::

    python -m flakebot_magic.clients.bridge --name md --kind cli /path/to/bin/pulldown-cmark

It answers ``initialize``, ``ping``, ``tools/list`` (the tool's functions,
with their input schemas) and ``tools/call`` (through the same Python client
a notebook uses), one newline-delimited JSON-RPC message per line. The HTTP
service it wraps is started with it and stopped when the client closes stdin.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from .agents import result_text
from .base import ToolClient
from .contract import KINDS
from .factory import make_tool
from .mcp import PROTOCOL_VERSION, SUPPORTED_VERSIONS

__all__ = ["main", "serve"]


def _answer(tool: ToolClient, message: dict[str, Any]) -> dict[str, Any] | None:
    if "id" not in message:
        return None  # notifications need no answer
    ident = message["id"]
    method = message.get("method")
    params = message.get("params") or {}

    def ok(result: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": ident, "result": result}

    if method == "initialize":
        asked = params.get("protocolVersion")
        return ok(
            {
                "protocolVersion": asked if asked in SUPPORTED_VERSIONS else PROTOCOL_VERSION,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": f"flakebot-{tool.name}", "version": tool.version},
                "instructions": tool.usage(),
            }
        )
    if method == "ping":
        return ok({})
    if method == "tools/list":
        return ok(
            {
                "tools": [
                    {"name": fn.name, "description": fn.description, "inputSchema": fn.parameters}
                    for fn in tool.functions().values()
                ]
            }
        )
    if method == "tools/call":
        functions = tool.functions()
        fn = functions.get(str(params.get("name")))
        if fn is None:
            return {
                "jsonrpc": "2.0",
                "id": ident,
                "error": {"code": -32602, "message": f"Unknown tool: {params.get('name')}"},
            }
        try:
            value = tool._invoke(fn, dict(params.get("arguments") or {}))
        except Exception as exc:  # reported to the client as a tool error, which it shows its model
            return ok({"content": [{"type": "text", "text": f"{type(exc).__name__}: {exc}"}], "isError": True})
        result: dict[str, Any] = {"content": [{"type": "text", "text": result_text(value)}], "isError": False}
        if isinstance(value, dict):
            result["structuredContent"] = value
        return ok(result)
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"Method not found: {method}"}}


def serve(tool: ToolClient, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """Answer MCP requests from ``stdin`` on ``stdout`` until ``stdin`` closes."""
    for raw in iter(stdin.readline, b""):
        if not raw.strip():
            continue
        try:
            message = json.loads(raw)
        except ValueError as exc:
            answer: dict[str, Any] | None = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32700, "message": f"Parse error: {exc}"},
            }
        else:
            answer = _answer(tool, message) if isinstance(message, dict) else None
        if answer is not None:
            stdout.write(json.dumps(answer, ensure_ascii=False).encode() + b"\n")
            stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flakebot_magic.clients.bridge",
        description="Serve a flakebot tool (cli or http) over MCP on stdio.",
    )
    parser.add_argument("binary", type=Path, help="the deployed tool's executable")
    parser.add_argument("--name", required=True, help="the tool's name")
    parser.add_argument("--kind", choices=[k for k in KINDS if k != "mcp"], default="cli")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds allowed per call")
    parser.add_argument("--health", default="/health", help="http: the readiness path")
    parser.add_argument("--ready-timeout", type=float, default=10.0, help="http: seconds allowed to start")
    args = parser.parse_args(argv)
    tool = make_tool(
        args.name,
        args.binary,
        crate=args.name,
        version="",
        source_hash="",
        store_path=args.binary.parent.parent,
        contract={
            "kind": args.kind,
            "bin": args.binary.name,
            "health": args.health,
            "ready_timeout": args.ready_timeout,
        },
        timeout=args.timeout,
        start=False,
    )
    try:
        serve(tool, sys.stdin.buffer, sys.stdout.buffer)
    finally:
        tool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
