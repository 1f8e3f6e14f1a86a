"""The property of issue 34, item 3, over every tool kind and every misbehaviour: a call ends within 1.5x its time limit,
from the moment it is made, whatever the tool does.

Every kind of :data:`~flakebot_magic.clients.kinds.KINDS` × every misbehaviour × 1 and 4 calls at once, with the
time limit set after the tool was made (as after ``load``). The tools are Python scripts on the system's python (the
sandbox of the ``--help`` probe shows it); each kind does its version of each misbehaviour:

=================  =========================================  =========================================
misbehaviour       MCP server / HTTP service                  command-line tool
=================  =========================================  =========================================
never_ready        never answers initialize / never listens   its --help never answers (the probe)
ignores_term       the same, and ignores SIGTERM              the call sleeps and ignores SIGTERM
session_child      never ready; a child in its own session    exits at once; a child in its own session
                   holds its pipes                            holds its output
hangs_mid_call     ready; the call never answers, SIGTERM     the call never ends
                   ignored, a child in its own session
died_with_child    ready, then killed while a child in its    killed by itself while a child in its own
                   own session holds its pipes: restarted     session holds its output
slow_probe         (not a step of theirs: as never_ready)     its --help answers after 1.5 s; the call hangs
=================  =========================================  =========================================

On integ (before the change), 26 of the 36 cases failed: MCP and HTTP starts past the call's limit (up to 12.2 s
for 2 s), a first CLI call held 30 s by its probe, failures naming ready_timeout's 10 s or no limit at all.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kindtools import PYTHON, at_once

from flakebot_magic.clients.base import ToolClient, ToolContract
from flakebot_magic.clients.kinds import KINDS

LIMIT = 2.0
BOUND = 1.5 * LIMIT
MISBEHAVIOURS = ("never_ready", "ignores_term", "session_child", "hangs_mid_call", "died_with_child", "slow_probe")

_COMMON = """
import json, os, signal, sys, time
MODE = os.environ.get("MODE") or open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mode")).read()
def detach():
    if os.fork() == 0:
        os.setsid(); time.sleep(60); os._exit(0)
"""

_CLI = """
if sys.argv[1:2] in (["--help"], ["-h"]):
    if MODE == "never_ready":
        time.sleep(600)
    if MODE == "slow_probe":
        time.sleep(1.5)
    print("Usage: misbehaving [TEXT]\\nPrints its text."); sys.exit(0)
if MODE == "ignores_term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if MODE == "session_child":
    detach(); print("done"); sys.exit(0)
if MODE == "died_with_child":
    detach(); os.kill(os.getpid(), signal.SIGKILL)
time.sleep(600)
"""

_MCP = """
NEVER = MODE in ("never_ready", "ignores_term", "session_child", "slow_probe")
if MODE in ("ignores_term", "hangs_mid_call"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if MODE in ("session_child", "died_with_child"):
    detach()
TOOLS = [{"name": "echo", "inputSchema": {"type": "object", "properties": {"t": {"type": "string"}}}}]
def answer(m, result=None, error=None):
    body = {"jsonrpc": "2.0", "id": m["id"]}
    body.update({"error": error} if error else {"result": result})
    sys.stdout.write(json.dumps(body) + "\\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    if NEVER or "id" not in m:
        continue
    if m["method"] == "initialize":
        answer(m, {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "m"}})
    elif m["method"] == "tools/list":
        answer(m, {"tools": TOOLS})
    elif m["method"] == "tools/call":
        if MODE == "hangs_mid_call":
            detach(); time.sleep(600)
        answer(m, {"content": [{"type": "text", "text": "ok"}]})
    else:
        answer(m, error={"code": -32601, "message": "no"})
time.sleep(600)
"""

_HTTP = """
import hmac
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
if MODE in ("ignores_term", "hangs_mid_call"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if MODE in ("session_child", "died_with_child"):
    detach()
if MODE in ("never_ready", "ignores_term", "session_child", "slow_probe"):
    time.sleep(600)
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path != "/health" and not hmac.compare_digest(
            self.headers.get("Authorization", ""), "Bearer " + os.environ["FLAKEBOT_TOKEN"]
        ):
            self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers(); return
        if self.path == "/x" and MODE == "hangs_mid_call":
            time.sleep(600)
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

_SCRIPTS = {"cli": _CLI, "mcp": _MCP, "http": _HTTP}
#: each kind's call, made the way a person makes it (an MCP function looked up before its tools are known, too)
_CALLS: dict[str, Callable[[Any], Any]] = {
    "cli": lambda tool: tool("x"),
    "mcp": lambda tool: tool.echo(t="x"),
    "http": lambda tool: tool.get("/x").text,
}


def test_every_kind_is_covered() -> None:
    assert set(_SCRIPTS) == set(KINDS), "a new kind needs its misbehaving script here"


def _make(tmp_path: Path, kind: str, mode: str) -> ToolClient:
    store = tmp_path / f"{kind}-{mode}"
    binary = store / "bin" / "misbehaving"
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!{PYTHON}\n" + textwrap.dedent(_COMMON) + textwrap.dedent(_SCRIPTS[kind]))
    binary.chmod(0o755)
    (store / "bin" / "mode").write_text(mode)  # read by the probe too, which runs in the sandbox without $MODE
    tool = KINDS[kind](
        name="misbehaving",
        binary=binary,
        crate="misbehaving",
        version="0.1.0",
        source_hash="0" * 32,
        store_path=store,
        contract=ToolContract(kind=kind, bin="misbehaving", ready_timeout=10.0),
    )
    return tool


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Callable[[str, str], ToolClient]]:
    tools: list[ToolClient] = []

    def make(kind: str, mode: str) -> ToolClient:
        tool = _make(tmp_path, kind, mode)
        tools.append(tool)
        return tool

    yield make
    for tool in tools:
        tool.close()


@pytest.mark.parametrize("calls", [1, 4])
@pytest.mark.parametrize("mode", MISBEHAVIOURS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_call_ends_within_its_time_limit_whatever_the_tool_does(
    made: Callable[[str, str], ToolClient], kind: str, mode: str, calls: int
) -> None:
    tool = made(kind, mode)
    if mode == "died_with_child" and KINDS[kind].server:
        tool.start()
        pid = getattr(tool, "pid", None)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # dead; the child in its own session keeps its pipes open
        time.sleep(0.3)
    tool.timeout = LIMIT  # set after the tool was made, as after `load`
    results = at_once(lambda: _CALLS[kind](tool), calls)
    shown = [(round(took, 2), outcome.splitlines()[0][:200]) for took, outcome in results]
    assert not any(outcome.startswith("RAISED") for _, outcome in results), shown
    assert max(took for took, _ in results) <= BOUND, shown
    # a failure names the limit that applied (the call's), never one that did not (ready_timeout's 10 s)
    for _, outcome in results:
        if outcome.startswith("failed"):
            assert f"{LIMIT:g} s" in outcome and "10 s" not in outcome, outcome
    if kind == "cli" and mode == "session_child":  # it exited at once: the error says what kept the call waiting
        assert all("exited (status 0), but a process it started" in outcome for _, outcome in results), shown
