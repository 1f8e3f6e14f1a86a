"""Serve a deployed tool of any kind that does not speak MCP itself over MCP (stdio), so MCP clients can use it too.

An ``mcp`` tool is already an MCP server; for the other kinds (those the
table marks ``bridged``) ``tool.mcp_config()`` names this bridge::

    python -m flakebot_magic.clients.bridge --name md --kind cli /path/to/bin/pulldown-cmark

It speaks both MCP eras (``revisions.py``): ``initialize`` and ``ping`` of
2025-11-25 and older, and the stateless 2026-07-28 (``server/discover``, the
envelope on each request, ``resultType``, cache hints; its tool list never
changes, so ``subscriptions/listen`` is ``-32601``); in both, ``tools/list``
(the tool's functions, with their input schemas) and ``tools/call`` (through
the same Python client a notebook uses), one newline-delimited JSON-RPC
message per line (at most 4 MiB). The HTTP
service it wraps is started with it and stopped when the client closes stdin.

What is not a request it can serve is answered as :mod:`.jsonrpc` says (the
same answers as ``flakebot mcp``; a batch gets ``-32600``: MCP has none since
2025-06-18); ``arguments`` that are not an object, and an unknown tool, get
``-32602``. A tool that fails answers a result with ``isError`` (the model
reads it). ``serverInfo`` carries the crate and its version (from the store
entry's manifest), ``instructions`` say in plain words what the tool is, and
each input schema says what is enforced (``additionalProperties: false``:
extra keys are refused). ``null`` for an optional argument means "not given"
(docs/tool-contract.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from ..errors import StorageError
from ..host.fsutil import load_json
from ..host.storage import read_cache_json
from ..host.writes import PeerStream
from .agents import ToolFunction, result_text
from .base import TOOL_TIMEOUT, ToolClient
from .factory import make_tool
from .jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Request,
    check,
    error,
    response,
    serve_lines,
    tool_result,
)
from .kinds import KINDS
from .revisions import (
    REMOVED_METHODS,
    SERVED_VERSIONS,
    Refusal,
    modern_result,
    negotiate,
    read_envelope,
    stateless,
)
from .schema import sentence

__all__ = ["instructions", "main", "serve", "server_info"]


#: the cache hints' freshness for what the bridge lists: its tools do not change while it runs
TTL_MS = 3_600_000


def server_info(tool: ToolClient) -> dict[str, Any]:
    """``serverInfo``: the crate and its version (never empty), and a title naming the tool."""
    return {
        "name": tool.crate or tool.name,
        "version": tool.version or "unknown",
        "title": f"{tool.name} ({tool.crate} {tool.version or 'unknown'}, served by flakebot)",
    }


def instructions(tool: ToolClient) -> str:
    """What the server offers, in words any client can use (no Python)."""
    what = tool.a_noun
    lines = [f"{tool.crate} {tool.version}: {sentence(tool.description) or '(no description)'}".strip()]
    lines.append(
        f"This server runs {what} built from the Rust crate {tool.crate}; each tool below calls it once. "
        "Arguments are checked against the input schema before it runs; a failure is a result with isError."
    )
    for fn in tool.functions().values():
        lines.append(f"- {fn.public_name}: {sentence(_first_line(fn.description)) or '(no description)'}")
    return "\n".join(lines)


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def _by_public_name(tool: ToolClient) -> dict[str, ToolFunction]:
    return {fn.public_name: fn for fn in tool.functions().values()}


def _tools(tool: ToolClient) -> list[dict[str, Any]]:
    return [
        {"name": name, "description": sentence(fn.description), "inputSchema": fn.enforced_schema}
        for name, fn in _by_public_name(tool).items()
    ]


def _call(tool: ToolClient, ident: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``tools/call``: its result, a tool error (``isError``), or the JSON-RPC error for what it names or passes."""
    fn = _by_public_name(tool).get(str(params.get("name")))
    if fn is None:
        return error(ident, INVALID_PARAMS, f"Unknown tool: {params.get('name')}")
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return error(ident, INVALID_PARAMS, f"Invalid params: arguments must be an object, not {json.dumps(arguments)}")
    try:
        value = tool._invoke(fn, arguments)
    except Exception as exc:  # reported to the client as a tool error, which it shows its model
        return response(ident, tool_result(f"{type(exc).__name__}: {exc}", is_error=True))
    return response(ident, tool_result(result_text(value), value if isinstance(value, dict) else None))


