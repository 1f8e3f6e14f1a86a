"""The Python client of an HTTP service: started on 127.0.0.1 with a token, called with keep-alive.

:class:`HttpTool` starts the service at a free loopback port (given as
``PORT`` and ``--port``) with a random per-service token (``FLAKEBOT_TOKEN``),
polls its health path until it answers (with a deadline), and checks that it
listens on loopback only. The client is an ``httpx.Client`` bound to the base
URL and the token (``Authorization: Bearer ...``), keeping its connection
alive between calls::

    >>> svc.get("/greet", params={"name": "Ada"}).json()   # doctest: +SKIP
    {'greeting': 'Hello, Ada.'}

When the service serves ``/openapi.json``, each operation becomes a method
(:mod:`.http_openapi`) with a signature (path, query and JSON-body
parameters), returning the decoded JSON body and raising
:class:`~flakebot_magic.errors.ToolError` on an HTTP error status::

    >>> svc.greet(name="Ada")                               # doctest: +SKIP
    {'greeting': 'Hello, Ada.'}

Confined (``confine_tools``, and whenever flakebot starts it on its own
account: acceptance examples, the judge, eval's hidden checks, a build
reading its operations), the service runs in the sandbox with a network
namespace of its own: its ``127.0.0.1`` is not the host's, and it reaches no
host service, no network and no file of the user's. The client reaches it
through a Unix socket on the host whose descriptor the sandbox inherits
(:mod:`flakebot_magic.sandbox.forward`).

A call's time limit (``timeout``, read at the call: ``svc.timeout = 3`` after
``load`` applies) bounds the whole call from the moment it is made: waiting
for a turn while another call starts or restarts the service, the start
itself, waiting for a free connection, and every read and write
(:func:`~flakebot_magic.clients.http_net.call_deadline`). A call that gets no
answer in time has its service's health checked meanwhile: a service that
does not answer its health path within ``ready_timeout`` is hung, and is
stopped (the next call starts it again), never waited on.

Calls from several threads share at most :attr:`HttpTool.max_connections`
``httpx.Client`` s per start of the service, each with one keep-alive
connection and used by one call at a time. No thread ever closes a socket
another thread uses (httpx's own pool may close an expired connection a
second thread was just given; closing a socket another thread reads from
lets the kernel hand its number to the next socket: "Bad file descriptor",
or a read that waits for the whole timeout on somebody else's connection).
When a call finds the service dead, that start's clients are retired at
once, so no other call takes a connection to the dead service: the calls in
flight fail fast with a :class:`~flakebot_magic.errors.ToolError`, and the
next call starts the service again.

The service starts with the allowlisted environment (plus the ``tool_env``
setting and ``PORT``, ``HOST``, ``FLAKEBOT_TOKEN``). At each start the client
checks that a request without the token is refused (else the start fails
with a :class:`~flakebot_magic.errors.DeployError`: the service ignores its
token), and that every socket it listens on is a loopback one, again at every
later start. An answer may be at most
:data:`~flakebot_magic.clients.http_net.MAX_RESPONSE_BYTES` long.

httpx is imported when a service starts, not when flakebot_magic is imported.
"""

from __future__ import annotations

import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from ..errors import DeployError, ToolError
from ..host.deadline import Deadline
from . import lifecycle
from .agents import ToolFunction
from .base import StartedToolClient
from .http_net import (
    MAX_RESPONSE_BYTES,
    ClientPool,
    ServiceLaunch,
    call_deadline,
    capped_transport,
    confined_service,
    deadline_transport,
    free_port,
    listening_addresses,
    swap_deadline,
)
from .http_openapi import OpenApi, read_document
from .lifecycle import LogBuffer, ToolProcess

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpTool"]


