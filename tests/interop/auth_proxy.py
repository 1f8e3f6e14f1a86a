"""A loopback HTTP proxy that adds ``Authorization: Bearer TOKEN`` to every request, for clients that send no headers.

The MCP conformance suite's server scenarios take a URL and nothing else;
``flakebot mcp --http`` refuses a request without its bearer token. This
proxy stands between them and changes nothing else: the method, the path,
the body and every header the client sent (``Host`` and ``Origin`` too) go
to the server as they came, and the server's answer (JSON, or an event stream
passed on as it arrives) comes back as it was sent. A test double of a
client's setting, not of MCP: every answer comes from the real server.
"""

from __future__ import annotations

import http.client
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["bearer_proxy"]

#: hop-by-hop headers: about one connection, never passed on
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that reset an idle connection at its exit (the suite's node process) is no error here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def bearer_proxy(upstream: str, token: str) -> Iterator[str]:
    """Serve ``upstream`` (``http://127.0.0.1:PORT/mcp``) with the token added; yield the proxy's URL."""
    target = urlsplit(upstream)
    assert target.hostname == "127.0.0.1" and target.port is not None, upstream

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            connection = http.client.HTTPConnection("127.0.0.1", target.port, timeout=300)
            try:
                connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for key, value in self.headers.items():
                    if key.lower() not in _HOP and key.lower() != "authorization":
                        connection.putheader(key, value)
                connection.putheader("Authorization", f"Bearer {token}")
                connection.endheaders(body)
                answer = connection.getresponse()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                known = answer.getheader("Content-Length")
                if known is not None:
                    data = answer.read()
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                # an event stream: pass each piece on as it comes, until the server closes it
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                while piece := answer.read1(65536):
                    self.wfile.write(piece)
                    self.wfile.flush()
            except OSError:
                self.close_connection = True  # either side hung up
            finally:
                connection.close()

        do_GET = do_POST = do_DELETE = _forward

    proxy = _QuietServer(("127.0.0.1", 0), Handler)
    proxy.daemon_threads = True
    thread = threading.Thread(target=proxy.serve_forever, name="bearer-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}{target.path}"
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(timeout=5)
