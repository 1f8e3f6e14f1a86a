"""JSON-RPC 2.0 for flakebot's MCP servers, written once: framing, checking a request, errors, versions, results.

Both servers use it: the bridge (``python -m flakebot_magic.clients.bridge``,
one deployed tool over MCP) and ``flakebot mcp`` (``agent/mcp.py``). What is
not a request a server can serve gets the same answer from both: a line that
is not JSON ``-32700``; ``null``, a number or an object that is not a request
``-32600`` (id ``null`` where the request has none, or an id that is neither
a string nor an integer); ``params`` that are not an object ``-32602``; an
unknown method ``-32601`` (the server's own). A notification, and a response
to nothing the server asked, get no answer.

Examples
--------
>>> check({"jsonrpc": "2.0", "id": 1, "method": "ping"})
Request(ident=1, method='ping', params={}, notification=False)
>>> check({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": [1]})["error"]["code"]
-32602
>>> check({"jsonrpc": "2.0", "id": 9, "result": {}}) is None
True
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from ..host.fsutil import load_json

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_REQUEST_BYTES",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "Request",
    "check",
    "error",
    "response",
    "serve_lines",
    "tool_result",
]

#: JSON-RPC 2.0 error codes
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603

#: the longest message a server reads (a stdio line, an HTTP body): past it, an error, never the memory to hold it
MAX_REQUEST_BYTES = 4 * 1024 * 1024

#: sends one JSON-RPC message
Send = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Request:
    """One request (or notification) that passed :func:`check`: its id, method and params (an object)."""

    ident: Any
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    notification: bool = False


def error(ident: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response (``data`` left out when None)."""
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": ident, "error": body}


def response(ident: Any, result: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-RPC result response."""
    return {"jsonrpc": "2.0", "id": ident, "result": dict(result)}


def tool_result(text: str, data: Mapping[str, Any] | None = None, *, is_error: bool = False) -> dict[str, Any]:
    """An MCP ``tools/call`` result: the text (what the model reads), and the data when it is an object."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if data:
        result["structuredContent"] = dict(data)
    return result


def check(message: Any) -> Request | dict[str, Any] | None:
    """A decoded message as a :class:`Request`, or the error to answer it with, or None (a response: no answer)."""
    if not isinstance(message, dict):
        kind = "a batch (MCP has no batches)" if isinstance(message, list) else json.dumps(message)
        return error(None, INVALID_REQUEST, f"Invalid Request: expected one request object, got {kind}")
    ident = message.get("id")
    if "id" in message and not (isinstance(ident, (str, int)) and not isinstance(ident, bool)):
        return error(None, INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    method = message.get("method")
    if message.get("jsonrpc") != "2.0" or not isinstance(method, str):
        if "method" not in message and ("result" in message or "error" in message):
            return None  # a response (to nothing this server asked): nothing to answer
        return error(ident, INVALID_REQUEST, 'Invalid Request: needs "jsonrpc": "2.0" and a string "method"')
    params = message.get("params", {})
    if not isinstance(params, dict):
        if "id" not in message:
            return None  # a notification gets no answer, not even an error
        return error(ident, INVALID_PARAMS, "Invalid params: params must be an object")
    return Request(ident, method, params, notification="id" not in message)


def serve_lines(
    stdin: IO[bytes],
    send: Send,
    handle: Callable[[Any], object],
    *,
    batches: bool = False,
    limit: int = MAX_REQUEST_BYTES,
) -> None:
    """The stdio loop: one JSON-RPC message per line from ``stdin`` to ``handle`` until it closes.

    A line that is not JSON is answered ``-32700`` here. A line longer than
    ``limit`` bytes is never held: it is read on to its newline in pieces,
    dropped, and answered ``-32600`` (id ``null``), and the next line is read
    as usual (the HTTP transport's cap, :data:`MAX_REQUEST_BYTES`, is the same).
    With ``batches``, a JSON array's messages are handled one by one (MCP
    before 2025-06-18); without, the array reaches ``handle`` (which refuses it).
    """
    while True:
        raw = stdin.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not raw.endswith(b"\n"):
            size = len(raw)
            while raw and not raw.endswith(b"\n"):  # the rest of the line, a piece at a time
                raw = stdin.readline(1 << 16)
                size += len(raw)
            send(
                error(
                    None,
                    INVALID_REQUEST,
                    f"Invalid Request: a message of {size:,} bytes or more, longer than the {limit:,} bytes this "
                    "server reads; it was dropped unread. Send smaller messages.",
                    {"maxBytes": limit},
                )
            )
            continue
        if not raw.strip():
            continue
        try:
            message = load_json(raw)
        except ValueError as exc:
            send(error(None, PARSE_ERROR, f"Parse error: {exc}"))
            continue
        for each in message if batches and isinstance(message, list) and message else [message]:
            handle(each)
