"""The MCP client against a real MCP server (tests/fixtures/demo-mcp) built by the pipeline."""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import signal
import sys
import threading
import time
from typing import Any

import pytest
from polling import wait_for
from stdio_servers import mcp_server

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.agents import strict_problems
from flakebot_magic.clients.mcp import McpTool, value_of
from flakebot_magic.errors import ToolError
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.testing.overlay import fixture_crates_buildable

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.skipif(not fixture_crates_buildable(), reason="needs serde_json and tiny_http: run `make install`"),
]


def test_the_contract_makes_an_mcp_client_with_a_function_per_tool(calc: Any) -> None:
    # the build read its functions in the sandbox and left nothing running: the server starts at the first call
    assert isinstance(calc, McpTool) and calc.kind == "mcp" and not calc.running
    assert set(calc.functions()) == {"add", "echo", "fail", "pid_", "crash", "sleep"}  # `pid` is the process id
    assert not calc.running  # known from the build, not from a start
    assert calc.add(1, 1) == {"sum": 2.0} and calc.running and calc.session.restarts == 0
    assert calc.server_info["name"] == "demo-mcp"
    assert "add" in dir(calc)


def test_functions_have_signatures_and_docstrings_from_the_input_schema(calc: Any) -> None:
    add = inspect.signature(calc.add)
    assert list(add.parameters) == ["a", "b"]
    assert all(p.default is inspect.Parameter.empty for p in add.parameters.values())
    echo = inspect.signature(calc.echo)
    assert echo.parameters["text"].default is inspect.Parameter.empty
    assert echo.parameters["times"].default is None  # optional
    assert "Literal['lower', 'upper', 'keep']" in str(echo.parameters["case"].annotation)
    doc = calc.echo.__doc__
    assert doc.startswith("Repeat a text")
    assert "times : int, optional" in doc and "default 1" in doc and ">= 1" in doc
    assert calc.add.__qualname__ == "calc.add"


def test_calls_return_structured_content_or_text(calc: Any) -> None:
    assert calc.add(1, 2) == {"sum": 3.0}
    assert calc.add(a=0.5, b=2) == {"sum": 2.5}
    assert calc.echo("hi", times=3, case="upper") == "HI HI HI"
    assert calc.echo(text="plain") == "plain"


def test_one_process_serves_many_calls(calc: Any) -> None:
    pids = {calc.pid_()["pid"] for _ in range(20)}
    assert pids == {calc.pid}


def test_arguments_are_checked_before_sending(calc: Any) -> None:
    calc.echo("settle")
    assert _eventually(lambda: "call echo" in calc.logs())
    before = calc.logs().count("call echo")
    with pytest.raises(TypeError, match="'text' must be str"):
        calc.echo(text=3)
    with pytest.raises(ValueError, match="'times' must be at least 1"):
        calc.echo("x", times=0)
    with pytest.raises(ValueError, match="'case' must be one of"):
        calc.echo("x", case="shouty")
    with pytest.raises(TypeError, match="missing a required argument: 'b'"):
        calc.add(1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        calc.add(1, 2, c=3)
    assert calc.logs().count("call echo") == before  # nothing reached the server


def test_a_tool_error_raises_tool_error(calc: Any) -> None:
    with pytest.raises(ToolError, match=r"calc\.fail reported an error: boom") as caught:
        calc.fail("boom")
    assert caught.value.stderr == "boom"
    assert calc.add(1, 1) == {"sum": 2.0}  # the server is fine


def test_a_dead_server_is_restarted(calc: Any) -> None:
    first = calc.pid
    with pytest.raises(ToolError, match=r"exited \(status 3\) while answering tools/call") as caught:
        calc.crash()
    assert caught.value.returncode == 3
    assert not calc.running
    assert calc.add(2, 2) == {"sum": 4.0}
    assert calc.running and calc.pid != first and calc.session.restarts == 1
    os.kill(calc.pid, signal.SIGKILL)  # killed from outside: noticed on the next call
    wait_for(lambda: not calc.running, 5, "the killed server to be gone")
    assert calc.add(3, 3) == {"sum": 6.0}
    assert calc.session.restarts == 2
    assert _eventually(lambda: "restarting calc" in calc.logs())


def test_a_call_past_its_timeout_stops_the_server(calc: Any) -> None:
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"no answer within 0\.3 s"):
        calc.call_tool("sleep", {"ms": 5000}, timeout=0.3)
    assert time.monotonic() - started < 3
    assert not calc.running
    assert calc.echo("back") == "back"


