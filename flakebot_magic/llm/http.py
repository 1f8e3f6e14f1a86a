"""The HTTP connection of one model conversation, which another thread can cut mid-request.

A model's reply takes seconds to minutes. When a run is cancelled, or the
manager of a speculative session stops a candidate that can no longer win,
the request in flight must end now, not when the model answers. A blocked
``recv`` does not wake when its socket is closed from another thread, but it
does on ``shutdown``. :class:`ModelHTTP` is an ``httpx`` client whose every
request opens its own connection (no keep-alive: a model request is seconds,
a connect is milliseconds), remembers its socket through httpcore's ``trace``
hook, and :meth:`ModelHTTP.stop` shuts those sockets down. A request made after
``stop`` fails at once with :class:`ModelStopped`, which the ``openai`` SDK
does not retry (it retries only its own request errors).
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import httpx

from ..errors import Cancelled

__all__ = ["ModelHTTP", "ModelStopped"]


class ModelStopped(Cancelled):
    """The conversation was stopped (a cancel, or the manager stopped this candidate) while it talked to the model."""


class _Transport(httpx.BaseTransport):
    def __init__(self, owner: ModelHTTP) -> None:
        self.owner = owner
        self.inner = httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        owner = self.owner
        owner.check()
        earlier = request.extensions.get("trace")

        def trace(event: str, info: dict[str, Any]) -> None:
            if event == "connection.connect_tcp.complete":
                stream = info.get("return_value")
                sock = stream.get_extra_info("socket") if stream is not None else None
                if isinstance(sock, socket.socket):
                    owner.track(sock)
            if earlier is not None:
                earlier(event, info)

        request.extensions["trace"] = trace
        try:
            return self.inner.handle_request(request)
        except Exception as exc:
            owner.check(exc)
            raise

    def close(self) -> None:
        self.inner.close()


class ModelHTTP:
    """An ``httpx.Client`` for one conversation (pass :attr:`client` to ``openai.OpenAI(http_client=...)``).

    Examples
    --------
    >>> http = ModelHTTP(timeout=30)
    >>> http.stop("the run was cancelled")
    >>> http.stopped
    True
    >>> http.close()
    """

    def __init__(self, *, timeout: float) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._reason = ""
        self.client = httpx.Client(transport=_Transport(self), timeout=timeout)

    @property
    def stopped(self) -> bool:
        return bool(self._reason)

    def track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets = [s for s in self._sockets if s.fileno() != -1]
            self._sockets.append(sock)
            stopped = self.stopped
        if stopped:  # stopped while this connection opened
            _shut(sock)

    def check(self, cause: BaseException | None = None) -> None:
        """Raise :class:`ModelStopped` once :meth:`stop` was called."""
        if self._reason:
            raise ModelStopped(f"Stopped while waiting for the model: {self._reason}.") from cause

    def stop(self, reason: str = "stopped") -> None:
        """End the request in flight (if any) and refuse further ones; safe from any thread, idempotent."""
        with self._lock:
            self._reason = self._reason or reason
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)

    def close(self) -> None:
        self.client.close()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass
