"""The network side of an HTTP tool: a free loopback port, who listens where, its transports and clients.

A call's time limit bounds the whole call (issue 34): httpx's timeouts are per
operation (each read may wait the whole timeout, so an answer that trickles in
never ends). :func:`deadline_transport` is an ``httpx`` transport over
``httpcore``'s connection pool with a network backend of its own
(httpcore's documented extension point; httpx offers no total timeout): every
connect, read and write waits at most until the deadline of the call made on
this thread (:func:`call_deadline`), and fails with httpx's timeout error
past it. It speaks TCP, or HTTP over a Unix socket (``uds``: a confined
service, :mod:`flakebot_magic.sandbox.forward`).

httpx and httpcore are imported when a transport is made, not when this module is imported.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ToolError
from ..host.trees import remove_tree
from ..sandbox.forward import forwarder_command
from .base import Confinement

if TYPE_CHECKING:
    import httpx

    from .lifecycle import ToolProcess

__all__ = [
    "MAX_RESPONSE_BYTES",
    "ClientPool",
    "ResponseTooLarge",
    "ServiceLaunch",
    "call_deadline",
    "capped_transport",
    "confined_service",
    "deadline_transport",
    "free_port",
    "is_loopback",
    "listening_addresses",
    "swap_deadline",
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
        def __init__(self, stream: httpx.SyncByteStream, request: httpx.Request) -> None:
            self.stream = stream
            self.request = request  # named in the error only: its path is decoded then, not per call

        def __iter__(self) -> Iterator[bytes]:
            size = 0
            for chunk in self.stream:
                size += len(chunk)
                if size > limit:
                    what = f"{self.request.method} {self.request.url.path}"
                    raise ResponseTooLarge(
                        f"{name}: the answer to {what} passed {limit // (1024 * 1024)} MiB; it was dropped. "
                        "Have the service write big results to a file and return its path."
                    )
                yield chunk

        def close(self) -> None:
            self.stream.close()

    class CappedTransport(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = inner.handle_request(request)
            headers = response.headers
            declared = headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                response.close()
                raise ResponseTooLarge(
                    f"{name}: the answer to {request.method} {request.url.path} is {int(declared)} bytes, past the "
                    f"{limit // (1024 * 1024)} MiB limit; it was not read."
                )
            if "content-encoding" in headers:
                del headers["content-encoding"]  # every one of them: httpx never inflates the body
            assert isinstance(response.stream, httpx.SyncByteStream)
            # the same response, its stream wrapped (no second Response and header list per call)
            response.stream = CappedStream(response.stream, request)
            return response

        def close(self) -> None:
            inner.close()

    return CappedTransport()


#: the deadline (time.monotonic) of the call this thread is making, read by every connect, read and write
_CALL = threading.local()


def swap_deadline(at: float | None) -> float | None:
    """From now on every network operation of :func:`deadline_transport` on this thread ends by ``at`` (None: no
    deadline); returns the deadline it replaces, to be put back (a plain call: the hot path has no context manager)."""
    before: float | None = getattr(_CALL, "at", None)
    _CALL.at = at
    return before


@contextmanager
def call_deadline(at: float) -> Iterator[None]:
    """Within the block, every network operation of :func:`deadline_transport` on this thread ends by ``at``."""
    before = swap_deadline(at)
    try:
        yield
    finally:
        swap_deadline(before)


def deadline_transport(uds: str | None = None) -> httpx.BaseTransport:
    """A one-connection transport whose every operation ends by the call's deadline; over ``uds`` when given."""
    transport: httpx.BaseTransport = _deadline_classes()[0](uds)
    return transport


