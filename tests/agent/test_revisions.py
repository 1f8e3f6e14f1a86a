"""``flakebot mcp`` spoken to as raw JSON-RPC in both MCP eras: what 2026-07-28 says each answer is, exactly.

Over stdio (one process serves both eras, a request at a time) and over
Streamable HTTP (the routing headers, the statuses, and the checks that come
before anything else: the token, ``Origin``, ``Host``). The SDK and the
conformance suite judge the same server elsewhere (test_agent_with_mcp_sdk.py,
tests/interop/test_conformance_requirements.py); these name each rule.
"""

from __future__ import annotations

import base64
import http.client as http_client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from raw_client import Client

from flakebot_magic.agent.http import McpHttpServer
from flakebot_magic.clients.revisions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    PROTOCOL_VERSION_KEY,
    SERVED_VERSIONS,
    SERVER_INFO_KEY,
    SUBSCRIPTION_ID_KEY,
)
from flakebot_magic.config import Settings

MODERN = "2026-07-28"
ENVELOPE = {PROTOCOL_VERSION_KEY: MODERN, CLIENT_CAPABILITIES_KEY: {}, CLIENT_INFO_KEY: {"name": "raw", "version": "1"}}


def _meta(**changes: Any) -> dict[str, Any]:
    meta = dict(ENVELOPE)
    for key, value in changes.items():
        full = {"version": PROTOCOL_VERSION_KEY, "caps": CLIENT_CAPABILITIES_KEY, "info": CLIENT_INFO_KEY}[key]
        if value is None:
            meta.pop(full)
        else:
            meta[full] = value
    return {"_meta": meta}


@pytest.fixture
def stdio(client: Any) -> Client:
    made: Client = client()
    return made


# -- stdio -------------------------------------------------------------------------


def test_server_discover_says_what_is_served(stdio: Client) -> None:
    result = stdio.request("server/discover", _meta())["result"]
    assert result["supportedVersions"] == list(SERVED_VERSIONS) and result["supportedVersions"][0] == MODERN
    assert result["capabilities"] == {"tools": {"listChanged": True}}
    assert result["resultType"] == "complete" and result["cacheScope"] == "private" and result["ttlMs"] >= 0
    assert result["_meta"][SERVER_INFO_KEY]["name"] == "flakebot" and "build_tool" in result["instructions"]
    # clientInfo is a SHOULD: a request without it is served
    assert stdio.request("server/discover", _meta(info=None))["result"]["resultType"] == "complete"


@pytest.mark.parametrize(
    "params",
    [{}, {"_meta": {}}, {"_meta": "text"}, _meta(version=None), _meta(caps=None), _meta(caps=[1]), _meta(version=7)],
    ids=["no-meta", "empty-meta", "meta-not-object", "no-version", "no-capabilities", "capabilities-list", "version-7"],
)
def test_a_request_without_its_envelope_is_invalid_params(stdio: Client, params: dict[str, Any]) -> None:
    """Methods only 2026-07-28 has need the envelope; any request that names a version in ``_meta`` is held to it
    (one that names none is the handshake era's, served as before 2026-07-28)."""
    enveloped = PROTOCOL_VERSION_KEY in (params.get("_meta") or {})
    for method in ("server/discover", "subscriptions/listen", *(("tools/list", "tools/call") if enveloped else ())):
        answer = stdio.request(method, params)
        assert answer["error"]["code"] == -32602, (method, answer)
        assert answer["id"] == stdio.ident  # every error names the request it answers


@pytest.mark.parametrize("version", ["1999-01-01", "v999.0.0", "2025-11-25", "2026-07-29", ""])
def test_an_unserved_version_is_the_unsupported_version_error_with_the_served_list(stdio: Client, version: str) -> None:
    answer = stdio.request("tools/list", _meta(version=version))
    assert answer["error"]["code"] == -32022 and answer["id"] == stdio.ident
    assert answer["error"]["data"] == {"supported": list(SERVED_VERSIONS), "requested": version}


@pytest.mark.parametrize("method", ["ping", "logging/setLevel", "resources/subscribe", "resources/list", "no/such"])
def test_methods_the_revision_removed_or_never_had_are_method_not_found(stdio: Client, method: str) -> None:
    answer = stdio.request(method, _meta())
    assert answer["error"]["code"] == -32601 and answer["id"] == stdio.ident


