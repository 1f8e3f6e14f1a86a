"""``flakebot mcp`` spoken to as raw JSON-RPC over stdio: cancellation, limits, tools built elsewhere, bad input."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import FLAKEBOT
from polling import wait_for
from tinycrates import processes_in

import flakebot_magic
from flakebot_magic.records.inventory import Inventory


class Client:
    """A JSON-RPC client of one ``flakebot mcp`` process; keeps every notification it reads.

    A thread reads the server's stdout line by line into a queue. (Waiting with
    ``select`` on the pipe and then ``readline`` loses messages: when two
    arrive together, as ``list_changed`` and a build's answer do, the second
    sits in the reader's buffer while ``select`` waits on the empty pipe.)
    """

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(FLAKEBOT), "mcp", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.notes: list[dict[str, Any]] = []
        self.ident = 0
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.reader = threading.Thread(target=self._read_all, daemon=True)
        self.reader.start()

    def _read_all(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.lines.put(line)
        self.lines.put(b"")  # end of output

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 120.0) -> dict[str, Any] | None:
        """The next message within ``timeout`` seconds (None: none came, or the server exited)."""
        try:
            line = self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if not line:
            self.lines.put(b"")  # every later read sees the end too
            return None
        message: dict[str, Any] = json.loads(line)
        return message

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 120.0) -> dict[str, Any]:
        self.ident += 1
        self.send({"id": self.ident, "method": method, **({"params": params} if params is not None else {})})
        deadline = time.monotonic() + timeout
        while True:
            message = self.read(deadline - time.monotonic())
            assert message is not None, f"no answer to {method} within {timeout} s (or the server exited)"
            if message.get("id") == self.ident:
                return message
            self.notes.append(message)

    def initialize(self, name: str = "raw-client") -> dict[str, Any]:
        answer = self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": name, "version": "0"}},
        )
        self.send({"method": "notifications/initialized"})
        return answer

    def call(self, name: str, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": arguments, **params})

    def names(self) -> set[str]:
        return {t["name"] for t in self.request("tools/list")["result"]["tools"]}

    def close(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(60)
        finally:
            self.reader.join(10)
            self.proc.stdout.close()


@pytest.fixture
def client(tiny_registry: Path, mcp_env: dict[str, str]) -> Any:
    made: list[Client] = []

    def start(*argv: str) -> Client:
        made.append(Client(["--registry", str(tiny_registry), *argv], mcp_env))
        return made[-1]

    yield start
    for each in made:
        if each.proc.poll() is None:
            each.proc.kill()
            each.proc.wait()
        for stream in (each.proc.stdin, each.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()


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