@cache
def _deadline_classes() -> tuple[type[Any], ...]:
    """The transport class and its helpers, made once (they subclass httpx's and httpcore's, imported now)."""
    import httpcore
    import httpx

    def clamp(timeout: float | None, late: type[Exception]) -> float | None:
        at: float | None = getattr(_CALL, "at", None)
        if at is None:
            return timeout
        left = at - time.monotonic()
        if left <= 0:
            raise late("the call's time limit passed")
        return left if timeout is None else min(timeout, left)

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: httpcore.NetworkStream) -> None:
            self.inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.inner.read(max_bytes, clamp(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.inner.write(buffer, clamp(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self.inner.close()

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def __init__(self) -> None:
            self.inner = httpcore.SyncBackend()

        def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Any = None,
        ) -> httpcore.NetworkStream:
            late = clamp(timeout, httpcore.ConnectTimeout)
            return Stream(self.inner.connect_tcp(host, port, late, local_address, socket_options))

        def connect_unix_socket(
            self, path: str, timeout: float | None = None, socket_options: Any = None
        ) -> httpcore.NetworkStream:
            late = clamp(timeout, httpcore.ConnectTimeout)
            return Stream(self.inner.connect_unix_socket(path, late, socket_options))

        def sleep(self, seconds: float) -> None:
            self.inner.sleep(seconds)

    core_errors = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, httpcore.ProxyError)

    def mapped(exc: Exception, request: httpx.Request) -> Exception:
        """httpcore's error as httpx's of the same name (what httpx's own transport raises)."""
        fallback = httpx.TimeoutException if isinstance(exc, httpcore.TimeoutException) else httpx.TransportError
        error: Exception = getattr(httpx, type(exc).__name__, fallback)(str(exc), request=request)
        return error

    class Body(httpx.SyncByteStream):
        def __init__(self, answer: httpcore.Response, request: httpx.Request) -> None:
            self.answer = answer
            self.request = request

        def __iter__(self) -> Iterator[bytes]:
            try:
                yield from self.answer.iter_stream()
            except core_errors as exc:
                raise mapped(exc, self.request) from exc

        def close(self) -> None:
            try:
                self.answer.close()
            except core_errors as exc:
                raise mapped(exc, self.request) from exc

    class Transport(httpx.BaseTransport):
        def __init__(self, uds: str | None) -> None:
            self.pool = httpcore.ConnectionPool(max_connections=1, uds=uds, network_backend=Backend())

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            url = request.url
            try:
                answer = self.pool.handle_request(
                    httpcore.Request(
                        method=request.method,
                        url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
                        headers=request.headers.raw,
                        content=request.stream,
                        extensions=request.extensions,
                    )
                )
            except core_errors as exc:
                raise mapped(exc, request) from exc
            return httpx.Response(
                status_code=answer.status,
                headers=answer.headers,
                stream=Body(answer, request),
                extensions=answer.extensions,
            )

        def close(self) -> None:
            self.pool.close()

    return Transport, Stream, Backend


@dataclass(frozen=True)
class ServiceLaunch:
    """How one start of a service runs: the command, its environment and directory, the descriptors it
    inherits, the Unix socket that reaches it (confined), and what to remove once it stopped."""

    argv: list[str]
    env: Mapping[str, str]
    cwd: Path | None = None
    fds: tuple[int, ...] = ()
    uds: str | None = None
    cleanup: Callable[[], None] = lambda: None


def confined_service(
    service: Sequence[str],
    port: int,
    binary: Path,
    store_path: Path,
    *env: Mapping[str, str] | None,
) -> ServiceLaunch:
    """``service`` (listening on ``127.0.0.1:port`` as its contract says) in the sandbox, reached by a Unix socket.

    The sandbox has a network namespace of its own: no host loopback, no
    network. A listening Unix socket in a private directory (``0700``) on the
    host is the one way in: its descriptor is handed to the forwarder
    (:mod:`flakebot_magic.sandbox.forward`) that starts the service in the
    sandbox and joins each connection to the service's port there. ``env``:
    what is added to the sandbox's environment.
    """
    sockets = Path(tempfile.mkdtemp(prefix="flakebot-svc-"))  # 0700: no other user may connect
    path = sockets / "http.sock"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(path))
            listener.listen(64)
            # above the descriptors the sandbox's own wrapper uses (the seccomp filter's is 3)
            fd = fcntl.fcntl(listener.fileno(), fcntl.F_DUPFD_CLOEXEC, 10)
        argv, shown = forwarder_command(fd, port, service)
        confinement = Confinement(binary, store_path, read_only=shown)
    except BaseException:
        remove_tree(sockets, ignore_errors=True)
        raise

    def cleanup() -> None:
        confinement.close()
        remove_tree(sockets, ignore_errors=True)

    return ServiceLaunch(
        confinement.command(argv), confinement.env(*env), confinement.scratch, (fd,), str(path), cleanup
    )


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


#: netlink's socket-diagnostics protocol and request (linux/sock_diag.h, linux/inet_diag.h)
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLMSG_ERROR, _NLMSG_DONE = 4, 20, 2, 3
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr


def _listening_sockets() -> dict[str, tuple[str, int]]:
    """Socket inode -> (address, port) of every listening TCP socket of this network namespace.

    Asked of the kernel by netlink (``sock_diag``, what ``ss -lt`` uses): it
    walks the listening sockets only, some 0.1 ms. ``/proc/net/tcp`` walks
    every socket's hash bucket: 16 ms here (3.5 ms of CPU time), for each
    recheck of a running service. Where netlink is refused, ``/proc/net``.
    """
    try:
        return _listening_by_netlink()
    except (OSError, struct.error, ValueError):
        return _listening_in_proc()


def _listening_by_netlink() -> dict[str, tuple[str, int]]:
    found: dict[str, tuple[str, int]] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG) as link:
        link.settimeout(5.0)
        for family in (socket.AF_INET, socket.AF_INET6):
            # struct inet_diag_req_v2: family, protocol, ext, pad, states, then an empty inet_diag_sockid (48 bytes)
            request = struct.pack("=BBBBI48x", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
            link.send(
                _HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0) + request
            )
            done = False
            while not done:
                data = link.recv(1 << 16)
                if not data:
                    raise OSError("netlink closed the socket-diagnostics dump")
                offset = 0
                while offset + _HEADER.size <= len(data):
                    length, kind = _HEADER.unpack_from(data, offset)[:2]
                    if kind == _NLMSG_DONE:
                        done = True
                        break
                    if kind == _NLMSG_ERROR or length < _HEADER.size + 72:
                        raise OSError(f"netlink answered message type {kind} ({length} bytes)")
                    # struct inet_diag_msg: family, state, timer, retrans, the sockid (sport, dport, src[16] ...),
                    # expires, rqueue, wqueue, uid, inode
                    message = offset + _HEADER.size
                    size = 4 if data[message] == socket.AF_INET else 16
                    port = int.from_bytes(data[message + 4 : message + 6], "big")
                    address = str(ipaddress.ip_address(data[message + 8 : message + 8 + size]))
                    inode = int.from_bytes(data[message + 68 : message + 72], sys.byteorder)
                    found[str(inode)] = (address, port)
                    offset += (length + 3) & ~3
    return found