class HttpTool(StartedToolClient):
    """A deployed HTTP service on 127.0.0.1: raw ``get``/``post``/... and methods from its OpenAPI.

    Parameters (besides :class:`~flakebot_magic.clients.base.ToolClient`'s)
    ----------
    contract
        Its health path and start deadline.
    env
        Extra environment for the service.
    transport
        An ``httpx`` transport for the client (tests).
    """

    kind = "http"
    server = True  # one process serves every call; confined, in its own network namespace behind a Unix socket
    noun, a_noun = "HTTP service", "an HTTP service"
    asked_by = re.compile(
        r"\bhttps?\b|\b(?:web|rest(?:ful)?|json)[ -]?(?:service|server|api|app)\b|\bservice\b|\bendpoints?\b|\bopenapi\b",
        re.I,
    )
    proxied = True
    contract_text = (
        "An http tool is a service that listens on 127.0.0.1 only, at the port given as --port PORT and "
        "in the PORT environment variable; it requires `Authorization: Bearer $FLAKEBOT_TOKEN` on every "
        'request except its health path (GET /health unless the table sets health = "/path"), and '
        "may describe its operations at GET /openapi.json."
    )
    member = "operation"

    #: the largest answer read (bytes)
    max_response = MAX_RESPONSE_BYTES
    #: the most connections the client keeps to the service at once; more concurrent calls wait for a free one.
    #: Small services serve each keep-alive connection with one worker until it closes (tiny_http starts 4 and,
    #: when connections arrive together, can leave a fifth unserved): more connections than workers would
    #: starve a call for the whole timeout. Set it higher, before the first call, for a service that scales.
    max_connections = 4

    def __init__(self, *args: Any, transport: httpx.BaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._transport = transport
        self._logs = LogBuffer()
        self._process: ToolProcess | None = None
        self._clients: ClientPool | None = None
        self._lock = threading.RLock()
        self._functions: dict[str, ToolFunction] | None = None
        self.openapi: dict[str, Any] | None = None
        self.base_url = ""
        self.port: int | None = None
        self.token = ""
        self.restarts = 0
        #: the running start is in the sandbox (reached through :attr:`socket_path`)
        self.confined_start = False
        self.socket_path = ""
        self._cleanup: Callable[[], None] = lambda: None
        self._loopback_checked = 0.0
        #: listening sockets beyond loopback that the current start's group was found not to hold
        self._foreign: set[str] = set()

    # -- lifecycle -------------------------------------------------------------

    def _take_turn(self, deadline: Deadline | None) -> None:
        """Take the lock, waiting no later than ``deadline`` (a call's: another call may be starting the service)."""
        if self._lock.acquire(blocking=False):  # the common case: nobody starting, no deadline to reckon
            return
        wait = -1.0 if deadline is None else deadline.left()
        if not self._lock.acquire(timeout=wait):
            raise ToolError(
                f"{self.name}: no answer within {deadline}: another call was starting, "
                "restarting or stopping the service all that time. Pass a larger timeout=... if it is just slow "
                "to start.",
                stderr=self.logs(20),
            )

    def start(self, deadline: Deadline | None = None) -> HttpTool:
        """Start the service (if it is not running), wait until it is healthy, read its OpenAPI.

        ``deadline``: a call's, which the start must meet too (by default, that of the call running on this
        thread, if any: a call whose lookup of an operation starts the service).
        """
        self.require_binary()
        lifecycle.register(self)
        deadline = deadline or Deadline.current()
        self._take_turn(deadline)
        try:
            if self.running and self._clients is not None:
                return self
            if self._process is not None:
                self.restarts += 1
                self._logs.append(
                    f"flakebot: restarting {self.name} (it exited with status {self._process.returncode})\n"
                )
                self._retire()
                self._stop_process(deadline)  # reaps it, removes a confined start's sockets; within the call
            for attempt in range(2):
                try:
                    self._start_once(deadline)
                    break
                except _PortTaken:
                    if attempt:
                        raise ToolError(
                            f"{self.name}: could not listen on a free port twice in a row. Its output:\n{self.logs(20)}"
                        ) from None
            # a confined start is reached through this kernel's socket alone: no URL or token for anyone else
            url, token = ("", "") if self.confined_start else (self.base_url, self.token)
            self._state(status="running", pid=self.pid, url=url, started=time.time(), token=token)
            if self._functions is None:
                self._read_operations(deadline)
        finally:
            self._lock.release()
        return self

    def _read_operations(self, deadline: Deadline | None) -> None:
        """Read the OpenAPI document into functions; within a call, by its deadline (else at a later start)."""
        left = None if deadline is None else max(0.001, deadline.left())
        document = read_document(lambda path: self.get(path, **({} if left is None else {"timeout": left})))
        if deadline is not None and deadline.expired:
            return  # cut short by the call's time limit: read it whole next time, never as "no operations"
        self.openapi = document
        taken = {name for name in dir(type(self)) if not name.startswith("_")}
        operations = OpenApi(document or {}, name=self.name, health=self.contract.health, send=self.request)
        self._functions = operations.functions(taken)

    def _launch(self, port: int, token: str, confined: bool) -> ServiceLaunch:
        """How the service starts now: as the user with the allowlisted environment, or in the sandbox.

        Confined, it has a network namespace of its own (no host loopback, no
        network) and the sandbox's empty ``$HOME``, and is reached through a Unix
        socket (:func:`~flakebot_magic.clients.http_net.confined_service`).
        """
        service = [str(self.binary), "--port", str(port)]
        # the allowlist and tool_env: nothing else of the kernel's environment (no API key) passes
        extra = {"PORT": str(port), "FLAKEBOT_TOKEN": token, "HOST": "127.0.0.1"}
        if not confined:
            return ServiceLaunch(service, self._environment(extra))
        return confined_service(service, port, self.binary, self.store_path, self.env, extra)

    def _start_once(self, deadline: Deadline | None) -> None:
        import httpx

        port = free_port()
        token = secrets.token_urlsafe(24)
        confined = self.confined_now
        launch = self._launch(port, token, confined)
        process = ToolProcess(
            launch.argv, env=launch.env, logs=self._logs, stdio=False, cwd=launch.cwd, pass_fds=launch.fds
        )
        try:
            process.start()
        except BaseException:
            launch.cleanup()
            raise
        finally:
            for fd in launch.fds:  # the service holds them now
                socket.close(fd)
        self._foreign = set()  # a new group: what another start's group did not hold proves nothing of this one
        base_url = f"http://127.0.0.1:{port}"

        def make() -> httpx.Client:
            return httpx.Client(
                base_url=base_url,
                headers={"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"},
                timeout=None,  # a call's deadline bounds each of its operations; the start's checks pass their own
                trust_env=False,  # a proxy from the environment must never see loopback traffic or the token
                transport=capped_transport(
                    self._transport or deadline_transport(launch.uds), self.max_response, self.name
                ),
            )

        client = make()
        try:
            with call_deadline(deadline.at) if deadline is not None else nullcontext():
                self._wait_ready(client, process, deadline)
                if self._transport is None and not confined:
                    self._check_loopback(process)
                self._check_token_required(client, process)
        except BaseException:
            client.close()
            process.stop(deadline=deadline or Deadline(_GIVE_UP, "a failed start's stop"))  # at once: it failed
            launch.cleanup()
            raise
        self._process, self.base_url, self.port = process, base_url, port
        self.confined_start, self.socket_path, self._cleanup = confined, launch.uds or "", launch.cleanup
        self._clients = ClientPool(make, process, self.max_connections, client)
        self.token = token

    def _check_token_required(self, client: httpx.Client, process: ToolProcess) -> None:
        """A request without the token (and one with a wrong token) must be refused: 401 or 403."""
        import httpx

        probe = "/openapi.json" if self.contract.health != "/openapi.json" else "/"
        for credentials in (None, f"Bearer {secrets.token_urlsafe(24)}"):
            request = client.build_request("GET", probe, timeout=min(self.contract.ready_timeout, 10.0))
            del request.headers["Authorization"]
            if credentials is not None:
                request.headers["Authorization"] = credentials
            try:
                answer = client.send(request)
            except (httpx.HTTPError, ToolError) as exc:
                raise DeployError(
                    f"{self.name}: GET {probe} without its token failed ({exc}) instead of being refused; "
                    f"the service was stopped. Its output:\n{self.logs(20).strip() or '(none)'}"
                ) from exc
            if answer.status_code not in (401, 403):
                what = "without the token" if credentials is None else "with a wrong token"
                raise DeployError(
                    f"{self.name} ignores its token: GET {probe} {what} answered {answer.status_code}, "
                    "not 401 or 403, so anyone on this machine could use it; the service was stopped. "
                    "An http tool must refuse every request but its health check unless it carries "
                    "`Authorization: Bearer $FLAKEBOT_TOKEN` (see docs/tool-contract.md)."
                )

    def _wait_ready(self, client: httpx.Client, process: ToolProcess, deadline: Deadline | None) -> None:
        import httpx

        health = self.contract.health
        ready = Deadline(self.contract.ready_timeout, "its ready_timeout")
        until = ready if deadline is None else deadline.within(self.contract.ready_timeout, "its ready_timeout")
        pause = 0.005
        while True:
            if not process.alive:
                status = process.stop(deadline=until)
                tail = self.logs(20)
                if "address already in use" in tail.lower() or "addrinuse" in tail.lower():
                    raise _PortTaken()
                raise ToolError(
                    f"{self.name}: the service exited (status {status}) before {health} answered. "
                    f"It must listen on 127.0.0.1 at the port given as --port and in PORT, and require "
                    f"FLAKEBOT_TOKEN (see docs/tool-contract.md). Its output:\n{tail.strip() or '(none)'}",
                    returncode=status,
                    stderr=tail,
                )
            try:
                answer = client.get(health, timeout=max(0.001, until.wait(1.0)))
                if answer.status_code < 500:
                    return
            except httpx.TransportError:
                pass
            if until.expired:
                if until is deadline:
                    raise ToolError(
                        f"{self.name}: the service was starting, and GET {health} did not answer within {deadline}; "
                        "the service was stopped at once. Start it first (.start(), or load the tool), or pass "
                        f"a larger timeout=... Its output:\n{self.logs(20).strip() or '(none)'}",
                        stderr=self.logs(20),
                    )
                raise ToolError(
                    f"{self.name}: GET {health} did not answer within {self.contract.ready_timeout:g} s; "
                    f"the service was stopped. Raise ready_timeout in [package.metadata.flakebot] if it is just "
                    f"slow to start. Its output:\n{self.logs(20).strip() or '(none)'}",
                    stderr=self.logs(20),
                )
            time.sleep(until.wait(pause))
            pause = min(pause * 2, 0.1)

    #: seconds between the checks of the service's listening sockets while it runs
    loopback_recheck = 1.0

    def _check_loopback(self, process: ToolProcess) -> None:
        assert process.pid is not None
        self._loopback_checked = time.monotonic()
        exposed = listening_addresses(process.pid, beyond_loopback=True, foreign=self._foreign)
        if exposed:
            where = ", ".join(f"{a}:{p}" for a, p in exposed)
            raise ToolError(
                f"{self.name} listens on {where}, beyond loopback; it was stopped. An http tool must bind "
                "127.0.0.1 only (see docs/tool-contract.md)."
            )

    def _retire(self) -> None:
        """Retire the current clients (the caller holds the lock): later calls get the next start's."""
        if self._clients is not None:
            self._clients.retire()
            self._clients = None

    def _stop_process(self, deadline: Deadline | None = None) -> None:
        """Stop the current start's process (the caller holds the lock) and remove what it was given; within a
        call, at once and by its ``deadline``."""
        if self._process is not None:
            self._process.stop(deadline=deadline)
        cleanup, self._cleanup = self._cleanup, lambda: None
        cleanup()

    def stop(self) -> None:
        """Stop the service on purpose: the next call starts a new one, which is not a restart."""
        with self._lock:
            was_running = self.running
            self._retire()
            self._stop_process()
            self._process = None
            if was_running:
                self._state(status="stopped", pid=None, url="", token="")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.alive

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running and self._process is not None else None

    def logs(self, last: int | None = None) -> str:
        return self._logs.text(last)

    # -- raw requests ----------------------------------------------------------

    def _call_error(
        self, exc: Exception, method: str, path: str, clients: ClientPool, limit: float
    ) -> ToolError | None:
        """The :class:`ToolError` a failed request becomes (None: ``exc`` is no ``httpx`` error, it goes as it is).

        When the service is found dead, its clients are retired at once; when it did not answer in time, its
        health is checked meanwhile (:meth:`_check_health`).
        """
        import httpx

        if isinstance(exc, httpx.TimeoutException):
            self._check_health(clients)
            return ToolError(
                f"{self.name}: {method} {path} got no answer within its time limit of {limit:g} s ({exc}). "
                "Pass a larger timeout=... if the work is just slow; a service that does not answer its health "
                "check either is stopped, and the next call starts it again.",
                stderr=self.logs(20),
            )
        if not isinstance(exc, httpx.HTTPError):
            return None
        process = clients.process
        if not process.alive:
            with self._lock:  # no other call may take a connection to the dead service
                clients.retire()
                if self._clients is clients:
                    self._clients = None
        alive = "is running" if process.alive else f"exited (status {process.returncode}); the next call starts it"
        return ToolError(
            f"{self.name}: {method} {path} failed: {exc}. The service {alive}; "
            f"its output:\n{self.logs(20).strip() or '(none)'}",
            stderr=self.logs(20),
        )

    def _check_health(self, clients: ClientPool) -> None:
        """In the background, once per start: GET the health path; no answer within ``ready_timeout`` (the time a
        start gives it) means the service is hung, and it is stopped (the next call starts it again)."""
        with self._lock:
            if clients.retired or clients.checking:
                return
            clients.checking = True

        def check() -> None:
            import httpx

            healthy = False
            try:
                with clients.make() as client:
                    healthy = client.get(self.contract.health, timeout=self.contract.ready_timeout).status_code < 500
            except (httpx.HTTPError, ToolError):
                pass
            finally:
                clients.checking = False
            if healthy:
                return
            with self._lock:
                if self._clients is not clients or not self.running:
                    return  # restarted or stopped meanwhile
                self._logs.append(
                    f"flakebot: {self.name} did not answer GET {self.contract.health} within "
                    f"{self.contract.ready_timeout:g} s after a call timed out: it is hung, and was stopped "
                    "(the next call starts it again)\n"
                )
                self._retire()
                self._stop_process(Deadline(_GIVE_UP, "a hung service's stop"))  # kept: the next start is a restart
                self._state(status="stopped", pid=None, url="", token="")

        threading.Thread(target=check, name=f"flakebot-health-{self.name}", daemon=True).start()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send one request (``httpx.Client.request`` arguments); return the ``httpx.Response``.

        Starts the service first when it is not running. ``timeout=`` (seconds;
        default :attr:`timeout`) bounds the whole call, the start included. An
        interrupted request stops the service (the next call starts it again).
        """
        given = kwargs.pop("timeout", None)
        limit = float(given) if isinstance(given, (int, float)) and not isinstance(given, bool) else self.timeout
        deadline = Deadline.of_call(limit)
        limit = deadline.limit
        while True:
            self._take_turn(deadline)
            try:
                if not self.running or self._clients is None:
                    self.start(deadline)
                elif (
                    self._transport is None
                    and not self.confined_start
                    and self._process is not None
                    and time.monotonic() - self._loopback_checked > self.loopback_recheck
                ):
                    # a service may open another socket after its start: it must stay on loopback
                    try:
                        self._check_loopback(self._process)
                    except ToolError:
                        self.stop()
                        raise
                clients = self._clients
            finally:
                self._lock.release()
            assert clients is not None
            client = clients.take(deadline.left(), self.name, limit)
            if client is not None:
                break  # else the service was restarted while this call waited: take one of the new clients
        before = swap_deadline(deadline.at)  # every read and write of this call ends by its deadline
        try:
            # no per-request timeout to build: every connect, read and write is held to the deadline below it
            return client.request(method, path, **kwargs)
        except KeyboardInterrupt:
            self._logs.append(f"flakebot: {method.upper()} {path} interrupted; {self.name} stopped\n")
            self.stop()
            raise
        except Exception as exc:  # an httpx error becomes a ToolError (a plain try: no context manager per call)
            error = self._call_error(exc, method.upper(), path, clients, limit)
            if error is None:
                raise
            raise error from exc
        finally:
            swap_deadline(before)
            clients.give_back(client)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", path, **kwargs)

    # -- the tool's face -------------------------------------------------------

    def example(self) -> str:
        functions = self._functions or {}
        first = next(iter(functions.values()), None)
        return first.example if first is not None else f'{self.name}.get("/")'

    @property
    def where(self) -> str:
        """Where the running service answers, in words."""
        if not self.running:
            return "stopped"
        if self.confined_start:
            return f"in the sandbox (no network; reached through {self.socket_path}), pid {self.pid}"
        return f"{self.base_url}, pid {self.pid}"

    def _usage_notes(self) -> list[str]:
        return [
            f"The service runs {self.where if self.running else '(not started)'} (loopback only) and requires "
            "its token, which the client sends. Raw requests: "
            f'`{self.name}.get("/path", params=...)`, `{self.name}.post("/path", json=...)` return an '
            f"`httpx.Response`. `{self.name}.logs()` shows its output; `{self.name}.stop()` stops it.",
            "",
            *super()._usage_notes(),
        ]

    def _rows(self) -> list[tuple[str, str]]:
        return [*super()._rows(), ("service", self.where)]

    def __repr__(self) -> str:
        if self._functions is None:
            names = "(read from /openapi.json when it first starts)"
        else:
            names = ", ".join(self._functions) or "(none: no /openapi.json)"
        return f"{super().__repr__()}\n  operations: {names}\n  service: {self.where}"


#: seconds a stop flakebot decides on its own (a hung service, a failed start outside a call) may wait for readers
_GIVE_UP = 2.0


class _PortTaken(Exception):
    """The free port was taken between choosing it and the service binding it."""
