"""Attacks through an HTTP tool that does not guard itself: no token check, a wrong-token pass, a late public bind.

A service that answers without its per-start token can be used by any process
on the machine (another user's, a web page's through a DNS rebind): the start
must fail with a ``DeployError`` and the service must be gone. A service that
opens a socket beyond loopback after its start is caught at a later request.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.contract import ToolContract
from flakebot_magic.clients.http import HttpTool
from flakebot_magic.clients.http_net import listening_addresses
from flakebot_magic.errors import DeployError, ToolError

_SERVICE = """
import hmac, os, sys, socket, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer
MODE = sys.argv[1]
open(os.environ["PIDFILE"], "w").write(str(os.getpid()))
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        given = self.headers.get("Authorization", "")
        expected = "Bearer " + os.environ["FLAKEBOT_TOKEN"]
        if MODE == "ignores":
            allowed = True
        elif MODE == "any-token":  # checks that a token is there, not that it is the right one
            allowed = given.startswith("Bearer ")
        else:
            allowed = hmac.compare_digest(given, expected)
        if self.path != "/health" and not allowed:
            self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers(); return
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
if MODE == "late-public-bind":
    def expose():
        time.sleep(1.0)
        public = socket.socket(); public.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        public.bind(("0.0.0.0", 0)); public.listen()
        open(os.environ["MARKER"], "w").close()
        time.sleep(3600)
    threading.Thread(target=expose, daemon=True).start()
port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def service(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[HttpTool] = []

    def make(mode: str) -> HttpTool:
        script = tmp_path / "bin" / "svc"
        script.parent.mkdir(parents=True, exist_ok=True)
        # the mode is baked in: flakebot starts the binary with --port only
        script.write_text(f"#!{sys.executable}\nimport sys\nsys.argv.insert(1, {mode!r})\n{_SERVICE}")
        script.chmod(0o755)
        tool = HttpTool(
            name="guard",
            binary=script,
            crate="svc",
            version="1",
            source_hash="0",
            store_path=tmp_path,
            contract=ToolContract(kind="http", bin="svc"),
            env={"MARKER": str(tmp_path / "exposed"), "PIDFILE": str(tmp_path / "pid")},
        )
        made.append(tool)
        return tool

    yield make
    for tool in made:
        tool.close()
        lifecycle.unregister(tool)


@pytest.mark.parametrize(("mode", "what"), [("ignores", "without the token"), ("any-token", "with a wrong token")])
def test_a_service_that_ignores_its_token_is_refused(
    service,
    tmp_path: Path,
    mode: str,
    what: str,  # type: ignore[no-untyped-def]
) -> None:
    tool = service(mode)
    with pytest.raises(DeployError, match=rf"guard ignores its token: GET /openapi.json {what} answered 200"):
        tool.start()
    assert not tool.running
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):  # the process is gone, not just forgotten
        os.kill(pid, 0)


def test_a_service_that_checks_its_token_starts(service) -> None:  # type: ignore[no-untyped-def]
    tool = service("checks")
    assert tool.start().get("/x").text == "ok"


def test_a_service_that_binds_beyond_loopback_later_is_stopped(service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tool = service("late-public-bind")
    tool.loopback_recheck = 0.0
    tool.start()
    pid = tool.pid
    assert tool.get("/x").text == "ok"
    deadline = time.monotonic() + 30
    while not (tmp_path / "exposed").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert pid is not None and any(a == "0.0.0.0" for a, _ in listening_addresses(pid))
    with pytest.raises(ToolError, match=r"listens on 0\.0\.0\.0:\d+, beyond loopback; it was stopped"):
        tool.get("/x")
    assert not tool.running