def _stateless(tool: ToolClient, request: Request) -> dict[str, Any]:
    """A 2026-07-28 request: its envelope checked, each result with ``resultType`` and the server's identity."""
    ident, method, params = request.ident, request.method, request.params
    envelope = read_envelope(method, params)
    if isinstance(envelope, Refusal):
        return error(ident, envelope.code, envelope.message, envelope.data)
    info = server_info(tool)
    if method == "server/discover":
        found = {
            "supportedVersions": list(SERVED_VERSIONS),
            "capabilities": {"tools": {"listChanged": False}},
            "instructions": instructions(tool),
        }
        return response(ident, modern_result(found, info, ttl_ms=TTL_MS))
    if method == "tools/list":
        return response(ident, modern_result({"tools": _tools(tool)}, info, ttl_ms=TTL_MS))
    if method == "tools/call":
        answer = _call(tool, ident, params)
        return {**answer, "result": modern_result(answer["result"], info)} if "result" in answer else answer
    why = " (the revision 2026-07-28 removed it)" if method in REMOVED_METHODS else ""
    if method == "subscriptions/listen":
        why = " (this server's tool list never changes: it has nothing to send on one)"
    return error(ident, METHOD_NOT_FOUND, f"Method not found: {method}{why}")


def _answer(tool: ToolClient, message: Any) -> dict[str, Any] | None:
    """The answer to one decoded message (None for a notification or a response)."""
    request = check(message)
    if not isinstance(request, Request):
        return request  # the error to answer, or None
    if request.notification:
        return None  # notifications need no answer
    ident, method, params = request.ident, request.method, request.params
    if stateless(method, params):
        return _stateless(tool, request)
    if method == "initialize":
        return response(
            ident,
            {
                "protocolVersion": negotiate(params.get("protocolVersion")),
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": server_info(tool),
                "instructions": instructions(tool),
            },
        )
    if method == "ping":
        return response(ident, {})
    if method == "tools/list":
        return response(ident, {"tools": _tools(tool)})
    if method == "tools/call":
        return _call(tool, ident, params)
    return error(ident, METHOD_NOT_FOUND, f"Method not found: {method}")


def serve(tool: ToolClient, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """Answer MCP requests from ``stdin`` on ``stdout`` until ``stdin`` closes."""

    out = PeerStream(stdout)  # a client that stops reading for PEER_SECONDS is gone: the bridge ends

    def send(answer: dict[str, Any]) -> None:
        out.write(json.dumps(answer, ensure_ascii=False).encode() + b"\n")

    def handle(message: Any) -> None:
        answer = _answer(tool, message)
        if answer is not None:
            send(answer)

    serve_lines(stdin, send, handle)


def _manifest(binary: Path) -> dict[str, Any]:
    """The store entry's manifest beside ``binary`` (``<entry>/bin/<name>``), or {}."""
    try:
        data = read_cache_json(binary.parent.parent / "manifest.json")
    except (OSError, StorageError):
        return {}
    return data if isinstance(data, dict) else {}


def _contract(args: argparse.Namespace) -> dict[str, Any]:
    """The contract the command line gives: ``--contract`` JSON, else the separate flags (older configs)."""
    given = {"kind": args.kind, "bin": args.binary.name, "health": args.health, "ready_timeout": args.ready_timeout}
    try:
        data = load_json(args.contract) if args.contract else {}
    except ValueError:
        raise SystemExit(
            "bridge: --contract is not JSON (it is the tool contract's JSON, as mcp_config() writes it)"
        ) from None
    if isinstance(data, dict):
        given.update({k: v for k, v in data.items() if k in given and v is not None})
    kind = KINDS.get(str(given["kind"]))
    if kind is None or not kind.bridged:
        served = ", ".join(name for name, each in KINDS.items() if each.bridged)
        raise SystemExit(
            f"bridge: it serves a tool of kind {served}, not {given['kind']!r} (an MCP server runs itself)"
        )
    return given


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flakebot_magic.clients.bridge",
        description="Serve a flakebot tool (of a kind that does not speak MCP itself) over MCP on stdio.",
    )
    bridged = [name for name, kind in KINDS.items() if kind.bridged]
    parser.add_argument("binary", type=Path, help="the deployed tool's executable")
    parser.add_argument("--name", required=True, help="the tool's name")
    parser.add_argument("--kind", choices=bridged, default=bridged[0])
    parser.add_argument("--contract", default="", help="the tool contract as JSON (its kind, health path, ...)")
    parser.add_argument("--timeout", type=float, default=TOOL_TIMEOUT, help="seconds allowed per call")
    parser.add_argument("--health", default="/health", help="http: the readiness path")
    parser.add_argument("--ready-timeout", type=float, default=10.0, help="http: seconds allowed to start")
    args = parser.parse_args(argv)
    manifest = _manifest(args.binary)
    tool = make_tool(
        args.name,
        args.binary,
        crate=str(manifest.get("crate") or args.name),
        version=str(manifest.get("version") or ""),
        source_hash=str(manifest.get("hash") or ""),
        store_path=args.binary.parent.parent,
        provenance=manifest,
        contract=_contract(args),
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
