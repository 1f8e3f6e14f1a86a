"""``flakebot mcp --http``: only 127.0.0.1, only with the token, never for another site's page, sessions kept apart."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flakebot_magic.agent.http import McpHttpServer
from flakebot_magic.config import Settings

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}


@pytest.fixture
def server(agent_settings: Settings) -> Iterator[McpHttpServer]:
    made = McpHttpServer(agent_settings, port=0, token="right-token")
    thread = threading.Thread(target=made.serve, daemon=True)
    thread.start()
    yield made
    made.shutdown()
    thread.join(10)
    made.server_close()


def test_it_listens_on_loopback_only(server: McpHttpServer) -> None:
    assert server.server_address[0] == "127.0.0.1"


def test_requests_without_the_token_or_from_other_sites_are_refused(server: McpHttpServer) -> None:
    with httpx.Client(trust_env=False) as http:
        assert http.post(server.url, json=INIT).status_code == 401
        wrong = http.post(server.url, json=INIT, headers={"Authorization": "Bearer wrong"})
        assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"] == "Bearer"
        page = {"Authorization": "Bearer right-token", "Origin": "https://evil.example"}
        assert http.post(server.url, json=INIT, headers=page).status_code == 403
        # DNS rebinding without an Origin (a plain GET from a page): the Host names another site
        rebound = http.get(server.url, headers={"Authorization": "Bearer right-token", "Host": "evil.example:8080"})
        assert rebound.status_code == 403 and "Host" in rebound.text
        for name in ("localhost", "[::1]"):
            host = {"Authorization": "Bearer right-token", "Host": f"{name}:{server.server_address[1]}"}
            assert http.post(server.url, json=INIT, headers=host).status_code == 200
        assert http.post(server.url.replace("/mcp", "/other"), json=INIT).status_code == 404


def test_sessions(server: McpHttpServer) -> None:
    auth = {"Authorization": "Bearer right-token", "Accept": "application/json, text/event-stream"}
    with httpx.Client(trust_env=False, headers=auth) as http:
        opened = http.post(server.url, json=INIT, headers={"Origin": "http://localhost:6274"})
        assert opened.status_code == 200 and opened.json()["result"]["serverInfo"]["name"] == "flakebot"
        session = {"Mcp-Session-Id": opened.headers["Mcp-Session-Id"]}
        note = http.post(server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        assert note.status_code == 202
        listed = http.post(server.url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=session)
        assert {t["name"] for t in listed.json()["result"]["tools"]} >= {"build_tool", "tool_info"}
        assert http.post(server.url, json={"jsonrpc": "2.0", "id": 3, "method": "ping"}).status_code == 400
        unknown = {"Mcp-Session-Id": "not-a-session"}
        assert (
            http.post(server.url, json={"jsonrpc": "2.0", "id": 3, "method": "ping"}, headers=unknown).status_code
            == 404
        )
        bad_version = {**session, "MCP-Protocol-Version": "1999-01-01"}
        assert (
            http.post(server.url, json={"jsonrpc": "2.0", "id": 4, "method": "ping"}, headers=bad_version).status_code
            == 400
        )
        assert http.delete(server.url, headers=session).status_code == 200
        assert (
            http.post(server.url, json={"jsonrpc": "2.0", "id": 5, "method": "ping"}, headers=session).status_code
            == 404
        )


def test_a_settings_cache_is_used(server: McpHttpServer, agent_settings: Settings) -> None:
    assert server.catalog.inventory.dir == Path(agent_settings.cache.tools)


@pytest.mark.parametrize("length", ["abc", "-1", "1e3", " 12", "+5", "9" * 40])
def test_a_content_length_that_is_no_count_of_bytes_is_refused_and_never_read_to_the_end(
    server: McpHttpServer, length: str
) -> None:
    """``-1`` was read to the end of the stream (no cap at all), ``abc`` ended the handler with a traceback."""
    import socket

    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as conn:
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer right-token\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )
        conn.sendall(head.encode() + b"[" * 1000)  # the stream stays open: a reader to the end would wait
        answer = conn.recv(4096).decode("latin-1")
    assert answer.startswith(("HTTP/1.0 400", "HTTP/1.1 400", "HTTP/1.0 413", "HTTP/1.1 413")), answer[:200]