def test_stateless_lists_and_calls_carry_the_revisions_fields(stdio: Client) -> None:
    listed = stdio.request("tools/list", _meta())["result"]
    assert {t["name"] for t in listed["tools"]} >= {"build_tool", "search_crates", "list_tools", "tool_info"}
    assert listed["resultType"] == "complete" and listed["ttlMs"] == 0 and listed["cacheScope"] == "private"
    assert listed["_meta"][SERVER_INFO_KEY]["name"] == "flakebot"
    called = stdio.request("tools/call", {**_meta(), "name": "list_tools", "arguments": {}})["result"]
    assert called["resultType"] == "complete" and called["isError"] is False
    assert called["_meta"][SERVER_INFO_KEY]["name"] == "flakebot"
    bad = stdio.request("tools/call", {**_meta(), "name": "build_tool", "arguments": {"request": 3}})["result"]
    assert bad["isError"] is True and bad["resultType"] == "complete"  # a tool error is a result
    assert stdio.request("tools/call", {**_meta(), "name": "ghost", "arguments": {}})["error"]["code"] == -32602


def test_one_process_serves_both_eras(stdio: Client) -> None:
    listed = stdio.request("tools/list")["result"]  # neither envelope nor handshake: the legacy era, as before
    assert "tools" in listed and "resultType" not in listed
    assert stdio.request("ping")["result"] == {}
    stdio.initialize()
    assert "resultType" not in stdio.request("tools/list")["result"]  # the handshake's session
    assert stdio.request("tools/list", _meta())["result"]["resultType"] == "complete"  # and stateless, beside it
    assert stdio.request("ping", _meta())["error"]["code"] == -32601  # removed in 2026-07-28


@pytest.mark.parametrize(
    ("asked", "answered"), [("2025-06-18", "2025-06-18"), ("2024-11-05", "2024-11-05"), (MODERN, "2025-11-25")]
)
def test_the_handshake_answers_a_handshake_revision(client: Any, asked: str, answered: str) -> None:
    mcp = client()
    result = mcp.request(
        "initialize", {"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "h", "version": "0"}}
    )["result"]
    assert result["protocolVersion"] == answered and "resultType" not in result


def test_a_listen_stream_is_acknowledged_first_and_ends_on_cancel(stdio: Client) -> None:
    stdio.send(
        {
            "id": "sub-1",
            "method": "subscriptions/listen",
            "params": {
                **_meta(),
                "notifications": {
                    "toolsListChanged": True,
                    "promptsListChanged": True,
                    "resourceSubscriptions": ["file:///x"],
                },
            },
        }
    )
    ack = stdio.read(10)
    assert ack == {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"_meta": {SUBSCRIPTION_ID_KEY: "sub-1"}, "notifications": {"toolsListChanged": True}},
    }  # only what flakebot honors: it has no prompts or resources
    stdio.send({"method": "notifications/cancelled", "params": {"requestId": "sub-1"}})
    assert stdio.request("tools/list", _meta())["result"]["resultType"] == "complete"
    assert not [m for m in stdio.notes if m.get("id") == "sub-1"]  # a cancelled request gets no response
    refused = stdio.request("subscriptions/listen", {**_meta(), "notifications": "all"})
    assert refused["error"]["code"] == -32602


def test_a_line_longer_than_the_cap_is_an_error_and_the_next_line_is_served(stdio: Client) -> None:
    """Before: the stdio server read a 300 MiB line without a newline into memory (HTTP's cap is 4 MiB)."""
    assert stdio.proc.stdin is not None
    stdio.proc.stdin.write(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"' + b"y" * (5 << 20) + b'"}}\n'
    )
    stdio.proc.stdin.flush()
    answer = stdio.read(30)
    assert answer is not None and answer["id"] is None and answer["error"]["code"] == -32600
    assert "4,194,304 bytes" in answer["error"]["message"]
    assert stdio.request("server/discover", _meta())["result"]["resultType"] == "complete"


# -- Streamable HTTP ------------------------------------------------------------------


