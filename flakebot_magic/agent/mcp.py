"""``flakebot mcp``'s protocol: JSON-RPC 2.0 requests in, responses and notifications out, in both MCP eras.

The transport (stdio, Streamable HTTP) hands each message to
:meth:`ServerSession.handle` with ``out``, a function that sends a message
back on the stream the request came from. A request is served in the era it
opens (``clients/revisions.py``):

* **2026-07-28, stateless**: a request whose ``params._meta`` carries the
  protocol version (and ``server/discover``, ``subscriptions/listen``, which
  exist only there). Its envelope is checked first (``-32602``, over HTTP
  ``-32020`` for headers that contradict it, ``-32022`` with the revisions
  served for a version flakebot does not serve); each result carries
  ``resultType``, the server's identity in ``_meta`` and, for ``tools/list``
  and ``server/discover``, the cache hints. ``ping``, ``initialize`` and the
  other methods the revision removed are ``-32601``. Who asks for a build is
  the request's ``clientInfo``.
* **2025-11-25 and older**: ``initialize`` opens a session as before; its
  requests carry no envelope (one with neither is served in this era, as
  before, whether or not ``initialize`` came first).

Quick requests are answered before ``handle`` returns; ``tools/call`` of
``build_tool`` runs on a thread of its own (``handle`` returns it), so the
session keeps reading: a ``notifications/cancelled`` for the build stops it as
the widget's Cancel does (cargo's process group killed, the workspace kept) and
no response follows. While it runs, a request that carries
``_meta.progressToken`` gets one ``notifications/progress`` per finished
stage. When a tool is built (here or anywhere on the machine), the client
learns it before the build's response: a legacy session by
``notifications/tools/list_changed`` (on the build's stream, else its
notification channel), a modern client on each ``subscriptions/listen`` stream
that asked for ``toolsListChanged`` (the notification tagged with the
subscription's id; the acknowledgment comes first). Calls of built tools run
on the reading thread, so they cost one JSON round on top of the tool's own
client.
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
    response,
    tool_result,
)
from ..clients.revisions import (
    REMOVED_METHODS,
    SERVED_VERSIONS,
    SUBSCRIPTION_ID_KEY,
    Envelope,
    Refusal,
    modern_result,
    negotiate,
    read_envelope,
    stateless,
)
from ..clients.schema import check_arguments
from ..config import Settings
from ..errors import Cancelled, FlakebotError
from ..events import Event, StageFinished
from ..request import RunFlags
from ..untrusted import safe_text
from .builds import AgentBudget, AgentBuild, AgentSession
from .catalog import ToolCatalog
from .functions import BUILTINS, Outcome, build_outcome, list_tools, search, tool_info

__all__ = ["INSTRUCTIONS", "SERVER_INFO", "Send", "ServerSession"]

#: sends one JSON-RPC message on a stream
Send = Callable[[dict[str, Any]], None]

INSTRUCTIONS = (
    "flakebot builds command-line tools, MCP servers and HTTP services from published Rust crates, proven by "
    "cargo build and cargo test in a sandbox. Every tool already built is in this tool list. When none does "
    "the job, call build_tool with a request in words; its functions join the list when it returns "
    "(notifications/tools/list_changed; with protocol 2026-07-28, on a subscriptions/listen stream)."
)
SERVER_INFO = {"name": "flakebot", "title": "flakebot: tools from Rust crates", "version": __version__}
#: the cache hints' freshness: what the server offers holds until flakebot is upgraded; the tool list may
#: change at any moment (a build anywhere on the machine), so it is stale at once (a listen stream says when)
DISCOVER_TTL_MS = 3_600_000
TOOLS_TTL_MS = 0


def list_changed(subscription: Any = None) -> dict[str, Any]:
    """``notifications/tools/list_changed``; on a listen stream, tagged with its subscription's id."""
    note: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    if subscription is not None:
        note["params"] = {"_meta": {SUBSCRIPTION_ID_KEY: subscription}}
    return note


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


class _Listener:
    """One ``subscriptions/listen`` stream: its request's id, where it goes, what it asked for, the list it knows."""

    def __init__(self, ident: Any, out: Send, honored: dict[str, Any], known: tuple[tuple[str, str, str], ...]) -> None:
        self.ident = ident
        self.out = out
        self.honored = honored
        self.known = known


def _stamped(out: Send, ident: Any) -> Send:
    """``out`` for a modern request: its result gets ``resultType`` and the server's identity."""

    def send(message: dict[str, Any]) -> None:
        if message.get("id") == ident and isinstance(message.get("result"), Mapping):
            message = {**message, "result": modern_result(message["result"], SERVER_INFO)}
        out(message)

    return send


