"""The HTTP client: a real service (tests/fixtures/demo-http) built by the pipeline, and scripted misbehaving ones."""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kindtools import SLOW_SERVICE, script_service

from flakebot_magic.clients.agents import strict_problems
from flakebot_magic.clients.http import HttpTool
from flakebot_magic.clients.http_net import listening_addresses
from flakebot_magic.errors import ToolError
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.testing.overlay import fixture_crates_buildable

# -- the fixture service ---------------------------------------------------------------


@pytest.mark.cargo
@pytest.mark.skipif(not fixture_crates_buildable(), reason="needs serde_json and tiny_http: run `make install`")
class TestDemoService:
    def test_started_on_loopback_with_a_token(self, svc: Any) -> None:
        # the build read its operations in the sandbox and left nothing running: it starts at the first use
        assert isinstance(svc, HttpTool) and svc.kind == "http" and not svc.running
        assert "operations: add, fail, greet" in repr(svc) and "service: stopped" in repr(svc)
        svc.start()
        assert svc.running
        assert svc.base_url == f"http://127.0.0.1:{svc.port}"
        assert listening_addresses(svc.pid) == [("127.0.0.1", svc.port)]
        with httpx.Client(trust_env=False) as anonymous:
            assert anonymous.get(f"{svc.base_url}/health").status_code == 200  # open, for readiness
            refused = anonymous.get(f"{svc.base_url}/greet", params={"name": "x"})
            assert refused.status_code == 401
            wrong = anonymous.get(
                f"{svc.base_url}/greet", params={"name": "x"}, headers={"Authorization": "Bearer nope"}
            )
            assert wrong.status_code == 401
        assert len(svc.token) >= 32

    def test_raw_requests_return_httpx_responses(self, svc: Any) -> None:
        answer = svc.get("/greet", params={"name": "Ada"})
        assert isinstance(answer, httpx.Response)
        assert answer.json() == {"greeting": "Hello, Ada."}
        assert svc.post("/add", json={"a": 1, "b": 2}).json() == {"sum": 3.0}
        assert svc.get("/nowhere").status_code == 404  # raw requests do not raise on a status

    def test_connections_are_kept_alive(self, svc: Any) -> None:
        ports = set()
        for _ in range(5):
            answer = svc.get("/pid")
            ports.add(answer.extensions["network_stream"].get_extra_info("client_addr")[1])
        assert len(ports) == 1

    def test_methods_from_openapi(self, svc: Any) -> None:
        assert set(svc.functions()) == {"greet", "add", "get_item", "fail", "pid_"}
        greet = inspect.signature(svc.greet)
        assert list(greet.parameters) == ["name", "excited"]
        assert greet.parameters["excited"].default is None
        assert "who to greet" in svc.greet.__doc__ and "GET /greet" in svc.greet.__doc__
        assert svc.greet("Ada") == {"greeting": "Hello, Ada."}
        assert svc.greet(name="Ada Lovelace", excited=True) == {"greeting": "Hello, Ada Lovelace!"}
        assert svc.add(a=1.5, b=2) == {"sum": 3.5}
        assert svc.get_item(7) == {"id": 7, "name": "item 7"}
        with pytest.raises(TypeError, match="'item_id' must be int"):
            svc.get_item("seven")

    def test_an_error_status_raises_tool_error(self, svc: Any) -> None:
        with pytest.raises(ToolError, match=r"svc.fail: HTTP 422 from POST /fail: \{\"error\":\"nope\"\}") as caught:
            svc.fail("nope")
        assert caught.value.status == 422
        with pytest.raises(ToolError) as missing:
            svc.get_item(500)
        assert missing.value.status == 404

    def test_a_dead_service_is_restarted_with_a_new_port_and_token(self, svc: Any) -> None:
        svc.start()
        port, token, pid = svc.port, svc.token, svc.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while svc.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert svc.greet("again") == {"greeting": "Hello, again."}
        assert svc.pid != pid and svc.restarts == 1
        assert (svc.port, svc.token) != (port, token)

    def test_stop_and_the_inventory_status(self, svc: Any, fixture_settings: Any) -> None:
        inventory = Inventory(fixture_settings.cache.tools)
        # built (or found built, and stopped by the test before): not running until the first call
        assert inventory.get("svc").status in ("ready", "stopped")  # type: ignore[union-attr]
        assert not svc.running
        assert svc.greet("x")  # the first call starts it
        record = inventory.get("svc")
        assert record is not None and record.kind == "http" and record.status == "running"
        assert record.url == svc.base_url and record.pid == svc.pid
        svc.stop()
        assert not svc.running
        assert inventory.get("svc").status == "stopped"  # type: ignore[union-attr]
        assert "demo-http: listening on 127.0.0.1" in svc.logs()

    def test_for_agents(self, svc: Any) -> None:
        tools = svc.openai_tools()
        assert sorted(t["function"]["name"] for t in tools) == [
            "svc_add",
            "svc_fail",
            "svc_get_item",
            "svc_greet",
            "svc_pid_",
        ]
        for tool in tools:
            assert strict_problems(tool["function"]["parameters"]) == []
        message = svc.call(
            {"id": "c1", "function": {"name": "svc_greet", "arguments": json.dumps({"name": "Bo", "excited": None})}}
        )
        assert message == {"role": "tool", "tool_call_id": "c1", "content": '{"greeting": "Hello, Bo."}'}
        bridge = svc.mcp_config()["mcpServers"]["svc"]
        assert bridge["command"] == sys.executable
        assert bridge["args"][:4] == ["-m", "flakebot_magic.clients.bridge", "--name", "svc"]
        assert bridge["args"][-1] == str(svc.binary)
        assert "svc.greet(name='text')" in svc.usage()

    def test_eight_threads_survive_the_service_being_killed_thirty_times(self, svc: Any) -> None:
        """Calls in flight when the service dies fail fast (ToolError), later ones restart it; none waits 1 s."""
        restarts = svc.restarts
        rounds = [_KillRound(svc).run() for _ in range(30)]
        assert [r.unexpected for r in rounds if r.unexpected] == []  # an answer or a ToolError, nothing else
        assert all(r.answered_after_kill for r in rounds), "the service was not started again after a kill"
        waited = sorted(w for r in rounds for w in r.waited)
        assert waited[-1] < 1.0, waited[-5:]
        assert svc.restarts - restarts >= 30
        assert not any("Bad file descriptor" in message for r in rounds for message in r.failures)


