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

#: the forwarder's source: argv is (listening fd, port, the service's argv...); stdlib only, run with -I -S.
#: Every socket is non-blocking and each direction has a buffer of at most CAP bytes: a side that does not read
#: (a service that never reads its request) stops the reading of its own peer only, never the forwarder: before
#: issue 33 one blocking ``sendall`` to such a service held every other connection, the host's calls included.
#: A connection whose peer closed is closed once what was left for it is written; at most MAX_PAIRS at once.
FORWARDER = r"""
import os, selectors, signal, socket, subprocess, sys
listener = socket.socket(fileno=int(sys.argv[1]))
listener.setblocking(False)
port = int(sys.argv[2])
service = subprocess.Popen(sys.argv[3:], close_fds=True)
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(number, lambda signum, frame: service.send_signal(signum))
CAP = 1 << 20
MAX_PAIRS = 256
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
# one thread, one selector: no thread waits for another's turn at the interpreter
watch = selectors.DefaultSelector()
watch.register(listener, READ, None)
try:
    ended = os.pidfd_open(service.pid)
    watch.register(ended, READ, None)
except (AttributeError, OSError):
    ended = None
peers = {}  # each side -> the other
owed = {}  # each side -> the bytes still to write to it
ended_by_peer = set()  # sides whose peer closed: closed once what is owed to them is written
masks = {}

def mask(one, wanted):
    old = masks.get(one, 0)
    if wanted == old:
        return
    if not old:
        watch.register(one, wanted, None)
    elif not wanted:
        watch.unregister(one)
    else:
        watch.modify(one, wanted, None)
    if wanted:
        masks[one] = wanted
    else:
        masks.pop(one, None)

def update(one):
    if one not in peers:
        return
    other = peers[one]
    reads = one not in ended_by_peer and other in peers and len(owed[other]) < CAP
    mask(one, (READ if reads else 0) | (WRITE if owed[one] else 0))

def drop(sock):
    for one in (sock, peers.get(sock)):
        if one is not None and one in peers:
            mask(one, 0)
            peers.pop(one, None)
            owed.pop(one, None)
            ended_by_peer.discard(one)
            one.close()

def flush(one):
    try:
        sent = one.send(owed[one])
    except (BlockingIOError, InterruptedError):
        sent = 0
    except OSError:
        drop(one)
        return
    del owed[one][:sent]
    if not owed[one] and one in ended_by_peer:
        drop(one)
        return
    update(one)
    update(peers[one])

while True:
    for key, events in watch.select(None if ended is not None else 0.5):
        source = key.fileobj
        if source is listener:
            try:
                client, _ = listener.accept()
            except OSError:
                continue
            if len(peers) >= 2 * MAX_PAIRS:
                client.close()
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
                owed[one] = bytearray()
            update(client)
            update(inside)
        elif source is ended:
            status = service.wait()
            os._exit(128 - status if status < 0 else status)
        elif source in peers:
            if events & WRITE:
                flush(source)
            if not events & READ or source not in peers:
                continue
            try:
                data = source.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            sink = peers[source]
            if sink not in peers:  # its peer is gone: what it still sends has nowhere to go
                continue
            if not data:  # this side closed: the other gets what is owed to it, then is closed too
                mask(source, 0)
                peers.pop(source, None)
                owed.pop(source, None)
                source.close()
                ended_by_peer.add(sink)
                if owed.get(sink):
                    update(sink)
                else:
                    drop(sink)
                continue
            owed[sink] += data
            flush(sink)
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