@pytest.fixture
def server(agent_settings: Settings) -> Iterator[McpHttpServer]:
    made = McpHttpServer(agent_settings, port=0, token="right-token")
    thread = threading.Thread(target=made.serve, daemon=True)
    thread.start()
    yield made
    made.shutdown()
    thread.join(10)
    made.server_close()


def _headers(method: str, name: str | None = None, version: str = MODERN) -> dict[str, str]:
    headers = {"Authorization": "Bearer right-token", "MCP-Protocol-Version": version, "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    return headers


def _post(http: httpx.Client, url: str, method: str, params: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return http.post(url, json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params}, headers=headers)


def test_stateless_errors_over_http_have_the_revisions_statuses(server: McpHttpServer) -> None:
    with httpx.Client(trust_env=False) as http:
        ok = _post(http, server.url, "server/discover", _meta(), _headers("server/discover"))
        assert ok.status_code == 200 and ok.json()["result"]["supportedVersions"][0] == MODERN
        assert "Mcp-Session-Id" not in ok.headers  # stateless: no session minted
        cases = [
            ("tools/list", {}, _headers("tools/list"), 400, -32602),
            ("tools/list", _meta(version="v999"), _headers("tools/list", version="v999"), 400, -32022),
            ("tools/list", _meta(version="v999"), _headers("tools/list"), 400, -32020),  # header and body differ
            ("tools/list", _meta(), _headers("prompts/list"), 400, -32020),
            ("tools/list", _meta(), _headers("TOOLS/LIST"), 400, -32020),  # values are case-sensitive
            ("tools/call", {**_meta(), "name": "list_tools"}, _headers("tools/call"), 400, -32020),  # no Mcp-Name
            ("tools/call", {**_meta(), "name": "list_tools"}, _headers("tools/call", "other"), 400, -32020),
            ("ping", _meta(), _headers("ping"), 404, -32601),
            ("initialize", _meta(), _headers("initialize"), 404, -32601),
        ]
        for method, params, headers, status, code in cases:
            answer = _post(http, server.url, method, params, headers)
            assert (answer.status_code, answer.json()["error"]["code"], answer.json()["id"]) == (status, code, 7), (
                method,
                headers,
                answer.text,
            )
        encoded = "=?base64?" + base64.b64encode(b"list_tools").decode() + "?="
        called = _post(
            http, server.url, "tools/call", {**_meta(), "name": "list_tools"}, _headers("tools/call", encoded)
        )
        assert called.status_code == 200 and called.json()["result"]["resultType"] == "complete"  # base64 decoded
        # spaces around a value are no part of it (RFC 9110); httpx refuses to send them, http.client does
        raw = http_client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {**_meta(), "name": "list_tools"}}
        )
        raw.request(
            "POST", "/mcp", body, {**_headers("tools/call", "  list_tools  "), "Content-Type": "application/json"}
        )
        spaced = raw.getresponse()
        assert spaced.status == 200 and json.loads(spaced.read())["result"]["resultType"] == "complete"
        raw.close()
        twice = [(k, v) for k, v in _headers("tools/list").items()] + [("Mcp-Method", "tools/list")]
        answer = http.post(
            server.url, json={"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": _meta()}, headers=twice
        )
        assert answer.status_code == 400 and answer.json()["error"]["code"] == -32020
        note = http.post(
            server.url,
            json={"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}},
            headers=_headers("notifications/cancelled"),
        )
        assert note.status_code == 202


@pytest.mark.parametrize("era", ["stateless", "handshake"])
def test_the_token_origin_and_host_are_checked_before_either_era(server: McpHttpServer, era: str) -> None:
    if era == "stateless":
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": _meta()}
        base = _headers("server/discover")
    else:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t"}},
        }
        base = {"Authorization": "Bearer right-token"}
    with httpx.Client(trust_env=False) as http:
        assert http.post(server.url, json=body, headers=base).status_code == 200
        without = {k: v for k, v in base.items() if k != "Authorization"}
        assert http.post(server.url, json=body, headers=without).status_code == 401
        assert http.post(server.url, json=body, headers={**base, "Authorization": "Bearer wrong"}).status_code == 401
        assert http.post(server.url, json=body, headers={**base, "Origin": "https://evil.example"}).status_code == 403
        assert http.post(server.url, json=body, headers={**base, "Host": "evil.example:80"}).status_code == 403
        big = {**body, "params": {**body["params"], "pad": "x" * (5 << 20)}}
        assert http.post(server.url, json=big, headers=base).status_code == 413


