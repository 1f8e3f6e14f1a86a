"""The official ``mcp`` Python SDK: stdio and Streamable HTTP, in this process and inside a real kernel."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from typing import Any

import anyio
import pytest
from interop_tools import needs_fixture_crates
from mcp_gateway import gateway

mcp = pytest.importorskip("mcp", reason="the mcp SDK is in the `test` extra")


def _field(model: Any, snake: str, camel: str) -> Any:
    return getattr(model, snake) if hasattr(model, snake) else getattr(model, camel)


async def _stdio(entry: dict[str, Any], work: Any) -> Any:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=entry["command"], args=entry["args"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        initialized = await session.initialize()
        return initialized, await work(session)


def test_the_sdk_sees_the_bridge_s_server_info_schemas_and_null_rule(shout: Any) -> None:
    entry = shout.mcp_config()["mcpServers"]["shout"]

    async def work(session: Any) -> Any:
        listed = await session.list_tools()
        nulls = await session.call_tool("shout", {"input": "hi", "exclaim": None})
        extra = await session.call_tool("shout", {"input": "hi", "volume": 11})
        return listed, nulls, extra

    initialized, (listed, nulls, extra) = anyio.run(_stdio, entry, work)
    info = _field(initialized, "server_info", "serverInfo")
    assert (info.name, info.version) == ("shout", "2.0.1")
    assert initialized.instructions.startswith("shout 2.0.1: Upper-cases its input.")
    (tool,) = listed.tools
    assert _field(tool, "input_schema", "inputSchema")["additionalProperties"] is False
    assert _field(nulls, "is_error", "isError") is False and nulls.content[0].text == "HI"
    assert _field(extra, "is_error", "isError") is True and "unexpected argument 'volume'" in extra.content[0].text


@pytest.mark.cargo
@needs_fixture_crates
def test_the_sdk_over_streamable_http_through_the_gateway(calc: Any) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def run(url: str) -> Any:
        async with streamable_http_client(url) as streams, ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            listed = await session.list_tools()
            added = await session.call_tool("add", {"a": 2, "b": 40})
            return listed, added

    with gateway([str(calc.binary)]) as url:
        listed, added = anyio.run(run, url)
    assert {t.name for t in listed.tools} == {"add", "echo", "fail", "pid", "crash", "sleep"}
    assert _field(added, "structured_content", "structuredContent") == {"sum": 42.0}


@pytest.mark.cargo
@needs_fixture_crates
def test_the_sdk_calls_an_http_service_through_the_bridge(svc: Any) -> None:
    entry = svc.mcp_config()["mcpServers"]["svc"]

    async def work(session: Any) -> Any:
        listed = await session.list_tools()
        greeted = await session.call_tool("greet", {"name": "Ada"})
        return listed, greeted

    initialized, (listed, greeted) = anyio.run(_stdio, entry, work)
    assert _field(initialized, "server_info", "serverInfo").version == svc.version != ""
    assert {t.name for t in listed.tools} == {fn.public_name for fn in svc.functions().values()}
    assert _field(greeted, "is_error", "isError") is False and "Ada" in greeted.content[0].text


@pytest.mark.cargo
@needs_fixture_crates
def test_nan_from_python_never_reaches_the_server(calc: Any) -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        calc.add(a=math.inf, b=1)
    assert calc.add(a=1, b=2) == {"sum": 3.0}


@pytest.mark.kernel
def test_inside_a_kernel_the_sdk_needs_errlog_as_mcp_config_says(shout: Any, tmp_path: Any) -> None:
    """python-sdk#1103: with fd capture off, ``stdio_client``'s default ``errlog`` (the kernel's stderr) has no fileno."""
    from jupyter_client.manager import start_new_kernel

    entry = shout.mcp_config()["mcpServers"]["shout"]
    code = textwrap.dedent(
        f"""
        import json
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
        params = StdioServerParameters(command={entry["command"]!r}, args={entry["args"]!r})
        async def call(**kwargs):
            async with stdio_client(params, **kwargs) as (r, w), ClientSession(r, w) as s:
                await s.initialize()
                return (await s.call_tool("shout", {{"input": "hi"}})).content[0].text
        try:
            plain = await call()
        except BaseException as exc:
            plain = "failed: " + repr(exc)
        with open({str(tmp_path / "stderr.log")!r}, "w") as log:
            fixed = await call(errlog=log)
        print(json.dumps({{"plain": plain, "fixed": fixed}}))
        """
    )
    manager, client = start_new_kernel(
        kernel_name="python3", extra_arguments=["--IPKernelApp.capture_fd_output=False"], cwd=str(tmp_path)
    )
    try:
        msg_id = client.execute(code)
        out: list[str] = []
        errors: list[str] = []
        while True:
            message = client.get_iopub_msg(timeout=120)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "error":
                errors.append("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                break
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert not errors, errors
    result = json.loads("".join(out).strip().splitlines()[-1])
    assert result["fixed"] == "HI"  # the documented workaround works in a kernel
    # the problem it works around (if a later SDK fixes it, the plain call works too and the docs can say so)
    assert result["plain"] == "HI" or "fileno" in result["plain"], result["plain"]
    assert sys.executable  # the kernel is this environment's python3 kernelspec