def _listening_in_proc() -> dict[str, tuple[str, int]]:
    """:func:`_listening_sockets` read from ``/proc/net/tcp`` and ``tcp6``."""
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


def listening_addresses(
    pgid: int, *, beyond_loopback: bool = False, foreign: set[str] | None = None
) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process group ``pgid`` listens on (Linux ``/proc``).

    ``beyond_loopback``: only those not on loopback. The listening sockets are
    read first; the walk over every process's descriptors, which finds the
    group's, is made only when one of them is a candidate.

    ``foreign``: the inodes of listening sockets a walk found held by no
    process of the group, skipped; a walk adds those it finds so (kept by the
    caller for one group). A socket no process of the group held cannot become
    the group's later unless its holder hands it over (a process of the group
    inherits only what the group holds; a new socket has a new inode), so a
    recheck while another program listens beyond loopback (an sshd, a
    notebook server) reads ``/proc/net`` and walks no process.
    """
    sockets = _listening_sockets()
    if beyond_loopback:
        sockets = {inode: where for inode, where in sockets.items() if not is_loopback(where[0])}
    if foreign:
        sockets = {inode: where for inode, where in sockets.items() if inode not in foreign}
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
    if foreign is not None:
        foreign.update(inode for inode in sockets if inode not in inodes)
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
        #: a health check of this start is in flight (:meth:`~flakebot_magic.clients.http.HttpTool._check_health`)
        self.checking = False
        self.ready = threading.Condition()

    def take(self, timeout: float, name: str, limit: float | None = None) -> httpx.Client | None:
        """A client for one call, waiting up to ``timeout`` s for a free one; None once retired.

        ``limit``: the call's whole time limit, which the message names (default ``timeout``).
        """
        with self.ready:
            if self.idle and not self.retired:  # the common case: a client free, no deadline to reckon
                return self.idle.pop()
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
                        f"{name}: no answer within the call's time limit of {timeout if limit is None else limit:g} s: "
                        f"all {self.size} connections to the service stayed busy. Make fewer calls at once, "
                        "or raise the tool's max_connections if the service serves more."
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
