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


@pytest.mark.parametrize("mode", ["2026-07-28", "auto", "legacy"])
def test_the_sdk_in_each_mode_calls_a_cli_tool_through_the_bridge(tmp_path: Any, mode: str) -> None:
    """The bridge speaks both eras: the SDK's modern-only client, its probing one and its handshake one."""
    from mcp import Client, StdioServerParameters

    from flakebot_magic.clients.cli_tool import CliTool

    script = tmp_path / "shout"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = --help ]; then printf "Usage: shout\\nReads standard input.\\n"; exit 0; fi\ntr a-z A-Z\n'
    )
    script.chmod(0o755)
    shout = CliTool(name="shout", binary=script, crate="shout", version="1.0.0", source_hash="0", store_path=tmp_path)
    entry = shout.mcp_config()["mcpServers"]["shout"]

    async def main() -> Any:
        params = StdioServerParameters(command=entry["command"], args=entry["args"])
        async with Client(params, mode=mode) as client:
            listed = await client.list_tools()
            called = await client.call_tool("shout", {"input": "hi"})
            return client.protocol_version, client.server_info, listed, called

    version, info, listed, called = anyio.run(main)
    assert version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    if mode != "2026-07-28":  # a client pinned to the revision sends no server/discover, so it has no identity
        assert info is not None and info.name == "shout"  # the crate (its version comes from a manifest)
    assert [t.name for t in listed.tools] == ["shout"]
    assert called.is_error is False and called.content[0].text == "HI"
