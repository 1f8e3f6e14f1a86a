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
with a signature (path, query and JSON-body parameters), returning the decoded
JSON body and raising :class:`~flakebot_magic.errors.ToolError` on an HTTP
error status::

    >>> svc.greet(name="Ada")                               # doctest: +SKIP
    {'greeting': 'Hello, Ada.'}

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

import json
import secrets
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..errors import DeployError, ToolError
from ..host.fsutil import load_json
from . import lifecycle
from .agents import ToolFunction
from .base import StartedToolClient
from .contract import ToolContract
from .http_net import (
    MAX_RESPONSE_BYTES,
    ClientPool,
    capped_transport,
    free_port,
    listening_addresses,
)
from .lifecycle import LogBuffer, ToolProcess
from .schema import docstring_of, example_value, make_function, params_of, python_name
from .schema_shape import well_typed

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpTool"]

_METHODS = ("get", "post", "put", "patch", "delete")


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
    member = "operation"

    #: the largest answer read (bytes)
    max_response = MAX_RESPONSE_BYTES
    #: the most connections the client keeps to the service at once; more concurrent calls wait for a free one.
    #: Small services serve each keep-alive connection with one worker until it closes (tiny_http starts 4 and,
    #: when connections arrive together, can leave a fifth unserved): more connections than workers would
    #: starve a call for the whole timeout. Set it higher, before the first call, for a service that scales.
    max_connections = 4

    def __init__(
        self,
        *args: Any,
        contract: ToolContract | None = None,
        transport: httpx.BaseTransport | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.contract = contract or ToolContract(kind="http", bin=self.binary.name)
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
        self._loopback_checked = 0.0
        #: listening sockets beyond loopback that the current start's group was found not to hold
        self._foreign: set[str] = set()

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> HttpTool:
        """Start the service (if it is not running), wait until it is healthy, read its OpenAPI."""
        self.require_binary()
        lifecycle.register(self)
        with self._lock:
            if self.running and self._clients is not None:
                return self
            if self._process is not None:
                self.restarts += 1
                self._logs.append(
                    f"flakebot: restarting {self.name} (it exited with status {self._process.returncode})\n"
                )
                self._retire()
                self._process.stop()  # reaps it and closes its pipes
            for attempt in range(2):
                try:
                    self._start_once()
                    break
                except _PortTaken:
                    if attempt:
                        raise ToolError(
                            f"{self.name}: could not listen on a free port twice in a row. Its output:\n{self.logs(20)}"
                        ) from None
            self._state(status="running", pid=self.pid, url=self.base_url, started=time.time(), token=self.token)
            if self._functions is None:
                self.openapi = self._read_openapi()
                self._functions = self._build_functions(self.openapi or {})
        return self

    def _start_once(self) -> None:
        import httpx

        port = free_port()
        token = secrets.token_urlsafe(24)
        # the allowlist and tool_env: nothing else of the kernel's environment (no API key) passes
        env = self._environment({"PORT": str(port), "FLAKEBOT_TOKEN": token, "HOST": "127.0.0.1"})
        process = ToolProcess([str(self.binary), "--port", str(port)], env=env, logs=self._logs, stdio=False)
        process.start()
        self._foreign = set()  # a new group: what another start's group did not hold proves nothing of this one
        base_url = f"http://127.0.0.1:{port}"

        def make() -> httpx.Client:
            return httpx.Client(
                base_url=base_url,
                headers={"Authorization": f"Bearer {token}", "Accept-Encoding": "identity"},
                timeout=self.timeout,
                trust_env=False,  # a proxy from the environment must never see loopback traffic or the token
                transport=capped_transport(
                    self._transport or httpx.HTTPTransport(limits=httpx.Limits(max_connections=1)),
                    self.max_response,
                    self.name,
                ),
            )

        client = make()
        try:
            self._wait_ready(client, process)
            if self._transport is None:
                self._check_loopback(process)
            self._check_token_required(client, process)
        except BaseException:
            client.close()
            process.stop()
            raise
        self._process, self.base_url, self.port = process, base_url, port
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

    def _wait_ready(self, client: httpx.Client, process: ToolProcess) -> None:
        import httpx

        health = self.contract.health
        deadline = time.monotonic() + self.contract.ready_timeout
        pause = 0.005
        while True:
            if not process.alive:
                status = process.stop()
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
                answer = client.get(health, timeout=1.0)
                if answer.status_code < 500:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ToolError(
                    f"{self.name}: GET {health} did not answer within {self.contract.ready_timeout:g} s; "
                    f"the service was stopped. Raise ready_timeout in [package.metadata.flakebot] if it is just "
                    f"slow to start. Its output:\n{self.logs(20).strip() or '(none)'}",
                    stderr=self.logs(20),
                )
            time.sleep(pause)
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

    def stop(self) -> None:
        with self._lock:
            was_running = self.running
            self._retire()
            if self._process is not None:
                self._process.stop()
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

    def _call_error(self, exc: Exception, method: str, path: str, clients: ClientPool) -> ToolError | None:
        """The :class:`ToolError` a failed request becomes (None: ``exc`` is no ``httpx`` error, it goes as it is).

        When the service is found dead, its clients are retired at once.
        """
        import httpx

        if isinstance(exc, httpx.TimeoutException):
            return ToolError(
                f"{self.name}: {method} {path} got no answer within its time limit ({exc}). "
                "Pass a larger timeout=... if the work is just slow.",
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

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send one request (``httpx.Client.request`` arguments); return the ``httpx.Response``.

        Starts the service first when it is not running. An interrupted
        request stops the service (the next call starts it again).
        """
        while True:
            with self._lock:
                if not self.running or self._clients is None:
                    self.start()
                elif (
                    self._transport is None
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
            assert clients is not None
            client = clients.take(self.timeout, self.name)
            if client is not None:
                break  # else the service was restarted while this call waited: take one of the new clients
        try:
            return client.request(method, path, **kwargs)
        except KeyboardInterrupt:
            self._logs.append(f"flakebot: {method.upper()} {path} interrupted; {self.name} stopped\n")
            self.stop()
            raise
        except Exception as exc:  # an httpx error becomes a ToolError (a plain try: no context manager per call)
            error = self._call_error(exc, method.upper(), path, clients)
            if error is None:
                raise
            raise error from exc
        finally:
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

    # -- OpenAPI ---------------------------------------------------------------

    def _read_openapi(self) -> dict[str, Any] | None:
        try:
            answer = self.get("/openapi.json")
        except ToolError:
            return None
        if answer.status_code != 200:
            return None
        try:
            document = load_json(answer.content)
        except ValueError:
            return None
        return document if isinstance(document, dict) and isinstance(document.get("paths"), dict) else None

    def _resolve(self, schema: Any, depth: int = 0) -> Any:
        """Inline local ``$ref``s (``#/components/schemas/X``) of the OpenAPI document."""
        if depth > 20:
            return {}
        if isinstance(schema, Mapping):
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/"):
                target: Any = self.openapi or {}
                for part in ref[2:].split("/"):
                    target = target.get(part, {}) if isinstance(target, Mapping) else {}
                return self._resolve(target, depth + 1)
            return {k: self._resolve(v, depth + 1) for k, v in schema.items()}
        if isinstance(schema, list):
            return [self._resolve(v, depth + 1) for v in schema]
        return schema

    def _build_functions(self, document: Mapping[str, Any]) -> dict[str, ToolFunction]:
        taken = {name for name in dir(type(self)) if not name.startswith("_")}
        functions: dict[str, ToolFunction] = {}
        for path, item in (document.get("paths") or {}).items():
            if not isinstance(item, Mapping) or path in (self.contract.health, "/openapi.json"):
                continue
            shared = item.get("parameters") or []
            for method in _METHODS:
                operation = item.get(method)
                if not isinstance(operation, Mapping):
                    continue
                fn = self._operation(
                    str(path), method, self._resolve(operation), self._resolve(shared), taken | set(functions)
                )
                if fn is not None:
                    functions[fn.name] = fn
        return functions

    def _operation(
        self, path: str, method: str, operation: Mapping[str, Any], shared: list[Any], taken: set[str]
    ) -> ToolFunction | None:
        raw_name = operation.get("operationId") or f"{method}_{path}"
        name = python_name(str(raw_name), taken)
        properties: dict[str, Any] = {}
        required: list[str] = []
        where: dict[str, str] = {}  # wire name -> "path" | "query" | "body" | "whole-body"
        for parameter in [*shared, *(operation.get("parameters") or [])]:
            if not isinstance(parameter, Mapping) or parameter.get("in") not in ("path", "query"):
                continue
            if not isinstance(parameter.get("name"), str):
                continue
            wire = parameter["name"]
            schema = well_typed(parameter.get("schema")) or {"type": "string"}
            if isinstance(parameter.get("description"), str):
                schema.setdefault("description", parameter["description"])
            properties[wire] = schema
            where[wire] = str(parameter["in"])
            if parameter.get("required") or parameter.get("in") == "path":
                required.append(wire)
        given = operation.get("requestBody")
        request_body: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        content = request_body.get("content")
        body = content.get("application/json") if isinstance(content, Mapping) else None
        if isinstance(body, Mapping):
            schema = body.get("schema") or {}
            fields = schema.get("properties") if isinstance(schema, Mapping) else None
            if isinstance(fields, Mapping) and fields:
                for wire, sub in fields.items():
                    if wire in properties:
                        continue  # a query parameter of the same name wins
                    properties[wire] = sub
                    where[wire] = "body"
                    named = schema.get("required")
                    if isinstance(named, list) and wire in named:
                        required.append(wire)
            else:
                properties["body"] = schema or {}
                where["body"] = "whole-body"
                if request_body.get("required"):
                    required.append("body")
        # the one place the service's schemas are taken in (any JSON): the shapes schema.py reads, or dropped
        parameters = well_typed({"type": "object", "properties": properties, "required": required})
        description = str(operation.get("summary") or operation.get("description") or f"{method.upper()} {path}")
        params = params_of(parameters)
        example_args = ", ".join(f"{p.name}={example_value(p.schema)!r}" for p in params if p.required)
        example = f"{self.name}.{name}({example_args})"
        verb = method.upper()

        def send(arguments: dict[str, Any]) -> Any:
            url = path
            query: dict[str, Any] = {}
            payload: dict[str, Any] = {}
            whole: Any = None
            for wire, value in arguments.items():
                place = where.get(wire)
                if value is None and place in ("path", "query"):
                    continue  # null is "not given" (docs/tool-contract.md); a URL cannot carry it anyway
                if place == "path":
                    url = url.replace("{" + wire + "}", quote(_query_text(value), safe=""))
                elif place == "query":
                    query[wire] = (
                        [_query_text(v) for v in value] if isinstance(value, (list, tuple)) else _query_text(value)
                    )
                elif place == "body":
                    payload[wire] = value
                elif place == "whole-body":
                    whole = value
            options: dict[str, Any] = {"params": query} if query else {}
            if whole is not None:
                options["json"] = whole
            elif payload or any(p == "body" for p in where.values()):
                options["json"] = payload
            answer = self.request(verb, url, **options)
            return self._decode(answer, f"{self.name}.{name}", verb, url)

        doc = docstring_of(
            f"{description}\n\n{verb} {path} on the service.",
            params,
            "object\n    The decoded JSON body (or the text of a non-JSON answer).",
            "ToolError\n    The service answered with an HTTP error status (``status``), or failed.\n"
            "TypeError, ValueError\n    An argument does not fit the operation's schema (checked before sending).",
            example,
        )
        function = make_function(name, parameters, send, doc=doc, qualname=f"{self.name}.{name}")
        return ToolFunction(
            name=name,
            description=description,
            parameters=parameters,
            function=function,
            example=example,
            remote_name=f"{verb} {path}",
            wire=send,
        )

    def _decode(self, answer: httpx.Response, what: str, verb: str, url: str) -> Any:
        if answer.status_code < 400 and "json" in answer.headers.get("content-type", ""):
            try:
                return load_json(answer.content)  # from the bytes: the text is decoded only when it is the answer
            except ValueError:
                return answer.text
        text = answer.text
        if answer.status_code >= 400:
            raise ToolError(
                f"{what}: HTTP {answer.status_code} from {verb} {url}: {text.strip()[:1500] or '(empty body)'}",
                stderr=text,
                status=answer.status_code,
            )
        return text

    # -- the tool's face -------------------------------------------------------

    def example(self) -> str:
        functions = self._functions or {}
        first = next(iter(functions.values()), None)
        return first.example if first is not None else f'{self.name}.get("/")'

    def _usage_notes(self) -> list[str]:
        return [
            f"The service runs at {self.base_url or '(not started)'} (loopback only; pid {self.pid}) and requires "
            "its token, which the client sends. Raw requests: "
            f'`{self.name}.get("/path", params=...)`, `{self.name}.post("/path", json=...)` return an '
            f"`httpx.Response`. `{self.name}.logs()` shows its output; `{self.name}.stop()` stops it.",
            "",
            *super()._usage_notes(),
        ]

    def _rows(self) -> list[tuple[str, str]]:
        where = f"{self.base_url} (pid {self.pid})" if self.running else "stopped"
        return [*super()._rows(), ("service", where)]

    def __repr__(self) -> str:
        if self._functions is None:
            names = "(read from /openapi.json when it first starts)"
        else:
            names = ", ".join(self._functions) or "(none: no /openapi.json)"
        where = f"{self.base_url}, pid {self.pid}" if self.running else "stopped"
        return f"{super().__repr__()}\n  operations: {names}\n  service: {where}"


class _PortTaken(Exception):
    """The free port was taken between choosing it and the service binding it."""


def _query_text(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)
