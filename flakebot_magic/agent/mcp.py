"""One MCP session of ``flakebot mcp``: JSON-RPC 2.0 requests in, responses and notifications out.

The transport (stdio, Streamable HTTP) hands each message to
:meth:`ServerSession.handle` with ``out``, a function that sends a message
back on the stream the request came from. Quick requests are answered before
``handle`` returns; ``tools/call`` of ``build_tool`` runs on a thread of its
own (``handle`` returns it), so the session keeps reading: a
``notifications/cancelled`` for the build stops it as the widget's Cancel
does (cargo's process group killed, the workspace kept) and no response
follows. While it runs, a request that carries ``_meta.progressToken`` gets
one ``notifications/progress`` per finished stage. Before the build's
response the session sends ``notifications/tools/list_changed``; its next
``tools/list`` has the new tool's functions. Calls of built tools run on the
reading thread, so they cost one JSON round on top of the tool's own client.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .._version import __version__
from ..clients.agents import result_text
from ..clients.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Request,
    check,
    error,
    negotiate,
    response,
    tool_result,
)
from ..clients.mcp import PROTOCOL_VERSION
from ..clients.schema import check_arguments
from ..config import Settings
from ..errors import Cancelled, FlakebotError
from ..events import Event, StageFinished
from ..request import RunFlags
from ..untrusted import safe_text
from .builds import AgentBuild, AgentSession
from .catalog import ToolCatalog
from .functions import BUILTINS, Outcome, build_outcome, list_tools, search, tool_info

__all__ = ["INSTRUCTIONS", "Send", "ServerSession"]

#: sends one JSON-RPC message on a stream
Send = Callable[[dict[str, Any]], None]

INSTRUCTIONS = (
    "flakebot builds command-line tools, MCP servers and HTTP services from published Rust crates, proven by "
    "cargo build and cargo test in a sandbox. Every tool already built is in this tool list. When none does "
    "the job, call build_tool with a request in words; its functions join the list when it returns "
    "(notifications/tools/list_changed)."
)


def list_changed() -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


class _Progress:
    """An observer that sends one ``notifications/progress`` per finished stage."""

    def __init__(self, token: Any, out: Send) -> None:
        self.token = token
        self.out = out
        self.count = 0

    def __call__(self, event: Event) -> None:
        if not isinstance(event, StageFinished):
            return
        self.count += 1
        detail = f": {event.detail}" if event.detail else ""
        self.out(
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {
                    "progressToken": self.token,
                    "progress": self.count,
                    "message": f"{event.stage} {event.status}{event.timing}{detail}"[:500],
                },
            }
        )


class ServerSession:
    """One client's MCP session: its handshake, its builds (counted against the agent limits), its tool list.

    Parameters
    ----------
    settings
        The user's settings: every build and call uses them.
    catalog
        The built tools (shared by the sessions of one server).
    notify
        Sends a message the client did not ask for (``list_changed`` after a
        build elsewhere): stdout, or the session's GET stream over HTTP.
    flags
        How the agent's builds go (``flakebot mcp --candidates 3``...).
    """

    def __init__(
        self, settings: Settings, catalog: ToolCatalog, *, notify: Send, flags: RunFlags | None = None
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.notify = notify
        self.client: dict[str, Any] = {}
        self.protocol = PROTOCOL_VERSION
        self.agent = AgentSession(settings, requested_by="mcp client", flags=flags)
        self.initialized = False
        self._builds: dict[str, AgentBuild] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self.known: tuple[tuple[str, str, str], ...] | None = None

    # -- dispatch ----------------------------------------------------------------

    def handle(self, message: Any, out: Send) -> threading.Thread | None:
        """Answer one message on ``out``; a thread when the answer comes later (a build)."""
        request = check(message)
        if not isinstance(request, Request):
            if request is not None:
                out(request)  # not a request this server can serve (the bridge answers the same)
            return None  # a response: this server sends no requests
        method, params, ident = request.method, request.params, request.ident
        if request.notification:
            if method == "notifications/cancelled":
                self._cancel(params)
            elif method == "notifications/initialized":
                self.initialized = True
            return None  # other notifications need no answer
        try:
            if method == "initialize":
                out(response(ident, self._initialize(params)))
            elif method == "ping":
                out(response(ident, {}))
            elif method == "tools/list":
                out(response(ident, {"tools": self.tools()}))
            elif method == "tools/call":
                return self._call(ident, params, out)
            else:
                out(error(ident, METHOD_NOT_FOUND, f"Method not found: {method}"))
        except Exception as exc:  # a bug here must not end the session
            out(error(ident, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}"))
        return None

    def _initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        info = params.get("clientInfo")
        self.client = dict(info) if isinstance(info, Mapping) else {}
        self.agent.requested_by = str(self.client.get("name") or "mcp client")[:100]
        self.protocol = negotiate(params.get("protocolVersion"))
        self.known = self.catalog.signature()
        return {
            "protocolVersion": self.protocol,
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "flakebot", "title": "flakebot: tools from Rust crates", "version": __version__},
            "instructions": INSTRUCTIONS,
        }

    def tools(self) -> list[dict[str, Any]]:
        """``tools/list``: flakebot's functions, then every built tool's."""
        own = [{"name": n, "description": d, "inputSchema": s} for n, (d, s) in BUILTINS.items()]
        return own + [entry.mcp() for entry in self.catalog.entries()]

    # -- tools/call --------------------------------------------------------------

    def _call(self, ident: Any, params: Mapping[str, Any], out: Send) -> threading.Thread | None:
        name = params.get("name")
        arguments = params.get("arguments") if params.get("arguments") is not None else {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            out(error(ident, INVALID_PARAMS, "tools/call needs params.name (a string) and params.arguments"))
            return None
        if name in BUILTINS:
            try:
                check_arguments(arguments, BUILTINS[name][1], name)
            except (TypeError, ValueError) as exc:
                out(response(ident, tool_result(f"error: {exc}", is_error=True)))
                return None
            if name == "build_tool":
                found = params.get("_meta")
                meta: dict[str, Any] = found if isinstance(found, dict) else {}
                thread = threading.Thread(
                    target=self._build,
                    args=(ident, arguments, meta.get("progressToken"), out),
                    name=f"flakebot-mcp-build-{ident}",
                    daemon=True,
                )
                thread.start()
                return thread
            out(response(ident, self._builtin(name, arguments)))
            return None
        entry = self.catalog.find(name)
        if entry is None:
            out(error(ident, INVALID_PARAMS, f"Unknown tool: {name} (tools/list names them)"))
            return None
        try:
            value = entry.invoke(arguments)
        except Exception as exc:  # the model reads what went wrong and may try again
            out(response(ident, tool_result(f"{type(exc).__name__}: {exc}", is_error=True)))
            return None
        out(response(ident, tool_result(result_text(value), value if isinstance(value, dict) else None)))
        return None

    def _builtin(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        try:
            if name == "search_crates":
                outcome = search(self.settings, arguments)
            elif name == "list_tools":
                outcome = list_tools(self.settings)
            else:
                tool = str(arguments["name"])
                entry = next((e for e in self.catalog.entries() if e.tool == tool), None)
                outcome = tool_info(self.settings, tool, entry.client if entry is not None else None)
        except FlakebotError as exc:
            return tool_result(f"error: {exc}", is_error=True)
        return tool_result(outcome.text, outcome.data)

    def _build(self, ident: Any, arguments: Mapping[str, Any], token: Any, out: Send) -> None:
        key = json.dumps(ident)
        try:
            build = self.agent.start(
                str(arguments.get("request") or ""), name=arguments.get("name"), crate=arguments.get("crate")
            )
        except FlakebotError as exc:
            out(response(ident, tool_result(f"error: {exc}", is_error=True)))
            return
        with self._lock:
            self._builds[key] = build
            cancelled = key in self._cancelled
        if cancelled:  # the cancel came before the build was known
            build.cancel("cancelled by the MCP client")
        try:
            report = build.wait([_Progress(token, out)] if token is not None else [])
        except Cancelled as exc:
            if key not in self._cancelled:
                out(response(ident, tool_result(f"error: {exc}", is_error=True)))
            return  # cancelled by the client: no response (MCP cancellation)
        except FlakebotError as exc:
            out(response(ident, tool_result(f"error: {type(exc).__name__}: {exc}", is_error=True)))
            return
        except Exception as exc:
            out(response(ident, tool_result(f"error: {type(exc).__name__}: {exc}", is_error=True)))
            return
        finally:
            with self._lock:
                self._builds.pop(key, None)
                self._cancelled.discard(key)
        self.catalog.adopt(report.tool)
        functions = [e.name for e in self.catalog.entries() if e.tool == report.tool.name]
        self.known = self.catalog.signature()
        out(list_changed())
        outcome: Outcome = build_outcome(report.tool, functions, report.requested_by, report.tokens)
        out(response(ident, tool_result(outcome.text, outcome.data)))

    def _cancel(self, params: Mapping[str, Any]) -> None:
        key = json.dumps(params.get("requestId"))
        with self._lock:
            self._cancelled.add(key)
            build = self._builds.get(key)
        if build is not None:
            reason = str(params.get("reason") or "cancelled by the MCP client")
            build.cancel(f"{self.agent.requested_by}: {reason}"[:200])

    # -- the session's end, changes elsewhere ----------------------------------------

    def tools_changed(self, signature: tuple[tuple[str, str, str], ...]) -> None:
        """The inventory changed (a build elsewhere): tell the client when its tool list differs."""
        if not self.initialized or self.known is None or signature == self.known:
            return
        self.known = signature
        try:
            self.notify(list_changed())
        except OSError as exc:
            print(safe_text(f"flakebot: could not send tools/list_changed: {exc}"), file=sys.stderr)

    def close(self, wait: float = 30.0) -> None:
        """Cancel the session's running builds and wait for them to stop."""
        with self._lock:
            builds = list(self._builds.values())
        for build in builds:
            build.cancel("the MCP client went away")
        deadline = time.monotonic() + wait
        while any(not build.run.done for build in builds) and time.monotonic() < deadline:
            time.sleep(0.05)
