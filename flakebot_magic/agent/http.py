"""``flakebot mcp --http PORT``: the MCP Streamable HTTP transport on 127.0.0.1, behind a bearer token.

One endpoint, ``/mcp``:

* ``POST`` a JSON-RPC message. ``initialize`` opens a session (its id comes
  back in ``Mcp-Session-Id``; every later request sends it). A notification
  is answered ``202``. A request is answered with ``application/json``, or,
  for ``build_tool``, with a ``text/event-stream`` that carries its progress
  notifications, ``tools/list_changed`` and then the response.
* ``GET`` opens the session's event stream: ``tools/list_changed`` when a
  tool is built elsewhere.
* ``DELETE`` ends the session (its running builds are cancelled).

Every request must carry ``Authorization: Bearer TOKEN``; a request whose
``Host`` or ``Origin`` names anything but 127.0.0.1 or localhost is refused
(a web page of another site, a name rebound to 127.0.0.1), and the server
listens on 127.0.0.1 only.
"""

from __future__ import annotations

import hmac
import json
import queue
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ..clients.jsonrpc import PARSE_ERROR, error
from ..clients.mcp import SUPPORTED_VERSIONS
from ..config import Settings
from ..host.fsutil import load_json
from ..request import RunFlags
from .catalog import ToolCatalog
from .functions import BUILTIN_NAMES
from .mcp import ServerSession
from .stdio import InventoryWatcher

__all__ = ["McpHttpServer", "serve_http"]

#: the one path the server answers on
ENDPOINT = "/mcp"
#: the largest request body read
MAX_BODY = 4 * 1024 * 1024
#: seconds between keep-alive comments on an idle event stream
KEEPALIVE = 15.0
#: the only names a request's ``Host`` and ``Origin`` may carry (DNS rebinding gets no further)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class _Session:
    """A session over HTTP: the protocol session and its GET stream's queue."""

    def __init__(self, ident: str, server: McpHttpServer) -> None:
        self.id = ident
        self.events: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.streaming = False
        self.protocol = ServerSession(server.settings, server.catalog, notify=self._push, flags=server.flags)

    def _push(self, message: dict[str, Any]) -> None:
        if self.streaming:  # without an open GET stream, the client learns of changes at its next tools/list
            self.events.put(message)


class McpHttpServer(ThreadingHTTPServer):
    """The HTTP server: its sessions, the shared catalog, the inventory watcher."""

    daemon_threads = True

    def __init__(
        self, settings: Settings, *, port: int = 0, token: str | None = None, flags: RunFlags | None = None
    ) -> None:
        self.settings = settings
        self.flags = flags
        self.token = token or secrets.token_urlsafe(32)
        self.catalog = ToolCatalog(settings, reserved=BUILTIN_NAMES)
        self.sessions: dict[str, _Session] = {}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)
        self.watcher = InventoryWatcher(self.catalog, lambda: [s.protocol for s in list(self.sessions.values())])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{ENDPOINT}"

    def serve(self) -> None:
        self.watcher.start()
        try:
            self.serve_forever(poll_interval=0.2)
        finally:
            self.watcher.stop()
            for session in list(self.sessions.values()):
                session.events.put(None)
                session.protocol.close()
            self.catalog.close()

    def open_session(self) -> _Session:
        session = _Session(secrets.token_urlsafe(24), self)
        with self.lock:
            self.sessions[session.id] = session
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
        version = self.headers.get("MCP-Protocol-Version")
        if version and version not in SUPPORTED_VERSIONS:
            self._plain(400, f"unsupported MCP-Protocol-Version {version}; this server speaks {SUPPORTED_VERSIONS}")
            return False
        return True

    def _session(self) -> _Session | None:
        ident = self.headers.get("Mcp-Session-Id")
        if not ident:
            self._plain(400, "bad request: Mcp-Session-Id header missing (initialize first)")
            return None
        session = self.server.sessions.get(ident)
        if session is None:
            self._plain(404, "session not found: initialize again")
        return session

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
        try:
            message = load_json(self.rfile.read(length))
        except ValueError as exc:
            self._json(400, error(None, PARSE_ERROR, f"Parse error: {exc}"))
            return
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
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.send_header("Mcp-Session-Id", session.id)
                self.end_headers()
                return
            self._json(200, replies if isinstance(message, list) else replies[0], headers)
            return
        self._stream(answers, threads, headers)

    def _stream(
        self, answers: queue.SimpleQueue[dict[str, Any]], threads: list[threading.Thread], headers: dict[str, str]
    ) -> None:
        """A build's answer: an event stream of its messages until its thread ends."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.close_connection = True
        alive = True
        while True:
            done = not any(t.is_alive() for t in threads)
            try:
                item = answers.get(timeout=0.05)
            except queue.Empty:
                if done:
                    return
                continue
            if alive:
                try:
                    self.wfile.write(f"event: message\ndata: {json.dumps(item, ensure_ascii=False)}\n\n".encode())
                    self.wfile.flush()
                except OSError:
                    alive = False  # the client hung up; the build goes on (a disconnect is no cancel)

    def do_GET(self) -> None:
        if not self._allowed():
            return
        session = self._session()
        if session is None:
            return
        if "text/event-stream" not in self.headers.get("Accept", ""):
            self._plain(406, "not acceptable: GET opens an event stream (Accept: text/event-stream)")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header("Mcp-Session-Id", session.id)
        self.end_headers()
        self.close_connection = True
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
                self.wfile.write(f"event: message\ndata: {json.dumps(item, ensure_ascii=False)}\n\n".encode())
                self.wfile.flush()
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
