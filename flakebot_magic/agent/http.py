"""``flakebot mcp --http PORT``: the MCP Streamable HTTP transport on 127.0.0.1, behind a bearer token.

One endpoint, ``/mcp``, for both MCP eras (``clients/revisions.py``). A POST
whose ``MCP-Protocol-Version`` header names no handshake revision (2026-07-28,
or one flakebot does not serve), or that carries neither that header nor a
session nor ``initialize``, is **stateless** (2026-07-28):

* its routing headers (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``)
  must agree with its body, each sent once (``-32020``), and its envelope is
  checked (``agent/mcp.py``); an error comes back as JSON-RPC with the status
  the revision gives it (``400``; ``404`` for ``-32601``);
* ``build_tool`` answers with an event stream (progress, then the response);
  the client closing it cancels the build;
* ``subscriptions/listen`` answers with an event stream that stays open: the
  acknowledgment, then ``notifications/tools/list_changed`` whenever the tool
  list changes, keep-alive comments between; it ends when the client closes it
  (or, with a completion result, when the server stops);
* a notification is answered ``202``; no session id is minted or read.

Anything else is the **2025-11-25** (and older) transport, as before:
``initialize`` opens a session (its id in ``Mcp-Session-Id``, sent with every
later request), ``build_tool`` answers with an event stream carrying its
progress, ``tools/list_changed`` and the response, ``GET`` opens the session's
event stream (``tools/list_changed`` when a tool is built elsewhere), and
``DELETE`` ends the session (its running builds are cancelled).

Every request must carry ``Authorization: Bearer TOKEN``; a request whose
``Host`` or ``Origin`` names anything but 127.0.0.1 or localhost is refused
(a web page of another site, a name rebound to 127.0.0.1), and the server
listens on 127.0.0.1 only. These checks come before anything else, whatever
the era. A body may be at most 4 MiB (``MAX_REQUEST_BYTES``, stdio's cap too). Connections are bounded
before any of that (``host/serving.py``): how many are held (a stranger's idle one makes room for the next),
how long a request's head and body may take, how long a connection may sit idle.
"""

from __future__ import annotations

import hmac
import json
import queue
import secrets
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ..clients.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    MAX_REQUEST_BYTES,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    error,
)
from ..clients.revisions import HANDSHAKE_VERSIONS, HEADER_MISMATCH, MISSING_CLIENT_CAPABILITY, UNSUPPORTED_VERSION
from ..config import Settings
from ..host.fsutil import load_json
from ..host.serving import BODY_SECONDS, BoundedServer
from ..request import RunFlags
from ..untrusted import safe_text
from .builds import AgentBudget
from .catalog import ToolCatalog
from .functions import BUILTIN_NAMES
from .mcp import ServerSession
from .stdio import InventoryWatcher

__all__ = ["McpHttpServer", "serve_http"]

#: the one path the server answers on
ENDPOINT = "/mcp"
#: legacy sessions a server keeps; past it, an ``initialize`` ends the least recently used idle one
MAX_SESSIONS = 64
#: the largest request body read (the stdio transport's cap too)
MAX_BODY = MAX_REQUEST_BYTES
#: seconds between keep-alive comments on an idle event stream
KEEPALIVE = 15.0
#: the only names a request's ``Host`` and ``Origin`` may carry (DNS rebinding gets no further)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: a stateless request's error -> its HTTP status (2026-07-28, streamable-http); others are 200
ERROR_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_CLIENT_CAPABILITY: 400,
    UNSUPPORTED_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
#: the headers a stateless request is routed by; each may be sent once
ROUTING_HEADERS = ("MCP-Protocol-Version", "Mcp-Method", "Mcp-Name")


class _Session:
    """A legacy session over HTTP: the protocol session and its GET stream's queue."""

    def __init__(self, ident: str, server: McpHttpServer) -> None:
        self.id = ident
        self.events: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.streaming = False
        self.protocol = ServerSession(
            server.settings, server.catalog, notify=self._push, flags=server.flags, budget=server.budget
        )
        #: when a request last named this session (the least recently used one goes first past the cap)
        self.used = time.monotonic()

    def _push(self, message: dict[str, Any]) -> None:
        if self.streaming:  # without an open GET stream, the client learns of changes at its next tools/list
            self.events.put(message)


