"""A threaded server that bounds its connections before it knows who is on them (issue 33, class C).

``socketserver``'s threaded servers give each connection a thread and wait on it without end: a local process
that opens connections and sends half a request line holds a thread and a descriptor each, for good. Once the
descriptors run out nobody is accepted, the person's authenticated agent included, and ``accept`` failing with
``EMFILE`` spins the accept loop on a CPU (red team 33: 256 idle sockets locked ``flakebot mcp --http`` out).

:class:`BoundedServer` (a mixin before ``ThreadingHTTPServer``) bounds, before authentication:

* **how many**: at most :data:`MAX_CONNECTIONS` connections are held; a new one past that closes the oldest one
  that has not yet shown the token (:meth:`BoundedServer.admit`), so idle strangers cannot crowd out the agent,
  and when every one held is admitted the new one is closed at once;
* **how long a request's head may take**: its request line and headers must be in within
  :data:`HEAD_SECONDS` of the wait for them (a slow drip of bytes does not reset it);
* **how long a kept-alive connection may sit idle**: :data:`IDLE_SECONDS` before its next request;
* **the body**: :meth:`BoundedServer.limit` gives the handler a deadline for reading it;
* **accept failing** for want of descriptors: the pending connection is taken with a descriptor kept in
  reserve and closed, so the loop sleeps in ``select`` instead of spinning.

One thread (the *reaper*) shuts a connection down when its deadline passes; the handler blocked on it reads
the end of the stream and finishes. Each socket also has a timeout (:data:`IDLE_SECONDS`) for any one read or
write, so an admitted client that stops reading an event stream is dropped too.
"""

from __future__ import annotations

import errno
import os
import socket
import socketserver
import threading
import time
from typing import Any

__all__ = ["BODY_SECONDS", "HEAD_SECONDS", "IDLE_SECONDS", "MAX_CONNECTIONS", "BoundedServer"]

#: connections held at once
MAX_CONNECTIONS = 64
#: seconds a request's line and headers may take to arrive, from the moment the server waits for them
HEAD_SECONDS = 10.0
#: seconds an admitted connection may wait for its next request; also any one read or write on a socket
IDLE_SECONDS = 60.0
#: seconds a request's body may take to arrive
BODY_SECONDS = 30.0


class BoundedServer(socketserver.ThreadingMixIn):
    """Mixin for a ``socketserver`` TCP server (put it first): see the module's doc."""

    max_connections = MAX_CONNECTIONS
    #: the listen backlog: ``socketserver``'s 5 drops a burst's sixth connection for a 1 s SYN retry, the agent's too
    request_queue_size = 128
    head_seconds = HEAD_SECONDS
    idle_seconds = IDLE_SECONDS

    def server_activate(self) -> None:
        super().server_activate()  # type: ignore[misc]
        #: each held connection -> [accepted at, admitted, deadline or None]
        self._held: dict[socket.socket, list[Any]] = {}
        self._guard = threading.Condition()
        self._reserve = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self._reaping = True
        self._reaper = threading.Thread(target=self._reap, name="flakebot-server-reaper", daemon=True)
        self._reaper.start()

    # -- the accept loop's side ------------------------------------------------------------

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()  # type: ignore[misc,no-any-return]
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._shed()
            raise

    def _shed(self) -> None:
        """Out of descriptors: take the waiting connection with the reserve one and close it (no spin)."""
        os.close(self._reserve)
        try:
            sock, _ = self.socket.accept()  # type: ignore[attr-defined]
            sock.close()
        except OSError:
            time.sleep(0.05)  # whatever it is, the loop does not spin on it
        finally:
            self._reserve = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._guard:
            if len(self._held) >= self.max_connections:
                strangers = sorted((entry[0], id(s), s) for s, entry in self._held.items() if not entry[1])
                if not strangers:  # every one held has shown the token: the newcomer waits for its own retry
                    self._close(request)
                    return
                self._cut(strangers[0][2])
                self._held.pop(strangers[0][2], None)
            self._held[request] = [time.monotonic(), False, time.monotonic() + self.head_seconds]
            self._guard.notify()
        request.settimeout(self.idle_seconds)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._guard:
            self._held.pop(request, None)
        super().shutdown_request(request)  # type: ignore[misc]

    def server_close(self) -> None:
        with self._guard:
            self._reaping = False
            self._guard.notify()
        super().server_close()
        if self._reserve >= 0:
            os.close(self._reserve)
            self._reserve = -1

    # -- the handlers' side --------------------------------------------------------------

    def limit(self, request: Any, seconds: float | None) -> None:
        """Give ``request``'s connection a deadline ``seconds`` from now (None: none, it is being answered)."""
        with self._guard:
            entry = self._held.get(request)
            if entry is not None:
                entry[2] = None if seconds is None else time.monotonic() + seconds
                self._guard.notify()

    def admit(self, request: Any) -> None:
        """``request``'s connection showed the token: it is never closed to make room, and has no deadline."""
        with self._guard:
            entry = self._held.get(request)
            if entry is not None:
                entry[1] = True
                entry[2] = None

    def admitted(self, request: Any) -> bool:
        with self._guard:
            entry = self._held.get(request)
            return bool(entry and entry[1])

    @property
    def held(self) -> int:
        """How many connections the server holds now."""
        with self._guard:
            return len(self._held)

    # -- the reaper --------------------------------------------------------------------------

    def _reap(self) -> None:
        with self._guard:
            while self._reaping:
                now = time.monotonic()
                due = [s for s, entry in self._held.items() if entry[2] is not None and entry[2] <= now]
                for sock in due:
                    self._held[sock][2] = None
                    self._cut(sock)
                pending = [entry[2] for entry in self._held.values() if entry[2] is not None]
                self._guard.wait(max(0.01, min(pending) - now) if pending else None)

    @staticmethod
    def _cut(sock: socket.socket) -> None:
        """End the connection: the handler blocked on it reads the end and finishes (its thread closes it)."""
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    @staticmethod
    def _close(sock: socket.socket) -> None:
        try:
            sock.close()
        except OSError:
            pass
