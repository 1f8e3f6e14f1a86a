"""Every write to a pipe or a socket whose reader is untrusted ends by a deadline (issue 33, class D).

Red team 33: the deployed-MCP client answered a server's requests with a blocking write; a server that flooded
``ping`` and never read its stdin held a call with ``timeout=5`` for good (40 s and counting). The writers of
the class, each attacked here by a reader that never reads:

* ``clients/mcp_session.py``: a request, a notification, an answer to the server's own request (the call's
  deadline), and at most ``MAX_SERVER_REQUESTS`` server requests per call;
* ``host/exchange.py`` (every CLI tool call, the ``--help`` probe): input written by ``poll`` to the deadline;
* ``host/process.py``'s input writer (the runner's commands): by the run's deadline;
* ``agent/stdio.py`` (``flakebot mcp``'s stdout) and ``clients/bridge.py`` (the bridge's): ``PeerStream``;
* the confined HTTP service's forwarder: ``tests/sandbox/test_forward.py``; ``flakebot mcp --http``'s sockets:
  a socket timeout (``host/serving.py``), ``tests/agent/test_http_bounds.py``.

And the audit: every raw write in the package (``os.write``, ``sendall``, ``.send``) is one of the allowed.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from package_calls import PACKAGE, package_calls
from stdio_servers import mcp_server

from flakebot_magic.clients.lifecycle import LogBuffer
from flakebot_magic.clients.mcp import McpSession
from flakebot_magic.errors import ToolError


def _timed_request(
    session: McpSession, timeout: float, params: dict[str, object] | None = None
) -> tuple[float, object]:
    """Call ``tools/list`` in a thread; how long it took and what it gave (a hang is reported, then undone)."""
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(session.request("tools/list", params, timeout=timeout))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(timeout + 15)
    took = time.monotonic() - started
    if worker.is_alive():  # unblock it for the next test: the server dies, the write fails
        if session.pid:
            os.kill(session.pid, 9)
        worker.join(10)
        pytest.fail(f"a call with timeout={timeout} was still running after {took:.0f} s")
    return took, outcome[0]


def _session(tmp_path: Path, body: str) -> McpSession:
    server = mcp_server(tmp_path / "server.py", body)
    return McpSession([sys.executable, str(server)], env=dict(os.environ), name="s", logs=LogBuffer())


def test_a_ping_flood_that_never_reads_ends_the_call_in_its_time(tmp_path: Path) -> None:
    """Red team 33's attack: 200,000 pings, stdin never read again."""
    session = _session(
        tmp_path,
        """
        import time
        for i in range(200_000):
            sys.stdout.write(json.dumps({'jsonrpc': '2.0', 'id': f'p{i}', 'method': 'ping'}) + '\\n')
        sys.stdout.flush()
        time.sleep(3600)
        """,
    )
    try:
        took, outcome = _timed_request(session, 5)
        assert isinstance(outcome, ToolError), outcome
        assert took < 7, f"the call took {took:.1f} s with timeout=5"
        assert "requests of its own" in str(outcome) or "did not read" in str(outcome), outcome
    finally:
        session.stop()


def test_few_requests_with_huge_ids_fill_the_pipe_and_the_write_ends_at_the_deadline(tmp_path: Path) -> None:
    """Under the request cap: 30 pings whose ids are 1 MiB each; the answers (which repeat the ids) fill the
    server's stdin, which it never reads. The write to it ends at the call's deadline."""
    session = _session(
        tmp_path,
        """
        import time
        for i in range(30):
            sys.stdout.write(json.dumps({'jsonrpc': '2.0', 'id': f'{i}' + 'x' * (1 << 20), 'method': 'ping'}) + '\\n')
        sys.stdout.flush()
        time.sleep(3600)
        """,
    )
    try:
        took, outcome = _timed_request(session, 3)
        assert isinstance(outcome, ToolError) and "did not read" in str(outcome), outcome
        assert took < 5, f"the call took {took:.1f} s with timeout=3"
    finally:
        session.stop()


def test_a_request_larger_than_the_pipe_to_a_server_that_never_reads_ends_at_the_deadline(tmp_path: Path) -> None:
    session = _session(tmp_path, "import time; time.sleep(3600)")
    try:
        took, outcome = _timed_request(session, 3, {"blob": "y" * (8 << 20)})
        assert isinstance(outcome, ToolError), outcome
        assert took < 5, f"the call took {took:.1f} s with timeout=3"
    finally:
        session.stop()


