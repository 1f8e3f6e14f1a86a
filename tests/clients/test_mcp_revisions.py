"""The client of deployed MCP tools in both eras: real SDK servers, a call's timeout, what it reads.

* **The SDK's own servers** (tests/sdk_server.py: the official ``mcp`` package,
  2.3) as the deployed tool: one that serves only 2026-07-28 (it refuses
  ``initialize``), one that serves only the handshake (it refuses
  ``server/discover``), one that serves what the client opens with. The
  client speaks modern to the first, legacy to the second, and says which in
  ``repr``, its display rows and the tool's record (``show``).
* **A call's timeout bounds the whole call**, from the moment it is made: 8
  calls at once, timeout 2 s, against a server whose tool sleeps 4 s and
  against one stopped with SIGSTOP: the slowest call ends within 1.5x the
  timeout (before: they queued, and the timeout of each began at its turn:
  up to 17.8 s). A timeout set after the tool was loaded applies.
* **What the client reads from a tool is bounded** in the modern era too: a
  300 MB message without a newline, in answer to ``tools/call`` and to the
  ``server/discover`` probe, is never held.
* **The probe** decides the era as 2026-07-28 says: a server that stays silent
  on it, or exits on it, is legacy; an unsupported-version error naming only
  revisions flakebot does not speak is a clear error; a result that asks for
  input flakebot's client cannot give (``input_required``) is one too.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.contract import ToolContract
from flakebot_magic.clients.mcp import MAX_MESSAGE_BYTES, McpTool
from flakebot_magic.errors import ToolError

pytest.importorskip("mcp", reason="the mcp SDK is in the `test` extra")

SDK_SERVER = Path(__file__).resolve().parents[1] / "sdk_server.py"
TIMEOUT = 2.0
CALLS = 8


def _script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def tool_of(tmp_path: Path) -> Iterator[Callable[..., McpTool]]:
    """``tool_of(name, source=..., era=...)``: an MCP tool whose binary runs the SDK server in ``era``, or ``source``."""
    made: list[McpTool] = []

    def make(name: str, *, era: str = "", source: str = "", ready_timeout: float = 20.0) -> McpTool:
        if era:
            binary = _script(tmp_path / name / "bin" / name, f"#!/bin/sh\nexec {sys.executable} {SDK_SERVER} {era}\n")
        else:
            binary = _script(tmp_path / name / "bin" / name, f"#!{sys.executable}\n{source}")
        tool = McpTool(
            name=name,
            binary=binary,
            crate=name,
            version="1",
            source_hash="0",
            store_path=tmp_path / name,
            contract=ToolContract(kind="mcp", bin=name, ready_timeout=ready_timeout),
        )
        made.append(tool)
        return tool

    yield make
    for tool in made:
        tool.close()
        lifecycle.unregister(tool)


# -- the SDK's servers as deployed tools --------------------------------------------------


@pytest.mark.parametrize(
    ("era", "revision", "words"),
    [
        ("modern", "2026-07-28", "2026-07-28 (stateless)"),
        ("legacy", "2025-11-25", "2025-11-25 (initialize handshake)"),
        ("both", "2026-07-28", "2026-07-28 (stateless)"),
    ],
)
def test_the_client_speaks_each_sdk_servers_revision(
    tool_of: Callable[..., McpTool], era: str, revision: str, words: str
) -> None:
    states: list[dict[str, Any]] = []
    calc = tool_of(f"sdk_{era}", era=era)
    calc.on_state = lambda **changes: states.append(changes)
    assert calc.revision == "" and "protocol: (not started)" in repr(calc)
    assert set(calc.functions()) == {"add", "shout", "nested", "slow", "fail"}
    assert calc.revision == revision
    assert f"protocol: {words}" in repr(calc) and ("protocol", words) in calc._rows()
    assert states[-1]["protocol"] == revision  # what the tool's record (and so `show`) says
    assert calc.server_info["name"] == "sdk-calc" and "Adds numbers" in calc.instructions
    assert calc.add(a=1, b=2) == {"sum": 3.0}
    assert calc.shout(text="hi") == {"result": "HI"}  # the SDK gives a str result a schema: structured
    assert calc.nested(point={"x": 2, "y": 5}) == {"total": 7}  # a 2020-12 schema with $defs/$ref, sent through
    with pytest.raises(ToolError, match="reported an error"):
        calc.fail(message="no")
    calc.stop()
    assert calc.shout(text="again") == {"result": "AGAIN"} and calc.revision == revision  # a restart keeps the era


def test_a_modern_only_server_refuses_the_handshake(tool_of: Callable[..., McpTool]) -> None:
    """Why the client must probe: the SDK's 2026-07-28-only server answers ``initialize`` with an error (main's
    client sent only that, and never connected)."""
    import json
    import subprocess

    line = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}},
    }
    done = subprocess.run(
        [sys.executable, str(SDK_SERVER), "modern"],
        input=json.dumps(line) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    answer = json.loads(done.stdout.splitlines()[0])
    assert answer["error"]["code"] == -32022 and "2026-07-28" in answer["error"]["data"]["supported"]


# -- a call's timeout --------------------------------------------------------------------------


def _at_once(call: Callable[[], Any]) -> list[tuple[float, BaseException | None]]:
    """Run ``call`` in :data:`CALLS` threads started together; each one's seconds and what it raised."""
    results: list[tuple[float, BaseException | None]] = []
    lock = threading.Lock()
    gate = threading.Barrier(CALLS)

    def one() -> None:
        gate.wait()
        began = time.monotonic()
        try:
            call()
            raised: BaseException | None = None
        except BaseException as exc:
            raised = exc
        with lock:
            results.append((time.monotonic() - began, raised))

    threads = [threading.Thread(target=one) for _ in range(CALLS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_calls_to_a_slow_server_end_within_their_timeout(tool_of: Callable[..., McpTool], era: str) -> None:
    calc = tool_of(f"slow_{era}", era=era)
    calc.start()
    calc.timeout = TIMEOUT  # set after the tool was loaded: it applies
    results = _at_once(lambda: calc.slow(seconds=4))
    worst = max(seconds for seconds, _ in results)
    assert worst <= 1.5 * TIMEOUT, sorted(seconds for seconds, _ in results)
    assert all(isinstance(raised, ToolError) for _, raised in results), results
    messages = [str(raised) for _, raised in results]
    assert sum("got no answer within 2 s" in m for m in messages) == 1  # the one that was sent; it stopped the server
    assert all("was not sent" in m for m in messages if "got no answer" not in m)  # the others waited their time out
    calc.timeout = 60.0  # the next call starts it again, within its own timeout (an SDK server starts in ~1 s)
    assert calc.slow(seconds=0) == {"result": "awake"}


@pytest.mark.parametrize("era", ["legacy", "modern"])
def test_calls_to_a_stopped_server_end_within_their_timeout(tool_of: Callable[..., McpTool], era: str) -> None:
    calc = tool_of(f"hung_{era}", era=era)
    calc.start()
    pid = calc.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # hung: alive, never answers
    try:
        results = _at_once(lambda: calc.call_tool("shout", {"text": "hi"}, timeout=TIMEOUT))
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    worst = max(seconds for seconds, _ in results)
    assert worst <= 1.5 * TIMEOUT, sorted(seconds for seconds, _ in results)
    assert all(isinstance(raised, ToolError) for _, raised in results), results
    assert calc.pid != pid  # the hung one was stopped
    assert calc.shout(text="back") == {"result": "BACK"} and calc.pid != pid


# -- what the client reads ----------------------------------------------------------------------

_FLOOD = """
import json, sys
MODERN = "io.modelcontextprotocol/protocolVersion"
flood_on = sys.argv[0].rsplit("/", 1)[-1]  # "discover" or "call": where it floods
def send(ident, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\\n")
    sys.stdout.flush()
def flood():
    chunk = b"x" * (1 << 20)
    try:
        for _ in range(300):  # 300 MB, no newline
            sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
    except BrokenPipeError:
        sys.exit(0)
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    method = m["method"]
    if method == "server/discover":
        if flood_on == "discover":
            flood()
            continue
        send(m["id"], {"resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}},
                       "ttlMs": 0, "cacheScope": "private"})
    elif method == "tools/list":
        send(m["id"], {"resultType": "complete", "ttlMs": 0, "cacheScope": "private",
                       "tools": [{"name": "flood", "inputSchema": {"type": "object"}},
                                 {"name": "ok", "inputSchema": {"type": "object"}}]})
    elif method == "tools/call" and m["params"]["name"] == "flood":
        assert MODERN in m["params"]["_meta"]
        flood()
    elif method == "tools/call":
        send(m["id"], {"resultType": "complete", "content": [{"type": "text", "text": "fine"}]})
"""


def test_a_modern_servers_300_mb_answer_is_not_held(tool_of: Callable[..., McpTool]) -> None:
    flood = tool_of("call", source=_FLOOD)
    flood.start()
    assert flood.revision == "2026-07-28"
    with pytest.raises(ToolError, match=r"longer than 32 MiB .* it was stopped"):
        flood.flood()
    assert len(flood.session._buffer) <= MAX_MESSAGE_BYTES + 1 and not flood.running
    assert flood.ok() == "fine"  # the next call starts it again


def test_a_300_mb_answer_to_the_probe_is_not_held(tool_of: Callable[..., McpTool]) -> None:
    flood = tool_of("discover", source=_FLOOD)
    with pytest.raises(ToolError, match=r"longer than 32 MiB .*server/discover"):
        flood.start()
    assert len(flood.session._buffer) <= MAX_MESSAGE_BYTES + 1 and not flood.running


# -- the probe -----------------------------------------------------------------------------------

_LEGACY = """
import json, sys
mode = sys.argv[0].rsplit("/", 1)[-1]
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "server/discover":
        if mode == "silent":
            continue  # a legacy server that ignores what it does not know
        if mode == "exits":
            sys.exit(3)
        if mode == "disjoint":
            e = {"code": -32022, "message": "Unsupported protocol version",
                 "data": {"supported": ["2099-01-01"], "requested": "2026-07-28"}}
            print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "error": e}), flush=True)
            continue
    if m["method"] == "initialize":
        r = {"protocolVersion": "2025-03-26", "capabilities": {}, "serverInfo": {"name": mode, "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": [{"name": "ask", "inputSchema": {"type": "object"}}, {"name": "odd", "inputSchema": {}}]}
    elif m["params"]["name"] == "ask":
        r = {"resultType": "input_required", "inputRequests": {"k": {"method": "elicitation/create", "params": {}}}}
    else:
        r = {"resultType": "partial", "content": []}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"""


@pytest.mark.parametrize("mode", ["silent", "exits"])
def test_a_server_silent_on_the_probe_or_exiting_on_it_is_legacy(tool_of: Callable[..., McpTool], mode: str) -> None:
    old = tool_of(mode, source=_LEGACY, ready_timeout=4.0)
    began = time.monotonic()
    old.start()
    assert old.revision == "2025-03-26" and old.server_info["name"] == mode
    assert time.monotonic() - began < 4.0  # the probe had half the start's time
    with pytest.raises(ToolError, match=r"asked flakebot for more input \(elicitation/create\)"):
        old.ask()
    with pytest.raises(ToolError, match="resultType 'partial'"):
        old.odd()


def test_a_server_that_speaks_none_of_flakebots_revisions_is_a_clear_error(tool_of: Callable[..., McpTool]) -> None:
    other = tool_of("disjoint", source=_LEGACY)
    with pytest.raises(ToolError, match=r"speaks only protocol revision\(s\) 2099-01-01; flakebot speaks .*2026-07-28"):
        other.start()
    assert not other.running


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_the_schemas_flakebot_serves_again_are_json_schema_2020_12(tool_of: Callable[..., McpTool]) -> None:
    """A modern tool's schema (pydantic's ``$defs``/``$ref``) as ``flakebot mcp`` and the bridge list it (the
    function's ``enforced_schema``): valid 2020-12 (the default dialect), every local ``$ref`` resolving, and an
    argument the tool takes validating; flakebot's own functions' schemas too."""
    from jsonschema import Draft202012Validator
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    from flakebot_magic.agent.functions import BUILTINS

    calc = tool_of("schemas", era="modern")
    served = {name: fn.enforced_schema for name, fn in calc.functions().items()}
    served |= {name: schema for name, (_, schema) in BUILTINS.items()}
    for name, schema in served.items():
        Draft202012Validator.check_schema(schema)
        resolver = Registry().with_resource("urn:served", DRAFT202012.create_resource(schema)).resolver("urn:served")
        for ref in _refs(schema):
            assert ref.startswith("#"), (name, ref)  # nothing to fetch from elsewhere
            resolver.lookup(ref)  # raises for a dangling one
    assert "$defs" in served["nested"]
    Draft202012Validator(served["nested"]).validate({"point": {"x": 1, "y": 2}})
    assert not Draft202012Validator(served["nested"]).is_valid({"point": {"x": "one", "y": 2}})