class _KillRound:
    """Eight threads calling ``svc`` while it is killed once; what each call saw, and how long after the kill."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        self.killed_at = 0.0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.unexpected: list[str] = []
        self.failures: list[str] = []
        self.waited: list[float] = []  # seconds a call took after the kill (from the kill, or from its start)
        self.answered_after_kill = 0

    def calls(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            ok = False
            try:
                ok = self.svc.greet("Ada") == {"greeting": "Hello, Ada."}
            except ToolError as exc:
                with self.lock:
                    self.failures.append(str(exc))
            except Exception as exc:
                with self.lock:
                    self.unexpected.append(repr(exc))
            ended = time.monotonic()
            with self.lock:
                if self.killed_at and ended > self.killed_at:
                    self.waited.append(ended - max(started, self.killed_at))
                    self.answered_after_kill += ok

    def run(self) -> _KillRound:
        self.svc.start()
        threads = [threading.Thread(target=self.calls, daemon=True) for _ in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(0.05)
        pid = self.svc.pid
        with self.lock:
            self.killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        self.stop.set()
        for thread in threads:
            thread.join(timeout=10)
        assert not any(thread.is_alive() for thread in threads), "a call hung"
        return self


# -- services that break the contract (Python scripts stand in for the binary) ----------------


def _service(tmp_path: Path, body: str, **contract: Any) -> HttpTool:
    return script_service(tmp_path, body, **contract)


_SERVE = """
import hmac, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        expected = "Bearer " + os.environ["FLAKEBOT_TOKEN"]
        if self.path != "/health" and not hmac.compare_digest(self.headers.get("Authorization", ""), expected):
            self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers(); return
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer((HOST, port), Handler).serve_forever()
"""


def test_a_service_beyond_loopback_is_stopped(tmp_path: Path) -> None:
    tool = _service(tmp_path, 'HOST = "0.0.0.0"' + _SERVE)
    try:
        with pytest.raises(ToolError, match=r"listens on 0\.0\.0\.0:\d+, beyond loopback; it was stopped"):
            tool.start()
        assert not tool.running
    finally:
        tool.close()


def test_a_service_that_exits_says_why(tmp_path: Path) -> None:
    tool = _service(tmp_path, 'import sys\nprint("no token for me", file=sys.stderr)\nsys.exit(4)\n')
    try:
        with pytest.raises(ToolError, match=r"exited \(status 4\) before /health answered") as caught:
            tool.start()
        assert "no token for me" in caught.value.stderr and caught.value.returncode == 4
    finally:
        tool.close()


def test_a_service_that_never_gets_ready_times_out(tmp_path: Path) -> None:
    tool = _service(tmp_path, "import time\ntime.sleep(60)\n", ready_timeout=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(ToolError, match=r"GET /health did not answer within 0.5 s"):
            tool.start()
        assert time.monotonic() - started < 5
        assert not tool.running
    finally:
        tool.close()


def test_a_service_without_openapi_still_has_raw_requests(tmp_path: Path) -> None:
    tool = _service(tmp_path, 'HOST = "127.0.0.1"' + _SERVE)
    try:
        tool.start()
        assert tool.functions() == {}
        assert tool.get("/anything").text == "ok"
        assert tool.openai_tools() == []
    finally:
        tool.close()


_SLOW = SLOW_SERVICE


def test_an_interrupted_request_stops_the_service(tmp_path: Path) -> None:
    import threading

    tool = _service(tmp_path, _SLOW)
    try:
        tool.start()
        pid = tool.pid
        main = threading.main_thread().ident
        assert main == threading.get_ident() and pid is not None
        timer = threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT))  # type: ignore[arg-type]
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                tool.get("/slow")
        finally:
            timer.cancel()
        assert not tool.running
        assert tool.get("/fast").text == "ok"  # started again
        assert tool.pid != pid
    finally:
        tool.close()
