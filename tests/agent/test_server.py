"""``flakebot mcp`` spoken to as raw JSON-RPC over stdio: cancellation, limits, tools built elsewhere, bad input."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for
from tinycrates import processes_in

import flakebot_magic
from flakebot_magic.records.inventory import Inventory


def test_the_handshake_and_bad_requests(client: Any) -> None:
    mcp = client()
    answer = mcp.initialize()["result"]
    assert answer["protocolVersion"] == "2025-06-18" and answer["capabilities"]["tools"] == {"listChanged": True}
    assert mcp.request("ping")["result"] == {}
    assert mcp.request("resources/list")["error"]["code"] == -32601
    assert mcp.call("no_such_tool", {})["error"]["code"] == -32602
    wrong = mcp.call("build_tool", {"request": 3})["result"]
    assert wrong["isError"] is True and "must be str" in wrong["content"][0]["text"]
    assert mcp.call("tool_info", {"name": "ghost"})["result"]["isError"] is True
    mcp.send({"id": 99, "method": "tools/list", "params": []})  # params that are no object: -32602, as the bridge
    answer = mcp.read(10)
    assert answer["id"] == 99 and answer["error"]["code"] == -32602  # type: ignore[index]
    # a batch: two answers written back to back, both read
    assert mcp.proc.stdin is not None
    mcp.proc.stdin.write(b'[{"jsonrpc":"2.0","id":100,"method":"ping"},{"jsonrpc":"2.0","id":101,"method":"ping"}]\n')
    mcp.proc.stdin.flush()
    assert [mcp.read(10), mcp.read(10)] == [{"jsonrpc": "2.0", "id": i, "result": {}} for i in (100, 101)]
    assert mcp.close() == 0


@pytest.mark.cargo
def test_cancelled_stops_the_build_like_cancel(client: Any, agent_cache: Path) -> None:
    mcp = client()
    mcp.initialize()
    mcp.send(
        {
            "id": 7,
            "method": "tools/call",
            "params": {"name": "build_tool", "arguments": {"request": "", "crate": "slowbuild", "name": "slow"}},
        }
    )
    workspace = agent_cache / "workspaces" / "slow"
    wait_for((workspace / "build-script-started").exists, 120, "the build script to start")
    mcp.send({"method": "notifications/cancelled", "params": {"requestId": 7, "reason": "user pressed stop"}})
    wait_for(lambda: not processes_in(workspace, settle=0.2), 30, "cargo to stop after the cancel")
    # no response for a cancelled request; the session goes on
    assert mcp.request("ping")["result"] == {}
    assert all(m.get("id") != 7 for m in mcp.notes)
    assert workspace.is_dir() and Inventory(agent_cache / "tools").get("slow") is None
    log = agent_cache / "logs" / "slow.cancelled.log"  # written once the pipeline has stopped
    wait_for(log.exists, 30, "the cancelled run's log")
    assert "raw-client: user pressed stop" in log.read_text()


@pytest.mark.cargo
def test_agent_limits_refuse_builds(client: Any, agent_cache: Path) -> None:
    off = client("--no-builds")
    off.initialize()
    refused = off.call("build_tool", {"request": "echo", "crate": "tinyecho"})["result"]
    assert refused["isError"] and "allow_agent_builds" in refused["content"][0]["text"]
    assert off.close() == 0

    capped = client("--max-builds", "1")
    capped.initialize()
    first = capped.call("build_tool", {"request": "echo", "crate": "tinyecho", "name": "one"})["result"]
    assert first["isError"] is False, first
    # list_changed came right before the answer (often in the same read from the pipe): both were read
    assert {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"} in capped.notes
    second = capped.call("build_tool", {"request": "echo", "crate": "tinyecho", "name": "two"})["result"]
    assert second["isError"] and "agent_max_builds" in second["content"][0]["text"]
    assert Inventory(agent_cache / "tools").get("two") is None
    # the tool built is still callable
    assert capped.call("one", {"words": ["still", "here"]})["result"]["content"][0]["text"] == "still here\n"


@pytest.mark.cargo
def test_a_tool_built_elsewhere_joins_the_list(client: Any, tiny_registry: Path, agent_cache: Path) -> None:
    mcp = client()
    mcp.initialize()
    assert "elsewhere" not in mcp.names()
    tool = flakebot_magic.build("", crate="tinyecho", name="elsewhere", registry=str(tiny_registry), backend="cargo")
    built_at = time.monotonic()
    note = mcp.read(10)
    arrived = time.monotonic() - built_at
    assert note == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    assert arrived < 1.0, arrived
    assert "elsewhere" in mcp.names()
    text = mcp.call("elsewhere", {"input": "quiet"})["result"]["content"][0]["text"]
    assert text == tool(input="quiet") == "QUIET"
    record = Inventory(agent_cache / "tools").get("elsewhere")
    assert record is not None and record.requested_by == ""  # a person's build, not an agent's


def test_flakebot_mcp_gives_its_run_flags_to_every_agent_build(tmp_path: Path) -> None:
    """``flakebot mcp --candidates 3 --plan``: the flags of each agent build (in its request), not settings."""
    from flakebot_magic import cli
    from flakebot_magic.agent.catalog import ToolCatalog
    from flakebot_magic.agent.functions import BUILTIN_NAMES
    from flakebot_magic.agent.mcp import ServerSession
    from flakebot_magic.request import RunFlags

    args = cli._parser().parse_args(["mcp", "--candidates", "3", "--plan", "--cache-dir", str(tmp_path)])
    flags = cli._agent_flags(args)
    assert flags == RunFlags(candidates=3, plan=True)
    settings = cli._settings(args)
    session = ServerSession(settings, ToolCatalog(settings, reserved=BUILTIN_NAMES), notify=lambda _: None, flags=flags)
    assert session.agent.flags == flags
