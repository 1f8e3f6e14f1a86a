"""Interop: the official ``mcp`` Python SDK (a client nobody here wrote) drives ``flakebot mcp``.

Over stdio and over Streamable HTTP it lists flakebot's functions, calls
``build_tool`` (a real build of a tiny crate with cargo), receives one
progress notification per stage and ``tools/list_changed``, then finds the
new tool in ``tools/list`` and calls it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import FLAKEBOT

from flakebot_magic.records.inventory import Inventory

mcp = pytest.importorskip("mcp", reason="the mcp SDK is in the `test` extra")

pytestmark = pytest.mark.cargo

BUILTINS = {"build_tool", "search_crates", "list_tools", "tool_info"}


def _field(model: Any, snake: str, camel: str) -> Any:
    """SDK 2.x names fields in snake case, 1.x as on the wire."""
    return getattr(model, snake) if hasattr(model, snake) else getattr(model, camel)


async def _drive(session: Any, seen: list[Any]) -> dict[str, Any]:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    before = await session.list_tools()
    built = await session.call_tool(
        "build_tool",
        {"request": "echo words", "crate": "tinyecho", "name": "te"},
        progress_callback=on_progress,
    )
    after = await session.list_tools()
    called = await session.call_tool("te", {"words": ["from", "the", "sdk"]})
    info = await session.call_tool("tool_info", {"name": "te"})
    return {"before": before, "built": built, "after": after, "called": called, "info": info, "progress": progress}


def _check(result: dict[str, Any], seen: list[Any], cache: Path, client: str) -> None:
    assert {t.name for t in result["before"].tools} == BUILTINS
    built = result["built"]
    assert _field(built, "is_error", "isError") is False, built.content[0].text
    assert "Built `te`" in built.content[0].text
    assert _field(built, "structured_content", "structuredContent")["functions"] == ["te"]
    messages = [m for _, m in result["progress"]]
    assert [v for v, _ in result["progress"]] == sorted(v for v, _ in result["progress"])
    stages = [re.match(r"(\w+) ", m or "").group(1) for m in messages]  # type: ignore[union-attr]
    assert {"search", "fork", "build", "test", "deploy", "client"} <= set(stages), messages
    assert any("ToolListChangedNotification" in type(getattr(m, "root", m)).__name__ for m in seen), seen
    after = {t.name: t for t in result["after"].tools}
    assert set(after) == BUILTINS | {"te"}
    assert "words" in _field(after["te"], "input_schema", "inputSchema")["properties"]
    assert result["called"].content[0].text == "from the sdk\n"
    assert "requested_by: " + client in result["info"].content[0].text
    record = Inventory(cache / "tools").get("te")
    assert record is not None and record.requested_by == client


def test_the_sdk_builds_a_tool_over_stdio_and_calls_it(
    tiny_registry: Path, agent_cache: Path, mcp_env: dict[str, str]
) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    seen: list[Any] = []

    async def handler(message: Any) -> None:
        seen.append(message)

    async def main() -> dict[str, Any]:
        params = StdioServerParameters(
            command=str(FLAKEBOT), args=["mcp", "--registry", str(tiny_registry)], env=mcp_env
        )
        async with (
            stdio_client(params) as (read, write),
            ClientSession(
                read,
                write,
                message_handler=handler,
                client_info=mcp.types.Implementation(name="sdk-stdio", version="1"),
            ) as session,
        ):
            await session.initialize()
            return await _drive(session, seen)

    result = anyio.run(main)
    _check(result, seen, agent_cache, "sdk-stdio")


def test_the_sdk_builds_a_tool_over_streamable_http(
    tiny_registry: Path, agent_cache: Path, mcp_env: dict[str, str]
) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    server = subprocess.Popen(
        [str(FLAKEBOT), "mcp", "--registry", str(tiny_registry), "--http", "0", "--token", "secret-token"],
        stderr=subprocess.PIPE,
        env=mcp_env,
    )
    try:
        assert server.stderr is not None
        url = re.search(rb"serving (\S+)", server.stderr.readline())
        assert url is not None
        seen: list[Any] = []

        async def handler(message: Any) -> None:
            seen.append(message)

        async def main() -> dict[str, Any]:
            http = create_mcp_http_client(headers={"Authorization": "Bearer secret-token"})
            async with http, streamable_http_client(url.group(1).decode(), http_client=http) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(
                    read,
                    write,
                    message_handler=handler,
                    client_info=mcp.types.Implementation(name="sdk-http", version="1"),
                ) as session:
                    await session.initialize()
                    return await _drive(session, seen)

        result = anyio.run(main)
        _check(result, seen, agent_cache, "sdk-http")
    finally:
        server.terminate()
        server.wait(10)
        if server.stderr is not None:
            server.stderr.close()
