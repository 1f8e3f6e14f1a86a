"""Interop: the official ``mcp`` Python SDK (a client nobody here wrote) drives ``flakebot mcp``, in each of its modes.

The SDK's ``Client`` in mode ``2026-07-28`` (modern only: no handshake, the
envelope on every request), ``auto`` (probes ``server/discover``, falls back to
``initialize``) and ``legacy`` (the handshake, 2025-11-25), over stdio and over
Streamable HTTP (with the bearer token): it lists flakebot's functions, calls
``build_tool`` (a real build of a tiny crate of the offline registry with
cargo; no model), receives one progress notification per stage and the list
change (legacy: ``notifications/tools/list_changed``; modern: on a
``subscriptions/listen`` stream opened before the build), then finds the new
tool in ``tools/list`` and calls it. The tools' builds share one cache, so the
first builds with cargo and the others reuse its store entry (a build all the same:
search, fork, deploy, a new tool in the list).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest
from raw_client import FLAKEBOT
from tinycrates import write_registry

from flakebot_magic.records.inventory import Inventory

mcp = pytest.importorskip("mcp", reason="the mcp SDK is in the `test` extra")

pytestmark = pytest.mark.cargo

BUILTINS = {"build_tool", "search_crates", "list_tools", "tool_info"}
MODES = ("2026-07-28", "auto", "legacy")
TOKEN = "secret-token"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """One registry and one cache for the whole matrix: (registry, cache, the server's environment)."""
    root = tmp_path_factory.mktemp("sdk-matrix")
    registry = write_registry(root / "registry", ["tinyecho"])
    cache = root / "cache"
    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_BACKEND": "cargo"}
    return registry, cache, env


@pytest.fixture(scope="module")
def http_url(shared: tuple[Path, Path, dict[str, str]]) -> Iterator[str]:
    registry, _, env = shared
    server = subprocess.Popen(
        [str(FLAKEBOT), "mcp", "--registry", str(registry), "--http", "0", "--token", TOKEN],
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert server.stderr is not None
        found = re.search(rb"serving (\S+)", server.stderr.readline())
        assert found is not None
        yield found.group(1).decode()
    finally:
        server.terminate()
        server.wait(30)
        if server.stderr is not None:
            server.stderr.close()


def _connect(transport: str, mode: str, shared: Any, url: str | None, seen: list[Any], client: str) -> Any:
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    registry, _, env = shared

    async def handler(message: Any) -> None:
        seen.append(message)

    info = mcp.types.Implementation(name=client, version="1")
    if transport == "stdio":
        params = StdioServerParameters(command=str(FLAKEBOT), args=["mcp", "--registry", str(registry)], env=env)
        return Client(params, mode=mode, client_info=info, message_handler=handler), None
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
    assert url is not None
    return Client(
        streamable_http_client(url, http_client=http), mode=mode, client_info=info, message_handler=handler
    ), http


async def _drive(client: Any, name: str, seen: list[Any]) -> dict[str, Any]:
    progress: list[tuple[float, str | None]] = []
    events: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    before = await client.list_tools()
    arguments = {"request": "echo words", "crate": "tinyecho", "name": name}
    modern = client.protocol_version == "2026-07-28"
    listen: AbstractAsyncContextManager[Any] | None = client.listen(tools_list_changed=True) if modern else None
    if listen is None:
        built = await client.call_tool("build_tool", arguments, progress_callback=on_progress)
    else:
        async with listen as subscription:
            assert subscription.honored.tools_list_changed is True
            built = await client.call_tool("build_tool", arguments, progress_callback=on_progress)
            with anyio.fail_after(30):  # it came before the build's answer; iterating yields it now
                async for event in subscription:
                    events.append(event)
                    break
    after = await client.list_tools()  # as an agent asks: the cache hints must not hide the new tool
    called = await client.call_tool(name, {"words": ["from", "the", "sdk"]})
    info = await client.call_tool("tool_info", {"name": name})
    return {
        "protocol": client.protocol_version,
        "before": before,
        "built": built,
        "after": after,
        "called": called,
        "info": info,
        "progress": progress,
        "events": events,
        "notes": list(seen),
    }


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("mode", MODES)
def test_the_sdk_in_each_mode_builds_a_tool_and_calls_it(
    mode: str, transport: str, shared: Any, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("http_url") if transport == "http" else None
    name = f"te_{transport}_{mode.replace('-', '')}"
    client_name = f"sdk-{transport}-{mode}"
    seen: list[Any] = []

    async def main() -> dict[str, Any]:
        client, http = _connect(transport, mode, shared, url, seen, client_name)
        if http is None:
            async with client:
                return await _drive(client, name, seen)
        async with http, client:
            return await _drive(client, name, seen)

    result = anyio.run(main)
    assert result["protocol"] == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    before = {t.name for t in result["before"].tools}
    assert before >= BUILTINS and name not in before
    built = result["built"]
    assert built.is_error is False, built.content[0].text
    assert f"Built `{name}`" in built.content[0].text
    assert built.structured_content["functions"] == [name]
    assert built.structured_content["requested_by"] == client_name  # the per-request clientInfo too
    stages = [re.match(r"(\w+) ", m or "").group(1) for _, m in result["progress"]]  # type: ignore[union-attr]
    assert {"search", "fork", "deploy", "client"} <= set(stages), result["progress"]
    if mode == "legacy":
        notes = [type(getattr(m, "root", m)).__name__ for m in result["notes"]]
        assert "ToolListChangedNotification" in notes, notes
    else:
        assert [type(e).__name__ for e in result["events"]] == ["ToolsListChanged"]
    after = {t.name: t for t in result["after"].tools}
    assert name in after and "words" in after[name].input_schema["properties"]
    assert result["called"].content[0].text == "from the sdk\n"
    assert f"requested_by: {client_name}" in result["info"].content[0].text
    _, cache, _ = shared
    record = Inventory(cache / "tools").get(name)
    assert record is not None and record.requested_by == client_name