def test_a_listen_stream_over_http_hears_of_a_tool_built_elsewhere(
    server: McpHttpServer, agent_settings: Settings
) -> None:
    """The stream stays open: acknowledgment first, then the list change when the inventory changes."""
    from flakebot_magic.records.inventory import Inventory, ToolRecord

    params = {**_meta(), "notifications": {"toolsListChanged": True}}
    body = {"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen", "params": params}
    lines: list[str] = []
    with (
        httpx.Client(trust_env=False, timeout=30) as http,
        http.stream("POST", server.url, json=body, headers=_headers("subscriptions/listen")) as stream,
    ):
        assert stream.status_code == 200 and stream.headers["content-type"] == "text/event-stream"
        for line in stream.iter_lines():
            if line.startswith("data:"):
                lines.append(line)
                if len(lines) == 1:  # acknowledged: now a tool appears in the inventory, as a build anywhere adds one
                    record = ToolRecord(
                        name="elsewhere",
                        crate="c",
                        version="1",
                        binary="/bin/true",
                        store_path="/x",
                        source_hash="h",
                        checksum="",
                        checksum_kind="",
                        registry="",
                        workspace="",
                        commit="",
                    )
                    Inventory(agent_settings.cache.tools).save(record)
                else:
                    break
    assert '"notifications/subscriptions/acknowledged"' in lines[0]
    assert '"notifications/tools/list_changed"' in lines[1] and '"listen-1"' in lines[1]


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_300_mib_line_without_a_newline_is_never_held(stdio: Client) -> None:
    """Before: ``flakebot mcp`` over stdio read the whole line into memory (300 MiB and more); now it holds at most
    the cap (4 MiB), answers one error, and serves the next line."""
    assert stdio.request("ping")["result"] == {}  # started and serving
    before = _peak_rss_mib(stdio.proc.pid)
    assert stdio.proc.stdin is not None
    chunk = b"x" * (1 << 20)
    stdio.proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"')
    for _ in range(300):
        stdio.proc.stdin.write(chunk)
    stdio.proc.stdin.write(b'"}}\n')
    stdio.proc.stdin.flush()
    answer = stdio.read(120)
    assert answer is not None and answer["id"] is None and answer["error"]["code"] == -32600
    assert stdio.request("ping")["result"] == {}
    grown = _peak_rss_mib(stdio.proc.pid) - before
    assert grown < 64, f"the server's peak memory grew by {grown:.0f} MiB reading a 300 MiB line"


@pytest.mark.cargo
def test_closing_a_stateless_builds_stream_cancels_it(server: McpHttpServer, agent_cache: Path) -> None:
    """2026-07-28: closing the request's stream is its cancellation (before, a disconnect left the build running)."""
    from polling import wait_for
    from tinycrates import processes_in

    from flakebot_magic.records.inventory import Inventory

    params = {**_meta(), "name": "build_tool", "arguments": {"request": "", "crate": "slowbuild", "name": "slow"}}
    body = {"jsonrpc": "2.0", "id": "b-1", "method": "tools/call", "params": params}
    workspace = agent_cache / "workspaces" / "slow"
    with (
        httpx.Client(trust_env=False, timeout=300) as http,
        http.stream("POST", server.url, json=body, headers=_headers("tools/call", "build_tool")) as stream,
    ):
        assert stream.status_code == 200 and stream.headers["content-type"] == "text/event-stream"
        wait_for((workspace / "build-script-started").exists, 120, "the build script to start")
    # the client closed the stream: the build stops as on Cancel, its workspace kept, no tool
    wait_for(lambda: not processes_in(workspace, settle=0.2), 30, "cargo to stop after the stream closed")
    log = agent_cache / "logs" / "slow.cancelled.log"
    wait_for(log.exists, 30, "the cancelled run's log")
    assert workspace.is_dir() and Inventory(agent_cache / "tools").get("slow") is None
