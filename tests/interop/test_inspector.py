"""The official MCP Inspector CLI lists and calls the tools flakebot built, and the bridge's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from interop_tools import needs_fixture_crates, node_env


def inspector(bin_dir: Path, entry: dict[str, Any], *method: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "inspector"), "--cli", entry["command"], *entry["args"], *method],
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def answer(done: subprocess.CompletedProcess[str], *, tool_error: bool = False) -> Any:
    """The printed result; the CLI exits 5 for a result with isError."""
    assert done.returncode == (5 if tool_error else 0), done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.cargo
@needs_fixture_crates
def test_the_inspector_lists_and_calls_the_mcp_tool(node_tools: Path, calc: Any) -> None:
    entry = calc.mcp_config()["mcpServers"]["calc"]
    listed = answer(inspector(node_tools, entry, "--method", "tools/list"))
    assert {t["name"] for t in listed["tools"]} == {"add", "echo", "fail", "pid", "crash", "sleep"}
    added = answer(
        inspector(node_tools, entry, "--method", "tools/call", "--tool-name", "add", "--tool-arg", "a=2", "b=40")
    )
    assert added["isError"] is False and added["structuredContent"] == {"sum": 42}
    failed = inspector(node_tools, entry, "--method", "tools/call", "--tool-name", "fail", "--tool-arg", "message=no")
    assert "no" in failed.stdout + failed.stderr


def test_the_inspector_lists_and_calls_a_cli_tool_through_the_bridge(node_tools: Path, shout: Any) -> None:
    entry = shout.mcp_config()["mcpServers"]["shout"]
    (tool,) = answer(inspector(node_tools, entry, "--method", "tools/list"))["tools"]
    assert tool["name"] == "shout" and tool["inputSchema"]["additionalProperties"] is False
    called = answer(
        inspector(
            node_tools,
            entry,
            "--method",
            "tools/call",
            "--tool-name",
            "shout",
            "--tool-arg",
            "input=hi",
            "exclaim=true",
        )
    )
    assert called["isError"] is False and called["content"][0]["text"] == "HI!"
    extra = answer(
        inspector(
            node_tools, entry, "--method", "tools/call", "--tool-name", "shout", "--tool-arg", "input=hi", "loud=1"
        ),
        tool_error=True,
    )
    assert extra["isError"] is True and "got an unexpected argument 'loud'" in extra["content"][0]["text"]


@pytest.mark.cargo
@needs_fixture_crates
def test_the_inspector_calls_an_http_service_through_the_bridge(node_tools: Path, svc: Any) -> None:
    entry = svc.mcp_config()["mcpServers"]["svc"]
    tools = answer(inspector(node_tools, entry, "--method", "tools/list"))["tools"]
    names = {t["name"] for t in tools}
    assert names == set(svc.functions()) and all(t["inputSchema"].get("additionalProperties") is False for t in tools)
    add = next(fn for fn in svc.functions().values() if fn.name.startswith("add"))
    args = [f"{key}=2" for key in add.parameters.get("required") or []]
    called = answer(
        inspector(node_tools, entry, "--method", "tools/call", "--tool-name", add.public_name, "--tool-arg", *args)
    )
    assert called["isError"] is False, called
