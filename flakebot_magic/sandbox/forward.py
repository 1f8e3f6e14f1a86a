"""A service in the sandbox, reached from the host through a Unix socket: the forwarder that runs beside it.

A confined service has a network namespace of its own (bubblewrap's
``--unshare-net``): a loopback that is not the host's, and nothing else. It
listens there, on ``127.0.0.1:PORT`` as its contract says, and no host
process can reach that port. So flakebot makes a listening Unix socket on
the host (in a private directory), hands its descriptor into the sandbox,
and :data:`FORWARDER` runs there as the command's first process: it starts
the service (without the descriptor), accepts each connection on the socket
and joins it to ``127.0.0.1:PORT`` inside, and exits with the service's exit
status when the service ends. The host speaks HTTP over the Unix socket
(``httpx``/``httpcore``'s ``uds``); the sandbox gets no host path to write and
no route to the host's network.

The forwarder is flakebot's own code, but it runs beside the service, so it
is trusted with nothing: whatever it does, it does in the sandbox. It runs on
the Python that runs flakebot (``-I -S``: no site, no environment, no user
directory), whose installation the sandbox shows read-only when it is not
already a system directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["FORWARDER", "forwarder_command"]

#: the forwarder's source: argv is (listening fd, port, the service's argv...); stdlib only, run with -I -S
FORWARDER = r"""
import os, selectors, signal, socket, subprocess, sys
listener = socket.socket(fileno=int(sys.argv[1]))
listener.setblocking(False)
port = int(sys.argv[2])
service = subprocess.Popen(sys.argv[3:], close_fds=True)
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, lambda signum, frame: service.send_signal(signum))
# one thread, one selector: no thread waits for another's turn at the interpreter
watch = selectors.DefaultSelector()
watch.register(listener, selectors.EVENT_READ, None)
try:
    ended = os.pidfd_open(service.pid)
    watch.register(ended, selectors.EVENT_READ, None)
except (AttributeError, OSError):
    ended = None
peers = {}

def drop(sock):
    for one in (sock, peers.pop(sock, None)):
        if one is not None:
            peers.pop(one, None)
            try:
                watch.unregister(one)
            except (KeyError, ValueError):
                pass
            one.close()

while True:
    for key, _ in watch.select(None if ended is not None else 0.5):
        if key.fileobj is listener:
            try:
                client, _ = listener.accept()
            except OSError:
                continue
            try:
                inside = socket.create_connection(("127.0.0.1", port))
            except OSError:
                client.close()
                continue
            inside.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for one, other in ((client, inside), (inside, client)):
                one.setblocking(False)
                peers[one] = other
                watch.register(one, selectors.EVENT_READ, None)
        elif key.fileobj is ended:
            status = service.wait()
            os._exit(128 - status if status < 0 else status)
        elif key.fileobj in peers:
            source = key.fileobj
            try:
                data = source.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                drop(source)
                continue
            sink = peers[source]
            try:
                sink.setblocking(True)
                sink.sendall(data)
                sink.setblocking(False)
            except OSError:
                drop(source)
    if ended is None and service.poll() is not None:
        os._exit(128 - service.returncode if service.returncode < 0 else service.returncode)
"""


def _python() -> tuple[str, tuple[str, ...]]:
    """The interpreter that runs the forwarder, and what the sandbox must show of it (beyond its system dirs)."""
    executable = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    shown = () if prefix in ("/usr", "/") else (prefix,)
    return executable, shown


def forwarder_command(listening_fd: int, port: int, service: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """The command that runs ``service`` behind the forwarder, and the paths to show read-only for it.

    ``listening_fd``: a listening Unix socket's descriptor, passed to the
    command (``pass_fds``); ``port``: where the service listens inside its
    network namespace (it is given ``--port PORT`` and ``PORT`` by its caller).
    """
    python, shown = _python()
    return [python, "-I", "-S", "-c", FORWARDER, str(listening_fd), str(port), *service], shown