def test_a_few_server_requests_are_still_answered(tmp_path: Path) -> None:
    """The cap is no wall for a server that asks a little: three pings, then the answer."""
    session = _session(
        tmp_path,
        """
        for i in range(3):
            print(json.dumps({'jsonrpc': '2.0', 'id': f'p{i}', 'method': 'ping'}), flush=True)
            assert json.loads(sys.stdin.readline())['id'] == f'p{i}'
        print(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': {'tools': []}}), flush=True)
        """,
    )
    try:
        _, outcome = _timed_request(session, 10)
        assert outcome == {"tools": []}, outcome
    finally:
        session.stop()


def test_the_exchange_writes_a_tools_input_by_the_deadline() -> None:
    """A CLI tool that never reads its 16 MiB of input: the call ends at its limit."""
    from flakebot_magic.host.exchange import Exchange

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    started = time.monotonic()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            Exchange(proc).run(b"z" * (16 << 20), 1.0)
        assert time.monotonic() - started < 3
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except BrokenPipeError:
                    pass


def test_the_runners_input_writer_stops_at_the_deadline() -> None:
    """``host/process.py``: the thread that writes a command's input, to a pipe whose reader outlived the command."""
    from flakebot_magic.host.process import _write_input

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.PIPE)
    try:
        started = time.monotonic()
        _write_input(proc, b"q" * (16 << 20), time.monotonic() + 0.5)
        assert time.monotonic() - started < 2
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("door", ["flakebot mcp (agent/stdio.py)", "the bridge (clients/bridge.py)"])
def test_a_server_whose_client_stops_reading_gives_up_on_it(door: str) -> None:
    """The stdio servers' writer: a client that reads nothing makes the write fail after the peer's time, and
    every later write at once (a build's progress never waits on it)."""
    from flakebot_magic.agent.stdio import StreamWriter
    from flakebot_magic.host.writes import PeerStream

    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "wb")
    try:
        if door.startswith("flakebot mcp"):
            writer = StreamWriter(stream, seconds=0.5)
            write = lambda: writer({"jsonrpc": "2.0", "method": "x", "params": {"pad": "p" * (1 << 20)}})  # noqa: E731
        else:
            peer = PeerStream(stream, seconds=0.5)
            write = lambda: peer.write(b"p" * (1 << 20) + b"\n")  # noqa: E731
        started = time.monotonic()
        with pytest.raises(OSError):
            write()
        assert time.monotonic() - started < 2
        started = time.monotonic()
        with pytest.raises(BrokenPipeError):
            write()
        assert time.monotonic() - started < 0.1
    finally:
        os.close(read_end)
        try:
            stream.close()
        except OSError:
            pass


def test_the_bridge_serves_through_the_bounded_writer() -> None:
    """The bridge's serve() writes its answers through PeerStream (structural: no raw stdout.write)."""
    source = (PACKAGE / "clients" / "bridge.py").read_text(encoding="utf-8")
    assert "PeerStream(stdout)" in source and "stdout.write(" not in source


#: every raw write of the package -> why it is bounded or not to an untrusted reader
ALLOWED_WRITES = {
    ("host/writes.py", "os.write"): "the bounded writer itself (poll to the deadline)",
    ("host/writes.py", "sendall"): "send_within: the socket's timeout set to what is left of the deadline",
    ("host/exchange.py", "os.write"): "a CLI tool's input, after poll said there is room, by the deadline",
    ("host/guard.py", "os.write"): "flakebot's own guard process, which reads its pipe",
    ("host/process.py", "os.write"): "the gate to flakebot's own guard",
    ("host/fsutil.py", "os.write"): "a file",
    ("edit/forks.py", "os.write"): "a file",
    ("records/journal.py", "os.write"): "a file (the journal, in the cache)",
    ("stages/deploy.py", "os.write"): "a file (the store entry)",
    ("records/units.py", "os.write"): "a file (a sealed dependency unit's object, in the cache)",
    ("clients/http.py", "send"): "httpx's Client.send: its timeouts bound the write (clients/http_net.py)",
    ("clients/http_openapi.py", "send"): "httpx's Client.send, as clients/http.py",
    ("clients/http_net.py", "send"): "httpcore's stream: the write timeout is clamped to the call's time",
}


def test_every_raw_write_in_the_package_is_a_bounded_one() -> None:
    found = set()
    for module, node in package_calls():
        if isinstance(node.func, ast.Attribute):
            holder = node.func.value
            name = f"{holder.id}.{node.func.attr}" if isinstance(holder, ast.Name) else node.func.attr
            if name == "os.write" or node.func.attr in ("sendall", "send"):
                found.add((module, "os.write" if name == "os.write" else node.func.attr))
    unlisted = sorted(found - set(ALLOWED_WRITES))
    assert unlisted == [], (
        "a raw write: write to an untrusted reader with host/writes.py (write_within, send_within, PeerStream), "
        f"or list why it is bounded: {unlisted}"
    )
    assert sorted(set(ALLOWED_WRITES) - found) == [], "allowances that match no write any more"
