"""The network side of an HTTP tool: a free loopback port, who listens where, a size-capped transport, its clients.

httpx is imported when a transport is made, not when this module is imported.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..errors import ToolError

if TYPE_CHECKING:
    import httpx

    from .lifecycle import ToolProcess

__all__ = [
    "MAX_RESPONSE_BYTES",
    "ClientPool",
    "ResponseTooLarge",
    "capped_transport",
    "free_port",
    "is_loopback",
    "listening_addresses",
]

#: the largest answer (body bytes as sent) read from a service
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class ResponseTooLarge(ToolError):
    """A service's answer passed :data:`MAX_RESPONSE_BYTES`; it was dropped."""


def capped_transport(inner: httpx.BaseTransport, limit: int, name: str) -> httpx.BaseTransport:
    """``inner``, with every response body cut off (:class:`ResponseTooLarge`) past ``limit`` bytes.

    The body is counted as sent, and its ``Content-Encoding`` is dropped, so
    httpx never inflates it: a small compressed answer cannot become a large
    one in memory (the client asks for ``identity`` anyway).
    """
    import httpx

    class CappedStream(httpx.SyncByteStream):
        def __init__(self, stream: httpx.SyncByteStream, what: str) -> None:
            self.stream = stream
            self.what = what

        def __iter__(self) -> Iterator[bytes]:
            size = 0
            for chunk in self.stream:
                size += len(chunk)
                if size > limit:
                    raise ResponseTooLarge(
                        f"{name}: the answer to {self.what} passed {limit // (1024 * 1024)} MiB; it was dropped. "
                        "Have the service write big results to a file and return its path."
                    )
                yield chunk

        def close(self) -> None:
            self.stream.close()

    class CappedTransport(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = inner.handle_request(request)
            declared = response.headers.get("content-length", "")
            what = f"{request.method} {request.url.path}"
            if declared.isdigit() and int(declared) > limit:
                response.close()
                raise ResponseTooLarge(
                    f"{name}: the answer to {what} is {int(declared)} bytes, past the "
                    f"{limit // (1024 * 1024)} MiB limit; it was not read."
                )
            if "content-encoding" in response.headers:
                del response.headers["content-encoding"]  # every one of them: httpx never inflates the body
            assert isinstance(response.stream, httpx.SyncByteStream)
            # the same response, its stream wrapped (no second Response and header list per call)
            response.stream = CappedStream(response.stream, what)
            return response

        def close(self) -> None:
            inner.close()

    return CappedTransport()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _decode_address(text: str) -> str:
    """``0100007F`` -> ``127.0.0.1``; 32 hex digits -> an IPv6 address (``/proc/net/tcp*`` form)."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def _listening_sockets() -> dict[str, tuple[str, int]]:
    """Socket inode -> (address, port) of every listening TCP socket of this network namespace (``/proc/net``)."""
    found: dict[str, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)
                for row in rows:
                    fields = row.split()
                    if len(fields) > 9 and fields[3] == "0A":
                        address, port = fields[1].split(":")
                        found[fields[9]] = (_decode_address(address), int(port, 16))
        except OSError:
            continue
    return found


def listening_addresses(pgid: int, *, beyond_loopback: bool = False) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process group ``pgid`` listens on (Linux ``/proc``).

    ``beyond_loopback``: only those not on loopback. The listening sockets are
    read first; the walk over every process's descriptors, which finds the
    group's, is made only when one of them is a candidate.
    """
    sockets = _listening_sockets()
    if beyond_loopback:
        sockets = {inode: where for inode, where in sockets.items() if not is_loopback(where[0])}
    if not sockets:
        return []
    inodes: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[2]) != pgid:
                    continue
            for fd in os.listdir(f"/proc/{entry}/fd"):
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except (OSError, IndexError, ValueError):
            continue
    return [where for inode, where in sockets.items() if inode in inodes]


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


class ClientPool:
    """The ``httpx.Client`` s of one start of the service: at most ``size``, each used by one call at a time.

    No thread ever closes a socket another thread uses: a client (and its
    one keep-alive connection) belongs to the call that took it until it is
    given back, and a retired client is closed by the call that had it, or
    at once when it was idle.
    """

    def __init__(self, make: Callable[[], httpx.Client], process: ToolProcess, size: int, first: httpx.Client) -> None:
        self.make = make
        self.process = process
        self.size = max(1, size)
        self.idle = [first]
        self.made = 1
        self.retired = False
        self.ready = threading.Condition()

    def take(self, timeout: float, name: str) -> httpx.Client | None:
        """A client for one call, waiting up to ``timeout`` s for a free one; None once retired."""
        deadline = time.monotonic() + timeout
        with self.ready:
            while True:
                if self.retired:
                    return None
                if self.idle:
                    return self.idle.pop()
                if self.made < self.size:
                    self.made += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ToolError(
                        f"{name}: all {self.size} connections to the service stayed busy for {timeout:g} s. "
                        "Make fewer calls at once, or raise the tool's max_connections if the service serves more."
                    )
                self.ready.wait(left)
        try:
            return self.make()
        except BaseException:
            with self.ready:
                self.made -= 1
                self.ready.notify()
            raise

    def give_back(self, client: httpx.Client) -> None:
        with self.ready:
            if not self.retired:
                self.idle.append(client)
                self.ready.notify()
                return
        client.close()

    def retire(self) -> None:
        """No call takes a client any more: the idle ones are closed now, the others by their calls."""
        with self.ready:
            self.retired = True
            idle, self.idle = self.idle, []
            self.ready.notify_all()
        for client in idle:
            client.close()
