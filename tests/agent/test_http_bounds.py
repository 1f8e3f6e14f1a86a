"""``flakebot mcp --http`` bounds its connections before authentication (issue 33, class C; ``host/serving.py``).

Red team 33: the server kept every unauthenticated idle connection, a thread each, with no timeout. 256 sockets
that each sent half a request line (no token) used up a server's 256 descriptors: the person's authenticated
agent was refused, and ``accept`` failing with ``EMFILE`` spun the accept loop on a CPU.
"""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot_magic.agent.http import McpHttpServer
from flakebot_magic.config import Settings

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
TOKEN = "right-token"


def _authenticated(url: str, token: str, timeout: float) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps(INIT).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return int(answer.status)


def _half_open(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that each send half a request line and nothing more (no token)."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"POST /mcp HTTP/1.1\r\n")
        held.append(sock)
    return held


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(120)
def test_many_idle_strangers_never_lock_out_the_agent(mcp_env: dict[str, str]) -> None:
    """The real command, with 256 descriptors (as the red team ran it): 300 half-open connections held, then
    the agent's request is answered within its 10 s timeout, the server holds a bounded number of threads, and
    it spends no CPU while the strangers sit there (no EMFILE spin)."""
    limit = 256
    server = subprocess.Popen(
        [sys.executable, "-m", "flakebot_magic.cli", "mcp", "--http", "0"],
        stderr=subprocess.PIPE,
        env=mcp_env,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
    )
    held: list[socket.socket] = []
    try:
        assert server.stderr is not None
        url = token = ""
        while not token:
            line = server.stderr.readline().decode()
            assert line, "the server exited before it served"
            if found := re.search(r"serving (http://\S+)", line):
                url = found.group(1)
            if found := re.search(r"Bearer (\S+)", line):
                token = found.group(1)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert _authenticated(url, token, 10) == 200
        held = _half_open(port, limit + 44)
        time.sleep(1)
        threads = len(os.listdir(f"/proc/{server.pid}/task"))
        # host/serving.py's MAX_CONNECTIONS (64) handlers, the watcher, the reaper, the main thread
        assert threads <= 64 + 16, f"{threads} threads for {len(held)} idle strangers"
        cpu = _cpu_seconds(server.pid)
        started = time.monotonic()
        assert _authenticated(url, token, 10) == 200
        took = time.monotonic() - started
        time.sleep(2)  # the strangers still there: an accept loop spinning on EMFILE would burn these 2 s
        spent = _cpu_seconds(server.pid) - cpu
        assert took < 10 and spent < 1.0, f"answered in {took:.1f} s; the server spent {spent:.1f} s of CPU"
    finally:
        for sock in held:
            sock.close()
        server.terminate()
        server.wait(10)
        if server.stderr is not None:
            server.stderr.close()


@pytest.fixture
def quick_server(agent_settings: Settings) -> Iterator[McpHttpServer]:
    made = McpHttpServer(agent_settings, port=0, token=TOKEN)
    made.head_seconds = 1.0
    made.max_connections = 8
    thread = threading.Thread(target=made.serve, daemon=True)
    thread.start()
    yield made
    made.shutdown()
    thread.join(10)
    made.server_close()


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """How long until the server closed ``sock`` (a byte sent every 0.2 s meanwhile), or None."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            pass
        except OSError:
            return time.monotonic() - started
        try:
            sock.sendall(b"X")  # a slow drip: one byte of a header that never ends
        except OSError:
            return time.monotonic() - started
    return None


def test_a_request_head_dripped_slowly_is_cut_at_its_deadline(quick_server: McpHttpServer) -> None:
    sock = socket.create_connection(quick_server.server_address[:2])
    try:
        sock.sendall(b"POST /mcp HTTP/1.1\r\nX-Slow: ")
        closed = _closed_within(sock, 6)
        assert closed is not None and closed < 4, f"a dripped head was held {closed} s (its deadline: 1 s)"
    finally:
        sock.close()


def test_strangers_past_the_cap_make_room_and_the_held_count_stays_bounded(quick_server: McpHttpServer) -> None:
    port = quick_server.server_address[1]
    held = _half_open(port, 30)
    try:
        time.sleep(0.3)
        assert quick_server.held <= quick_server.max_connections
        assert _authenticated(quick_server.url, TOKEN, 5) == 200
    finally:
        for sock in held:
            sock.close()


def _status(sock: socket.socket) -> bytes:
    """One whole response read off ``sock`` (its head, then Content-Length bytes); its status line."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return head.split(b"\r\n", 1)[0]


def test_an_admitted_connection_is_never_cut_to_make_room(quick_server: McpHttpServer) -> None:
    """The agent's kept-alive connection showed the token: strangers arriving after it close strangers, not it."""
    port = quick_server.server_address[1]
    agent = socket.create_connection(("127.0.0.1", port), timeout=5)
    body = json.dumps(INIT).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    held: list[socket.socket] = []
    try:
        agent.sendall(head + body)
        assert _status(agent) == b"HTTP/1.1 200 OK"
        held = _half_open(port, 30)
        time.sleep(1.5)  # past the strangers' head deadline too
        agent.sendall(head + body)  # the same connection, kept alive
        assert _status(agent) == b"HTTP/1.1 200 OK"
    finally:
        agent.close()
        for sock in held:
            sock.close()
