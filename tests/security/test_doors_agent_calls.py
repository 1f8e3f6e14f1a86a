"""Row "agent calls" of the matrix (docs/SECURITY.md): what an agent sends is data, never code, never examples.

An agent's build request reaches the pipeline through three doors: ``flakebot mcp`` (``build_tool`` over
stdio, a child process), the notebook agent's tool call (``flakebot_magic.call``), and the session both use
(``AgentSession.build``). Before issue 33 the ``>>>`` lines of such a request were acceptance examples, run with
``exec`` in flakebot's process: an agent's request wrote a file as the user. Here each door gets the payload of
``door_payloads``; nothing runs, the tool is built, and the build says its ``>>>`` lines were read as words.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from door_payloads import assert_nothing_ran, runs_if_code
from tinycrates import Recorder, write_registry

from flakebot_magic.agent.builds import AgentSession
from flakebot_magic.agent.notebook import call
from flakebot_magic.config import Settings
from flakebot_magic.events import Notice
from flakebot_magic.records.inventory import Inventory

pytestmark = pytest.mark.cargo

FLAKEBOT = Path(sys.executable).parent / "flakebot"


def _request(marker: Path, tool: str) -> str:
    return "echo the words it is given\n" + runs_if_code(marker, tool)


def test_an_agent_sessions_request_runs_nothing(tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    marker = tmp_path / "session-ran"
    recorder = Recorder()
    report = AgentSession(settings, requested_by="an-agent").build(
        _request(marker, "echo1"), crate="tinyecho", name="echo1", observers=[recorder]
    )
    assert_nothing_ran(marker, report.tool, source="an agent's request (AgentSession)")
    assert report.tool("hi").strip().lower() == "hi"  # built all the same
    said = [e.message for e in recorder.of(Notice) if "read as words, not run" in e.message]
    assert said and "the agent 'an-agent'" in said[0], [e.message for e in recorder.of(Notice)]


def test_the_notebook_agents_tool_call_runs_nothing(tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    marker = tmp_path / "notebook-ran"
    arguments = {"request": _request(marker, "echo2"), "crate": "tinyecho", "name": "echo2"}
    message = call(
        {"id": "c1", "type": "function", "function": {"name": "build_tool", "arguments": json.dumps(arguments)}},
        cache_dir=tmp_path / "cache",
        registry=str(registry),
        backend="cargo",
    )
    assert "echo2" in message["content"], message
    assert_nothing_ran(marker, source="the notebook agent's build_tool call")
    record = Inventory(Settings(cache_dir=tmp_path / "cache").cache.tools).get("echo2")
    assert record is not None and record.requested_by  # built, recorded as the agent's


def test_flakebot_mcp_build_tool_runs_nothing(tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    marker = tmp_path / "mcp-ran"
    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(tmp_path / "cache"), "FLAKEBOT_BACKEND": "cargo"}
    messages = [
        {
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        },
        {"method": "notifications/initialized"},
        {
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "build_tool",
                "arguments": {"request": _request(marker, "echo3"), "crate": "tinyecho", "name": "echo3"},
            },
        },
    ]
    stdin = "".join(json.dumps({"jsonrpc": "2.0", **m}) + "\n" for m in messages)
    proc = subprocess.Popen(
        [str(FLAKEBOT), "mcp", "--registry", str(registry)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(stdin.encode())
    proc.stdin.flush()
    answer: dict[str, object] = {}
    try:
        for line in iter(proc.stdout.readline, b""):
            message = json.loads(line)
            if message.get("id") == 2:
                answer = message
                break
    finally:
        proc.stdin.close()
        proc.wait(120)
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()
    result = answer.get("result")
    assert isinstance(result, dict) and not result.get("isError"), answer
    assert_nothing_ran(marker, source="flakebot mcp's build_tool")
    record = Inventory(Settings(cache_dir=tmp_path / "cache").cache.tools).get("echo3")
    assert record is not None and record.requested_by == "t"
