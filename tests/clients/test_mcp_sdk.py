"""Interop: the official ``mcp`` Python SDK's stdio client lists and calls tools flakebot built."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from flakebot_magic.testing.overlay import fixture_crates_buildable

mcp = pytest.importorskip("mcp", reason="the mcp SDK is in the `test` extra")

pytestmark = pytest.mark.cargo


def _field(model: Any, snake: str, camel: str) -> Any:
    """SDK 2.x names fields in snake case, 1.x as on the wire."""
    return getattr(model, snake) if hasattr(model, snake) else getattr(model, camel)


async def _session(entry: dict[str, Any], work: Any) -> Any:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=entry.get("env") or None)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await work(session)


@pytest.mark.skipif(not fixture_crates_buildable(), reason="needs serde_json and tiny_http: run `make install`")
def test_the_sdk_lists_and_calls_the_mcp_tool_flakebot_built(calc: Any) -> None:
    entry = calc.mcp_config()["mcpServers"]["calc"]

    async def work(session: Any) -> Any:
        listed = await session.list_tools()
        added = await session.call_tool("add", {"a": 2, "b": 40})
        failed = await session.call_tool("fail", {"message": "no"})
        return listed, added, failed

    listed, added, failed = anyio.run(_session, entry, work)
    tools = {t.name: t for t in listed.tools}
    assert set(tools) == {"add", "echo", "fail", "pid", "crash", "sleep"}
    assert _field(tools["add"], "input_schema", "inputSchema")["required"] == ["a", "b"]
    assert _field(added, "is_error", "isError") is False
    assert _field(added, "structured_content", "structuredContent") == {"sum": 42.0}
    assert _field(failed, "is_error", "isError") is True and failed.content[0].text == "no"


def test_the_sdk_calls_a_cli_tool_through_the_bridge(tmp_path: Any) -> None:
    from flakebot_magic.clients.cli_tool import CliTool

    script = tmp_path / "shout"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --help ]; then printf "Usage: shout [OPTIONS]\\nReads standard input.\\n\\nOptions:\\n'
        '  -e, --exclaim  add a bang\\n"; exit 0; fi\n'
        'tr a-z A-Z; if [ "$1" = --exclaim ]; then printf "!"; fi\n'
    )
    script.chmod(0o755)
    shout = CliTool(name="shout", binary=script, crate="shout", version="1.0.0", source_hash="0", store_path=tmp_path)
    entry = shout.mcp_config()["mcpServers"]["shout"]

    async def work(session: Any) -> Any:
        listed = await session.list_tools()
        called = await session.call_tool("shout", {"input": "hi", "exclaim": True})
        return listed, called

    listed, called = anyio.run(_session, entry, work)
    (tool,) = listed.tools
    assert tool.name == "shout" and set(_field(tool, "input_schema", "inputSchema")["properties"]) == {
        "exclaim",
        "input",
        "args",
    }
    assert _field(called, "is_error", "isError") is False and called.content[0].text == "HI!"
