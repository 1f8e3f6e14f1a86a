"""A small Streamable-HTTP gateway (loopback only) in front of one stdio MCP server, for HTTP-only clients.

It speaks the Streamable HTTP transport's plain-JSON form: ``POST /mcp`` with
one JSON-RPC message; a request is forwarded to the server's stdin and its
answer (matched by id) comes back as ``application/json``; a notification or
a response gets ``202 Accepted``. ``initialize`` answers carry an
``Mcp-Session-Id``; ``GET`` (no server-sent stream here) is ``405``;
``DELETE`` ends the session. A test double of a transport, not of MCP: every
answer comes from the real server behind it.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["gateway"]


class _Stdio:
    def __init__(self, argv: list[str], env: Mapping[str, str] | None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
        )
        self.lock = threading.Lock()

    def exchange(self, message: Any) -> Any:
        """Send one message; for a request, the server's answer to it (None for anything else)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        wants_answer = isinstance(message, dict) and "method" in message and "id" in message
        with self.lock:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
            while wants_answer:
                line = self.proc.stdout.readline()
                if not line:
                    raise ConnectionError("the MCP server exited")
                answer = json.loads(line)
                if isinstance(answer, dict) and "method" not in answer and answer.get("id") == message["id"]:
                    return answer
        return None

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextmanager
def gateway(argv: list[str], env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Serve the stdio MCP server ``argv`` at ``http://127.0.0.1:<port>/mcp``; yield that URL."""
    server = _Stdio(argv, env)
    sessions: set[str] = set()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _reply(self, status: int, body: Any = None, headers: Mapping[str, str] | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if self.path.split("?")[0] != "/mcp":
                return self._reply(404)
            try:
                message = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            except ValueError:
                return self._reply(
                    400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
                )
            session = self.headers.get("Mcp-Session-Id")
            initializing = isinstance(message, dict) and message.get("method") == "initialize"
            if not initializing and session is not None and session not in sessions:
                return self._reply(404)
            answer = server.exchange(message)
            if answer is None:
                return self._reply(202)
            headers = {}
            if initializing:
                session = secrets.token_hex(16)
                sessions.add(session)
                headers["Mcp-Session-Id"] = session
            self._reply(200, answer, headers)

        def do_GET(self) -> None:
            self._reply(405, headers={"Allow": "POST, DELETE"})

        def do_DELETE(self) -> None:
            sessions.discard(self.headers.get("Mcp-Session-Id") or "")
            self._reply(200)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, name="mcp-gateway", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/mcp"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
        server.close()