def _no_notify(message: dict[str, Any]) -> None:
    """The stateless session has no channel of its own: its clients hear of changes on their listen streams."""


class McpHttpServer(BoundedServer, ThreadingHTTPServer):
    """The HTTP server: its legacy sessions, the stateless one, the shared catalog, the inventory watcher."""

    daemon_threads = True

    def __init__(
        self, settings: Settings, *, port: int = 0, token: str | None = None, flags: RunFlags | None = None
    ) -> None:
        self.settings = settings
        self.flags = flags
        self.token = token or secrets.token_urlsafe(32)
        self.catalog = ToolCatalog(settings, reserved=BUILTIN_NAMES)
        self.sessions: dict[str, _Session] = {}
        #: the agent limits of this server: every session and every stateless request counted together
        self.budget = AgentBudget()
        #: every stateless (2026-07-28) request's: its listeners
        self.stateless = ServerSession(settings, self.catalog, notify=_no_notify, flags=flags, budget=self.budget)
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)
        self.watcher = InventoryWatcher(
            self.catalog, lambda: [self.stateless, *(s.protocol for s in list(self.sessions.values()))]
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{ENDPOINT}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed: one line on stderr, never a traceback; a client that hung up, nothing."""
        problem = sys.exc_info()[1]
        if isinstance(problem, (ConnectionError, TimeoutError)):
            return  # a client that reset or left its connection (an idle keep-alive one, at its exit)
        where = f"{client_address[0]}:{client_address[1]}" if isinstance(client_address, tuple) else "a client"
        print(
            safe_text(f"flakebot mcp: a request from {where} failed: {type(problem).__name__}: {problem}"),
            file=sys.stderr,
        )

    def serve(self) -> None:
        self.watcher.start()
        try:
            self.serve_forever(poll_interval=0.2)
        finally:
            self.watcher.stop()
            self.stateless.close()
            for session in list(self.sessions.values()):
                session.events.put(None)
                session.protocol.close()
            self.catalog.close()

    def open_session(self) -> _Session:
        """A new legacy session; past :data:`MAX_SESSIONS`, the least recently used idle one is ended first (its
        client's next request gets 404 and initializes again, as the transport says)."""
        session = _Session(secrets.token_urlsafe(24), self)
        with self.lock:
            self.sessions[session.id] = session
            over = len(self.sessions) - MAX_SESSIONS
            idle = sorted(
                (s for s in self.sessions.values() if s is not session and not (s.streaming or s.protocol.busy)),
                key=lambda s: s.used,
            )
        for old in idle[: max(0, over)]:
            self.end_session(old.id)
        return session

    def end_session(self, ident: str) -> bool:
        with self.lock:
            session = self.sessions.pop(ident, None)
        if session is None:
            return False
        session.events.put(None)
        threading.Thread(target=session.protocol.close, daemon=True).start()
        return True


class _Handler(BaseHTTPRequestHandler):
    server: McpHttpServer
    protocol_version = "HTTP/1.1"
    server_version = "flakebot-mcp"

    def log_message(self, format: str, *args: Any) -> None:
        return  # stderr stays for what matters

    # -- checks ------------------------------------------------------------------

    def _plain(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        body = text.encode()
        if status >= 400:
            self.close_connection = True  # the refused request's body is left unread: this connection is done
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:
            self.send_header("Connection", "close")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, message: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(message, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _allowed(self) -> bool:
        if urlsplit(self.path).path != ENDPOINT:
            self._plain(404, f"not found: MCP is served at {ENDPOINT}")
            return False
        origin = self.headers.get("Origin")
        if origin and urlsplit(origin).hostname not in LOOPBACK_NAMES:
            self._plain(403, "forbidden: requests from web pages of other origins are refused")
            return False
        host = self.headers.get("Host") or ""
        if urlsplit(f"//{host}").hostname not in LOOPBACK_NAMES:  # a name rebound to 127.0.0.1 by its DNS
            self._plain(403, f"forbidden: this server answers to 127.0.0.1 and localhost only, not to Host {host!r}")
            return False
        sent = self.headers.get("Authorization", "")
        scheme, _, given = sent.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.server.token.encode()):
            self._plain(401, "unauthorized: send Authorization: Bearer TOKEN", {"WWW-Authenticate": "Bearer"})
            return False
        self.server.admit(self.connection)  # it showed the token: never closed to make room for a stranger
        return True

    def _session(self) -> _Session | None:
        ident = self.headers.get("Mcp-Session-Id")
        if not ident:
            self._plain(400, "bad request: Mcp-Session-Id header missing (initialize first)")
            return None
        session = self.server.sessions.get(ident)
        if session is not None:
            session.used = time.monotonic()
        if session is None:
            self._plain(404, "session not found: initialize again")
        return session

    def _hung_up(self) -> bool:
        """Whether the client closed the connection (a stream's reader went away)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- methods -----------------------------------------------------------------

    def do_POST(self) -> None:
        if not self._allowed():
            return
        declared = (self.headers.get("Content-Length") or "0").strip()
        if not (declared.isascii() and declared.isdigit()):  # int() takes "-1" (read to the end), "+5", "1_0"
            self._plain(400, "bad request: Content-Length must be a number of bytes")
            return
        length = int(declared)
        if length > MAX_BODY:
            self._plain(413, f"request too large (at most {MAX_BODY} bytes)")
            return
        self.server.limit(self.connection, BODY_SECONDS)
        try:
            message = load_json(self.rfile.read(length))
        except ValueError as exc:
            self._json(400, error(None, PARSE_ERROR, f"Parse error: {exc}"))
            return
        finally:
            self.server.limit(self.connection, None)
        if self._stateless(message):
            self._serve_stateless(message)
        else:
            self._serve_session(message)

    def _stateless(self, message: Any) -> bool:
        """The era of a POST: stateless unless it names a handshake revision, a session or ``initialize``."""
        version = self.headers.get("MCP-Protocol-Version")
        if version is not None:
            return version.strip() not in HANDSHAKE_VERSIONS
        opens = isinstance(message, dict) and message.get("method") == "initialize"
        return not (self.headers.get("Mcp-Session-Id") or opens or isinstance(message, list))

    def _serve_stateless(self, message: Any) -> None:
        twice = [name for name in ROUTING_HEADERS if len(self.headers.get_all(name) or []) > 1]
        if twice:
            ident = message.get("id") if isinstance(message, dict) else None
            self._json(400, error(ident, HEADER_MISMATCH, f"Header mismatch: {twice[0]} sent more than once"))
            return
        if isinstance(message, dict) and "method" in message and "id" not in message:
            self._empty(202)  # a notification: the stateless wire has none a client sends (closing a stream cancels)
            return
        headers = {name.lower(): (self.headers.get(name) or "").strip() or None for name in ROUTING_HEADERS}
        answers: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        protocol = self.server.stateless
        thread = protocol.handle(message, answers.put, headers=headers)
        ident = message.get("id") if isinstance(message, dict) else None
        if thread is not None:
            self._stream(answers, [thread], {}, cancel=lambda: protocol.cancel_request(ident, "stream closed"))
            return
        if answers.empty():
            self._empty(202)
            return
        first = answers.get()
        if first.get("method") == "notifications/subscriptions/acknowledged":
            self._listen(protocol, ident, first, answers)
            return
        code = first.get("error", {}).get("code") if isinstance(first.get("error"), dict) else None
        self._json(ERROR_STATUS.get(code, 200) if code is not None else 200, first)

    def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()

    def _serve_session(self, message: Any) -> None:
        messages = message if isinstance(message, list) else [message]
        starts = any(isinstance(m, dict) and m.get("method") == "initialize" for m in messages)
        session = self.server.open_session() if starts else self._session()
        if session is None:
            return
        answers: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        threads = [t for t in (session.protocol.handle(m, answers.put) for m in messages) if t is not None]
        headers = {"Mcp-Session-Id": session.id}
        if not threads:
            replies = []
            while not answers.empty():
                replies.append(answers.get())
            if not replies:
                self._empty(202, headers)
                return
            self._json(200, replies if isinstance(message, list) else replies[0], headers)
            return
        self._stream(answers, threads, headers, cancel=None)

    def _open_stream(self, headers: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Accel-Buffering", "no")
        self.send_header("Connection", "close")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.close_connection = True

    def _event(self, item: dict[str, Any]) -> None:
        self.wfile.write(f"event: message\ndata: {json.dumps(item, ensure_ascii=False)}\n\n".encode())
        self.wfile.flush()

    def _stream(
        self,
        answers: queue.SimpleQueue[dict[str, Any]],
        threads: list[threading.Thread],
        headers: dict[str, str],
        *,
        cancel: Any,
    ) -> None:
        """A build's answer: an event stream of its messages until its thread ends.

        ``cancel``: a stateless request's, called when the client closes the stream (for 2026-07-28 that is
        the request's cancellation); a legacy session's build goes on (a disconnect is no cancel there).
        """
        self._open_stream(headers)
        alive, idle, quiet = True, 0.0, 0.0
        while True:
            done = not any(t.is_alive() for t in threads)
            try:
                item = answers.get(timeout=0.05)
            except queue.Empty:
                if done:
                    return
                idle, quiet = idle + 0.05, quiet + 0.05
                if alive and idle >= 1.0:  # once a second: is the reader still there?
                    idle = 0.0
                    alive = self._still_there(cancel)
                if alive and quiet >= KEEPALIVE:  # a long build: a comment now and then keeps proxies from closing it
                    quiet = 0.0
                    alive = self._write(b": keep-alive\n\n", cancel)
                continue
            quiet = 0.0
            if alive:
                alive = self._write(
                    f"event: message\ndata: {json.dumps(item, ensure_ascii=False)}\n\n".encode(), cancel
                )

    def _write(self, data: bytes, cancel: Any) -> bool:
        """Write to a build's stream; False (and ``cancel()``) when the client hung up."""
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:
            if cancel is not None:
                cancel()
            return False

    def _still_there(self, cancel: Any) -> bool:
        if not self._hung_up():
            return True
        if cancel is not None:
            cancel()
        return False

    def _listen(
        self, protocol: ServerSession, ident: Any, ack: dict[str, Any], events: queue.SimpleQueue[dict[str, Any]]
    ) -> None:
        """A ``subscriptions/listen`` stream: the acknowledgment, then its notifications, until either side ends it."""
        self._open_stream({})
        waited = 0.0
        try:
            self._event(ack)
            while True:
                try:
                    item = events.get(timeout=1.0)
                except queue.Empty:
                    waited += 1.0
                    if self._hung_up():
                        return
                    if waited >= KEEPALIVE:
                        waited = 0.0
                        self.wfile.write(b": keep-alive\n\n")
                        self.wfile.flush()
                    continue
                self._event(item)
                if "method" not in item:  # the completion result: the server ended the subscription
                    return
        except OSError:
            return
        finally:
            protocol.unlisten(ident)

    def do_GET(self) -> None:
        if not self._allowed():
            return
        session = self._session()
        if session is None:
            return
        if "text/event-stream" not in self.headers.get("Accept", ""):
            self._plain(406, "not acceptable: GET opens an event stream (Accept: text/event-stream)")
            return
        self._open_stream({"Mcp-Session-Id": session.id})
        session.streaming = True
        try:
            while True:
                try:
                    item = session.events.get(timeout=KEEPALIVE)
                except queue.Empty:
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    continue
                if item is None:
                    return
                self._event(item)
        except OSError:
            return
        finally:
            session.streaming = False

    def do_DELETE(self) -> None:
        if not self._allowed():
            return
        ident = self.headers.get("Mcp-Session-Id") or ""
        if self.server.end_session(ident):
            self._plain(200, "session ended")
        else:
            self._plain(404, "session not found")


def serve_http(settings: Settings, *, port: int = 0, token: str | None = None, flags: RunFlags | None = None) -> int:
    """Serve MCP over Streamable HTTP until interrupted; the URL and the token are printed on stderr."""
    server = McpHttpServer(settings, port=port, token=token, flags=flags)
    print(f"flakebot mcp: serving {server.url}", file=sys.stderr)
    print(f"flakebot mcp: send the header  Authorization: Bearer {server.token}", file=sys.stderr, flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
