"""The agent limits bound a ``flakebot mcp --http`` process, whatever the sessions (issue 33's second red team, r01).

The invariant: across every way an agent may reach the server at once (new legacy handshakes, stateless
2026-07-28 requests, both mixed), no more than ``agent_max_builds`` builds are started, and each one past it is
refused naming the setting. The sessions a server holds are bounded too: a flood of handshakes ends the least
recently used idle ones, never one with a build running or a client listening.

Builds name a crate the registry does not have: each is counted when it starts and ends at once (no cargo).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from flakebot_magic.agent.http import MAX_SESSIONS, McpHttpServer
from flakebot_magic.clients.revisions import CLIENT_CAPABILITIES_KEY, CLIENT_INFO_KEY, PROTOCOL_VERSION_KEY
from flakebot_magic.config import Settings

MODERN = "2026-07-28"
TOKEN = "right-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "agent", "version": "1"}},
}
LIMIT = 2


@pytest.fixture
def server(agent_settings: Settings) -> Iterator[McpHttpServer]:
    made = McpHttpServer(replace(agent_settings, agent_max_builds=LIMIT), port=0, token=TOKEN)
    thread = threading.Thread(target=made.serve, daemon=True)
    thread.start()
    yield made
    made.shutdown()
    thread.join(10)
    made.server_close()


def _handshake(http: httpx.Client, url: str) -> str:
    answer = http.post(url, json=INIT, headers=AUTH)
    assert answer.status_code == 200, answer.text
    ident = answer.headers["Mcp-Session-Id"]
    http.post(
        url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers={**AUTH, "Mcp-Session-Id": ident}
    )
    return ident


def _arguments(n: int) -> dict[str, Any]:
    return {"request": "x", "crate": "nosuchcrate", "name": f"t{n}"}


def _legacy_build(http: httpx.Client, url: str, ident: str, n: int) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {"name": "build_tool", "arguments": _arguments(n)},
    }
    return http.post(url, json=body, headers={**AUTH, "Mcp-Session-Id": ident}, timeout=120).text


def _stateless_build(http: httpx.Client, url: str, n: int) -> str:
    meta = {
        PROTOCOL_VERSION_KEY: MODERN,
        CLIENT_CAPABILITIES_KEY: {},
        CLIENT_INFO_KEY: {"name": "agent", "version": "1"},
    }
    body = {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {"_meta": meta, "name": "build_tool", "arguments": _arguments(n)},
    }
    headers = {**AUTH, "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "build_tool"}
    return http.post(url, json=body, headers=headers, timeout=120).text


#: how an agent reaches the server for each of its builds
DOORS = {
    "a new legacy session per build": lambda http, url, n: _legacy_build(http, url, _handshake(http, url), n),
    "stateless requests": _stateless_build,
}


@pytest.mark.parametrize(
    "pattern",
    [
        ("a new legacy session per build",) * 5,
        ("stateless requests",) * 5,
        *itertools.islice(itertools.product(DOORS, repeat=4), 0, 16, 5),  # mixes of both doors
    ],
    ids=lambda p: " / ".join(p),
)
def test_no_pattern_of_sessions_passes_the_servers_build_limit(server: McpHttpServer, pattern: tuple[str, ...]) -> None:
    with httpx.Client(trust_env=False) as http:
        answers = [DOORS[door](http, server.url, n) for n, door in enumerate(pattern, start=10)]
    refused = [a for a in answers if "agent_max_builds" in a]
    assert len(answers) - len(refused) == LIMIT, answers  # the first LIMIT builds ran (and failed: no such crate)
    assert all("nosuchcrate" in a or "no crate" in a.lower() for a in answers[:LIMIT]), answers[:LIMIT]
    assert server.budget.builds == LIMIT


def test_concurrent_handshakes_and_builds_start_at_most_the_limit(server: McpHttpServer) -> None:
    results: list[str] = []

    def agent(n: int) -> None:
        with httpx.Client(trust_env=False) as http:
            results.append(DOORS[list(DOORS)[n % 2]](http, server.url, n))

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == 8
    assert sum("agent_max_builds" not in r for r in results) == LIMIT, results


def test_a_flood_of_handshakes_keeps_the_sessions_bounded_and_ends_idle_ones_first(server: McpHttpServer) -> None:
    with httpx.Client(trust_env=False) as http:
        first = _handshake(http, server.url)
        listened = _handshake(http, server.url)
        server.sessions[listened].streaming = True  # a client listening on its GET stream
        for _ in range(3 * MAX_SESSIONS):
            _handshake(http, server.url)
        assert len(server.sessions) <= MAX_SESSIONS
        assert listened in server.sessions  # never ended to make room
        gone = http.post(
            server.url,
            json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
            headers={**AUTH, "Mcp-Session-Id": first},
        )
        assert gone.status_code == 404  # the transport's answer: initialize again
        server.sessions[listened].streaming = False