def test_an_interrupted_call_stops_the_server(calc: Any) -> None:
    # running before the call, whichever test ran before: the interrupt must land in the call, not in a start
    calc.start()
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT))  # type: ignore[arg-type]
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            calc.sleep(ms=5000)
    finally:
        timer.cancel()
    assert not calc.running
    assert _eventually(lambda: "interrupted" in calc.logs())
    assert calc.add(1, 2) == {"sum": 3.0}


def _eventually(check: Any, seconds: float = 5.0) -> bool:
    """Logs arrive on their own thread, a moment after the answer."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_logs_keep_the_servers_stderr(calc: Any) -> None:
    calc.add(1, 2)
    assert "demo-mcp: ready" in calc.logs()
    assert _eventually(lambda: calc.logs(1).strip() == "demo-mcp: call add")
    assert lifecycle.logs("calc", calc.home) == calc.logs()


def test_stop_by_name_and_the_inventory_status(calc: Any, fixture_settings: Any) -> None:
    inventory = Inventory(fixture_settings.cache.tools)
    calc.add(1, 1)  # started by its first call
    record = inventory.get("calc")
    assert record is not None and record.kind == "mcp" and record.status == "running" and record.pid == calc.pid
    pid = calc.pid
    assert "calc" in lifecycle.running(fixture_settings.cache.root)
    assert lifecycle.stop("calc", fixture_settings.cache.root) is True
    assert not calc.running and "calc" not in lifecycle.running()
    assert _gone(pid)
    assert inventory.get("calc").status == "stopped"  # type: ignore[union-attr]
    assert lifecycle.stop("calc", fixture_settings.cache.root) is False  # nothing left to stop


def test_building_the_same_name_again_replaces_the_old_server(build_tool: Any) -> None:
    first = build_tool("demo-mcp", "calc")
    first.add(1, 1)  # running
    second = build_tool("demo-mcp", "calc")
    assert second is not first
    assert not first.running  # the new build stopped the old server
    assert second.add(1, 1) == {"sum": 2.0} and second.running and not first.running


def test_for_agents(calc: Any) -> None:
    tools = calc.openai_tools()
    names = [t["function"]["name"] for t in tools]
    assert names == ["calc_add", "calc_echo", "calc_fail", "calc_pid", "calc_crash", "calc_sleep"]
    for tool in tools:
        assert tool["function"]["strict"] is True
        assert strict_problems(tool["function"]["parameters"]) == []
    echo = tools[1]["function"]["parameters"]
    assert echo["properties"]["times"]["type"] == ["integer", "null"]
    assert "minimum: 1" in echo["properties"]["times"]["description"]
    message = calc.call(
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "calc_echo", "arguments": json.dumps({"text": "yo", "times": 2, "case": None})},
        }
    )
    assert message == {"role": "tool", "tool_call_id": "call_1", "content": "yo yo"}
    added = calc.call({"id": "c2", "function": {"name": "calc_add", "arguments": '{"a": 1, "b": 2}'}})
    assert json.loads(added["content"]) == {"sum": 3.0}
    failed = calc.call({"id": "c3", "function": {"name": "calc_fail", "arguments": '{"message": "no"}'}})
    assert failed["content"].startswith("error: ToolError: calc.fail reported an error: no")
    unknown = calc.call({"id": "c4", "function": {"name": "calc_nope", "arguments": "{}"}})
    assert "has no function 'calc_nope'" in unknown["content"]
    assert calc.mcp_config() == {"mcpServers": {"calc": {"command": str(calc.binary), "args": [], "env": {}}}}
    usage = calc.usage()
    assert usage.startswith("### `calc`: demo-mcp 0.1.0 (MCP server (stdio))")
    assert "#### `calc.add(a, b)`" in usage and "calc.add(a=1.5, b=1.5)" in usage
    page = calc._repr_html_()
    assert "calc.openai_tools()" in page and "mcpServers" in page and "demo-mcp 0.1.0" in page


def _gone(pid: int) -> bool:
    """No such process, or only its zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_value_of_results() -> None:
    assert value_of({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == "a\nb"
    assert value_of({"content": [], "structuredContent": {"x": 1}}) == {"x": 1}
    image = {"type": "image", "data": "AA==", "mimeType": "image/png"}
    assert value_of({"content": [image]}) == [image]


def test_nan_and_infinity_are_refused_before_anything_is_sent(calc: Any) -> None:
    pid = calc.pid
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"add\(\): argument 'a' is NaN or infinite, which JSON cannot carry"):
        calc.add(a=math.inf, b=1)
    with pytest.raises(ValueError, match=r"'b' is NaN or infinite"):
        calc.add(a=1, b=math.nan)
    with pytest.raises(ValueError, match=r"calc.add\(\): argument 'a' is NaN"):
        calc.call_tool("add", {"a": -math.inf, "b": 1})  # the raw form too
    assert time.monotonic() - started < 1.0  # refused at once, not a 60 s timeout
    assert calc.pid == pid and calc.session.restarts == 0  # the server never saw them
    model = calc.call({"id": "n", "function": {"name": "calc_add", "arguments": '{"a": NaN, "b": 1}'}})
    assert model["content"].startswith("error: ValueError: add(): argument 'a' is NaN or infinite")


def test_whole_floats_go_out_as_integers_and_fractions_are_refused(calc: Any) -> None:
    assert calc.echo(text="hi", times=2.0) == "hi hi"  # the server reads integers only: 2.0 would be ignored
    assert calc.call_tool("echo", {"text": "hi", "times": 2.0}) == "hi"  # the raw form sends what it is given
    with pytest.raises(TypeError, match=r"echo\(\): argument 'times' must be int, not float 2.5"):
        calc.echo(text="hi", times=2.5)
    message = calc.call({"id": "i", "function": {"name": "calc_echo", "arguments": '{"text": "hi", "times": 3.0}'}})
    assert message["content"] == "hi hi hi"
    assert calc.add(a=2.0, b=1) == {"sum": 3.0}  # a number parameter keeps its float


def test_null_means_not_given_for_optional_arguments_at_every_door(calc: Any) -> None:
    assert calc.echo(text="hi", times=None, case=None) == "hi"
    call = {"id": "z", "function": {"name": "calc_echo", "arguments": '{"text": "hi", "times": null, "case": null}'}}
    assert calc.call(call)["content"] == "hi"
    required = calc.call({"id": "r", "function": {"name": "calc_add", "arguments": '{"a": null, "b": 1}'}})
    assert required["content"].startswith("error: TypeError: add(): argument 'a' must be")  # null is a value there
    with pytest.raises(TypeError, match="must be"):
        calc.add(a=None, b=1)


def test_a_json_rpc_error_without_an_id_raises_at_once(tmp_path: Any) -> None:
    """A server that cannot read a request answers -32700 with id null: the call fails now, not after its timeout."""
    from flakebot_magic.clients.lifecycle import LogBuffer
    from flakebot_magic.clients.mcp import McpSession

    server = mcp_server(
        tmp_path / "server.py",
        """
        e = {'code': -32700, 'message': 'Parse error: expected value'}
        print(json.dumps({'jsonrpc': '2.0', 'id': None, 'error': e}), flush=True)
        """,
    )
    session = McpSession([sys.executable, str(server)], env=dict(os.environ), name="s", logs=LogBuffer())
    try:
        started = time.monotonic()
        with pytest.raises(ToolError, match=r"could not read the tools/list request: Parse error.*-32700"):
            session.request("tools/list", timeout=30)
        assert time.monotonic() - started < 5
    finally:
        session.stop()


def test_show_names_the_revision_the_server_spoke(calc: Any, fixture_settings: Any) -> None:
    """The demo server is a handshake one (2025-06-18): the client fell back from its server/discover probe, and
    says so in repr, in the display rows and, through the tool's record, in `flakebot show`."""
    from flakebot_magic.manage.tools import describe, show

    assert calc.add(a=1, b=1) == {"sum": 2.0}
    assert calc.revision == "2025-06-18" and "protocol: 2025-06-18 (initialize handshake)" in repr(calc)
    assert describe(fixture_settings, "calc")["protocol"] == "2025-06-18 (initialize handshake)"
    assert re.search(r"^protocol +2025-06-18 \(initialize handshake\)$", show(fixture_settings, "calc").text, re.M)