class ServerSession:
    """One client connection's MCP: the legacy session its ``initialize`` opens, and stateless requests.

    Parameters
    ----------
    settings
        The user's settings: every build and call uses them.
    catalog
        The built tools (shared by the sessions of one server).
    notify
        Sends a message the client did not ask for (``list_changed`` after a
        build elsewhere, to a legacy session): stdout, or the session's GET
        stream over HTTP.
    flags
        How the agent's builds go (``flakebot mcp --candidates 3``...).
    budget
        Where builds are counted against the agent limits: per server process. A stdio process has one
        session; over HTTP the server shares one budget between every legacy session and its stateless
        requests, so a new ``initialize`` buys no new builds.
    """

    def __init__(
        self,
        settings: Settings,
        catalog: ToolCatalog,
        *,
        notify: Send,
        flags: RunFlags | None = None,
        budget: AgentBudget | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.notify = notify
        self.client: dict[str, Any] = {}
        self.protocol = ""
        # the agent limits: this session's own, or the budget its server shares between its sessions
        self.agent = AgentSession(settings, requested_by="mcp client", flags=flags, budget=budget)
        self.initialized = False
        self._builds: dict[str, AgentBuild] = {}
        self._cancelled: set[str] = set()
        self._listeners: dict[str, _Listener] = {}
        self._lock = threading.Lock()
        self.known: tuple[tuple[str, str, str], ...] | None = None

    # -- dispatch ----------------------------------------------------------------

    def handle(
        self, message: Any, out: Send, *, headers: Mapping[str, str | None] | None = None
    ) -> threading.Thread | None:
        """Answer one message on ``out``; a thread when the answer comes later (a build).

        ``headers`` (lower-case names): an HTTP request the transport routed to the stateless era, whose
        routing headers must agree with its body; None on stdio and for a legacy HTTP session.
        """
        request = check(message)
        if not isinstance(request, Request):
            if request is not None:
                out(request)  # not a request this server can serve (the bridge answers the same)
            return None  # a response: this server sends no requests
        method, params = request.method, request.params
        if request.notification:
            if method == "notifications/cancelled":
                self._cancel(params)
            elif method == "notifications/initialized":
                self.initialized = True
            return None  # other notifications need no answer
        try:
            if headers is not None or stateless(method, params):
                return self._modern(request, out, headers)
            return self._legacy(request, out)
        except Exception as exc:  # a bug here must not end the session
            out(error(request.ident, INTERNAL_ERROR, f"Internal error: {type(exc).__name__}: {exc}"))
        return None

    def _legacy(self, request: Request, out: Send) -> threading.Thread | None:
        method, params, ident = request.method, request.params, request.ident
        if method == "initialize":
            out(response(ident, self._initialize(params)))
        elif method == "ping":
            out(response(ident, {}))
        elif method == "tools/list":
            out(response(ident, {"tools": self.tools()}))
        elif method == "tools/call":
            return self._call(ident, params, out, who=None)
        else:
            out(error(ident, METHOD_NOT_FOUND, f"Method not found: {method}"))
        return None

    def _modern(self, request: Request, out: Send, headers: Mapping[str, str | None] | None) -> threading.Thread | None:
        method, params, ident = request.method, request.params, request.ident
        envelope = read_envelope(method, params, headers)
        if isinstance(envelope, Refusal):
            out(error(ident, envelope.code, envelope.message, envelope.data))
            return None
        if method == "server/discover":
            out(response(ident, modern_result(self._discover(), SERVER_INFO, ttl_ms=DISCOVER_TTL_MS)))
        elif method == "tools/list":
            out(response(ident, modern_result({"tools": self.tools()}, SERVER_INFO, ttl_ms=TOOLS_TTL_MS)))
        elif method == "tools/call":
            return self._call(ident, params, _stamped(out, ident), who=_client_name(envelope))
        elif method == "subscriptions/listen":
            self._listen(ident, params, out)
        else:
            gone = " (the revision 2026-07-28 removed it)" if method in REMOVED_METHODS else ""
            out(error(ident, METHOD_NOT_FOUND, f"Method not found: {method}{gone}"))
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
            "serverInfo": dict(SERVER_INFO),
            "instructions": INSTRUCTIONS,
        }

    def _discover(self) -> dict[str, Any]:
        return {
            "supportedVersions": list(SERVED_VERSIONS),
            "capabilities": {"tools": {"listChanged": True}},
            "instructions": INSTRUCTIONS,
        }

    def tools(self) -> list[dict[str, Any]]:
        """``tools/list``: flakebot's functions, then every built tool's (in the inventory's order)."""
        own = [{"name": n, "description": d, "inputSchema": s} for n, (d, s) in BUILTINS.items()]
        return own + [entry.mcp() for entry in self.catalog.entries()]

    # -- tools/call --------------------------------------------------------------

    def _call(self, ident: Any, params: Mapping[str, Any], out: Send, *, who: str | None) -> threading.Thread | None:
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
                    args=(ident, arguments, meta.get("progressToken"), out, who),
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

    def _build(self, ident: Any, arguments: Mapping[str, Any], token: Any, out: Send, who: str | None) -> None:
        """One build_tool call (``who``: the stateless request's client; None: this legacy session's)."""
        key = json.dumps(ident)
        try:
            build = self.agent.start(
                str(arguments.get("request") or ""),
                name=arguments.get("name"),
                crate=arguments.get("crate"),
                requested_by=who,
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
        signature = self.catalog.signature()
        if who is None:  # a legacy session hears of it on the build's own stream
            self.known = signature
            out(list_changed())
        self._tell_listeners(signature)
        outcome: Outcome = build_outcome(report.tool, functions, report.requested_by, report.tokens)
        out(response(ident, tool_result(outcome.text, outcome.data)))

    def _cancel(self, params: Mapping[str, Any]) -> None:
        """``notifications/cancelled``: stop a build, or end a listen stream (its request gets no response)."""
        key = json.dumps(params.get("requestId"))
        with self._lock:
            if self._listeners.pop(key, None) is not None:
                return
            self._cancelled.add(key)
            build = self._builds.get(key)
        if build is not None:
            reason = str(params.get("reason") or "cancelled by the MCP client")
            build.cancel(f"{build.requested_by}: {reason}"[:200])

    def cancel_request(self, ident: Any, reason: str) -> None:
        """The transport lost the request's stream (an HTTP client hung up): for 2026-07-28, its cancellation."""
        self._cancel({"requestId": ident, "reason": reason})

    # -- subscriptions/listen ------------------------------------------------------

    def _listen(self, ident: Any, params: Mapping[str, Any], out: Send) -> None:
        wanted = params.get("notifications")
        if not isinstance(wanted, Mapping):
            out(error(ident, INVALID_PARAMS, "subscriptions/listen needs params.notifications, an object"))
            return
        honored = {"toolsListChanged": True} if wanted.get("toolsListChanged") is True else {}
        listener = _Listener(ident, out, honored, self.catalog.signature())
        with self._lock:  # the acknowledgment goes first: nothing is sent to a listener before it is in the table
            out(
                {
                    "jsonrpc": "2.0",
                    "method": "notifications/subscriptions/acknowledged",
                    "params": {"_meta": {SUBSCRIPTION_ID_KEY: ident}, "notifications": honored},
                }
            )
            self._listeners[json.dumps(ident)] = listener

    def unlisten(self, ident: Any) -> None:
        """End a listen stream the client closed (its HTTP stream)."""
        with self._lock:
            self._listeners.pop(json.dumps(ident), None)

    def _tell_listeners(self, signature: tuple[tuple[str, str, str], ...]) -> None:
        with self._lock:
            for key, listener in list(self._listeners.items()):
                if not listener.honored.get("toolsListChanged") or listener.known == signature:
                    continue
                listener.known = signature
                try:
                    listener.out(list_changed(listener.ident))
                except OSError:
                    self._listeners.pop(key, None)

    # -- the session's end, changes elsewhere ----------------------------------------

    def tools_changed(self, signature: tuple[tuple[str, str, str], ...]) -> None:
        """The inventory changed (a build elsewhere): tell each listener, and the legacy client, whose list differs."""
        self._tell_listeners(signature)
        if not self.initialized or self.known is None or signature == self.known:
            return
        self.known = signature
        try:
            self.notify(list_changed())
        except OSError as exc:
            print(safe_text(f"flakebot: could not send tools/list_changed: {exc}"), file=sys.stderr)

    @property
    def busy(self) -> bool:
        """Whether a build of this session runs, or a client listens on its stream (it is not ended to make room)."""
        with self._lock:
            return bool(self._builds or self._listeners)

    def close(self, wait: float = 30.0) -> None:
        """End the listen streams (a completion result each), cancel the running builds and wait for them to stop."""
        with self._lock:
            builds = list(self._builds.values())
            listeners, self._listeners = list(self._listeners.values()), {}
        for listener in listeners:
            done = modern_result({"_meta": {SUBSCRIPTION_ID_KEY: listener.ident}}, SERVER_INFO)
            try:
                listener.out(response(listener.ident, done))
            except OSError:
                pass
        for build in builds:
            build.cancel("the MCP client went away")
        deadline = time.monotonic() + wait
        while any(not build.run.done for build in builds) and time.monotonic() < deadline:
            time.sleep(0.05)


def _client_name(envelope: Envelope) -> str:
    return str(envelope.client_info.get("name") or "mcp client")[:100]
