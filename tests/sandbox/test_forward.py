"""The confined HTTP service's forwarder never waits on one peer (issue 33, class C/D; ``sandbox/forward.py``).

The forwarder joins each connection of the host's Unix socket to the service's port. Before issue 33 it wrote
to each side with a blocking ``sendall``: a service that stopped reading one request held the forwarder, and
with it every other connection, the host's next calls included, until the service died. Here it runs as it runs
in the sandbox (the same script, the same argv), outside one: the service is a small Python server on this
machine's loopback.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot_magic.sandbox.forward import forwarder_command

#: a service: a connection that starts with "S" is never read again; any other gets one line back per line
SERVICE = textwrap.dedent(
    """
    import socket, sys, threading
    listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
    def serve(conn):
        first = conn.recv(1)
        if first == b"S":
            threading.Event().wait()  # holds the connection, reads nothing more
        data = first
        while True:
            while b"\\n" in data:
                line, _, data = data.partition(b"\\n")
                conn.sendall(b"echo " + line + b"\\n")
            more = conn.recv(65536)
            if not more:
                return
            data += more
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
    """
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def forwarded(tmp_path: Path) -> Iterator[str]:
    """A running forwarder in front of SERVICE: the path of its Unix socket."""
    port = _free_port()
    service = tmp_path / "service.py"
    service.write_text(SERVICE, encoding="utf-8")
    path = Path(tempfile.mkdtemp(prefix="fwd-", dir=tmp_path)) / "s"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    argv, _ = forwarder_command(listener.fileno(), port, [sys.executable, str(service), str(port)])
    proc = subprocess.Popen(argv, pass_fds=(listener.fileno(),))
    listener.close()
    try:
        deadline = time.monotonic() + 10
        while True:  # the service is up once a line comes back through the forwarder
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.settimeout(2)
                    probe.connect(str(path))
                    probe.sendall(b"up\n")
                    if probe.recv(100).startswith(b"echo up"):
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the service did not come up behind the forwarder"
            time.sleep(0.1)
        yield str(path)
    finally:
        proc.kill()
        proc.wait(10)


def test_a_peer_that_stops_reading_holds_only_its_own_connection(forwarded: str) -> None:
    stalled = socket.socket(socket.AF_UNIX)
    stalled.connect(forwarded)
    stalled.setblocking(False)
    sent = 0
    try:
        stalled.sendall(b"S")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # 64 MiB offered to a service that reads none of it
            try:
                sent += stalled.send(b"x" * 65536)
            except BlockingIOError:
                time.sleep(0.01)
            if sent > 64 << 20:
                break
        with socket.socket(socket.AF_UNIX) as other:
            other.settimeout(5)
            started = time.monotonic()
            other.connect(forwarded)
            other.sendall(b"hello\n")
            answer = other.recv(100)
            took = time.monotonic() - started
        assert answer.startswith(b"echo hello"), answer
        assert took < 2, f"another connection waited {took:.1f} s behind the stalled one"
        assert sent < 16 << 20, f"the forwarder took {sent} bytes for a peer that reads nothing (its buffer is capped)"
    finally:
        stalled.close()


def test_traffic_larger_than_a_buffer_arrives_whole_and_in_order(forwarded: str) -> None:
    """Non-blocking writes and capped buffers lose nothing: 1.8 MB each way, written while it is read."""
    lines = b"".join(b"%08d\n" % i for i in range(200_000))
    wanted = b"".join(b"echo %08d\n" % i for i in range(200_000))
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(forwarded)
        conn.setblocking(False)
        got = bytearray()
        offset = 0
        deadline = time.monotonic() + 30
        while len(got) < len(wanted) and time.monotonic() < deadline:
            if offset < len(lines):
                try:
                    offset += conn.send(lines[offset : offset + 65536])
                except BlockingIOError:
                    pass
            try:
                got += conn.recv(1 << 20)
            except BlockingIOError:
                time.sleep(0.001)
    assert bytes(got) == wanted
