"""The Python client of an MCP server: one process, JSON-RPC 2.0 over stdio, one function per MCP tool.

:class:`McpTool` starts the server once (``initialize``, then
``notifications/initialized``), asks for its tools (``tools/list``) and
builds a Python function for each from its input schema: required and
optional parameters, types, a docstring. Calls check their arguments before
anything is sent, then go out as ``tools/call`` on the running process::

    >>> calc.add(a=1, b=2)            # doctest: +SKIP
    {'sum': 3.0}

A result's ``structuredContent`` comes back as Python values; otherwise its
text. A tool that reports an error (``isError``), or a JSON-RPC error, raises
:class:`~flakebot_magic.errors.ToolError`; so does an error with a ``null`` id
(the server could not read the request), at once. Arguments go out exactly
(:func:`~flakebot_magic.clients.schema.prepare_arguments`): NaN and
infinities are refused before sending, whole floats for integer parameters
are sent as integers, ``None`` for an optional argument is not sent. A server that died is started again
on the next call; a call that times out or is interrupted stops the server
(the next call starts a fresh one). Messages are newline-delimited JSON
(the MCP stdio transport); the server's stderr is kept in ``calc.logs()``.

The server starts with the allowlisted environment (plus the ``tool_env``
setting): no API key of the kernel's reaches it. A message is read in chunks
and may be at most :data:`MAX_MESSAGE_BYTES` long: a server that sends more
without a newline is stopped and the call fails with a ``ToolError``.
"""

from __future__ import annotations

import json
import os
import re
import select
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import ToolError
from ..host.fsutil import load_json
from . import lifecycle
from .agents import ToolFunction
from .base import TOOL_TIMEOUT, Confinement, StartedToolClient, ToolContract
from .lifecycle import LogBuffer, ToolProcess
from .schema import (
    docstring_of,
    example_value,
    make_function,
    nonfinite,
    params_of,
    python_name,
    refuse_nonfinite,
)
from .schema_shape import well_typed

__all__ = ["PROTOCOL_VERSION", "McpSession", "McpTool", "value_of"]

#: the revision flakebot offers in ``initialize``
PROTOCOL_VERSION = "2025-06-18"
#: revisions flakebot accepts in the server's answer (all use the same tool calls)
SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
#: the longest JSON-RPC message (one line) read from a server
MAX_MESSAGE_BYTES = 32 * 1024 * 1024

#: what a session starts: (argv, environment, working directory, called after the process stopped)
Launch = tuple[list[str], Mapping[str, str], "Path | None", "Callable[[], None] | None"]


def value_of(result: Mapping[str, Any]) -> Any:
    """A ``tools/call`` result as a Python value: its structured content, else its text."""
    structured = result.get("structuredContent")
    if structured is not None:
        return structured
    content = result.get("content") or []
    texts = [item.get("text", "") for item in content if isinstance(item, Mapping) and item.get("type") == "text"]
    if len(texts) == len(content):
        return "\n".join(texts)
    return list(content)


def _error_text(result: Mapping[str, Any]) -> str:
    value = value_of(result)
    return value if isinstance(value, str) else json.dumps(value)


class McpSession:
    """A running MCP server and the JSON-RPC conversation with it (one request at a time).

    Parameters
    ----------
    argv, env
        How to start the server.
    name
        The tool's name, for messages.
    logs
        Where the server's stderr (and stray stdout) goes.
    ready_timeout
        Seconds allowed for the ``initialize`` handshake.
    launch
        Called at each start instead of using ``argv`` and ``env``: the
        command, environment, working directory and a clean-up to run after
        the process stopped (a confined start's scratch dir).
    max_message
        The longest message (bytes) read from the server.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str],
        name: str,
        logs: LogBuffer,
        ready_timeout: float = 10.0,
        launch: Callable[[], Launch] | None = None,
        max_message: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.argv = argv
        self.env = dict(env)
        self.launch = launch
        self.max_message = max_message
        self._cleanup: Callable[[], None] | None = None
        self.name = name
        self.logs = logs
        self.ready_timeout = ready_timeout
        self.process: ToolProcess | None = None
        self.server: dict[str, Any] = {}
        self.restarts = 0
        #: called after the server was started again by a request
        self.on_restart: Callable[[], None] | None = None
        self._lock = threading.RLock()
        self._buffer = bytearray()
        self._next_id = 0

    # -- process ---------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.alive and self.process is not None else None

    def start(self) -> dict[str, Any]:
        """Start the server and shake hands; return the ``initialize`` result."""
        with self._lock:
            if self.alive:
                return self.server
            if self.process is not None:
                self._stop_process()  # a dead one: reap it, close its pipes
            self._buffer = bytearray()
            argv, env, cwd, cleanup = self.launch() if self.launch else (self.argv, self.env, None, None)
            self._cleanup = cleanup
            self.process = ToolProcess(argv, env=env, logs=self.logs, stdio=True, cwd=cwd)
            try:
                self.process.start()
            except BaseException:
                self._stop_process()
                raise
            try:
                result = self._request(
                    "initialize",
                    {
                        "protocolVersion": PROTOCOL_VERSION,
                        "capabilities": {},
                        "clientInfo": {"name": "flakebot-magic", "version": __version__},
                    },
                    self.ready_timeout,
                    retry=False,
                )
                version = result.get("protocolVersion")
                if version not in SUPPORTED_VERSIONS:
                    raise ToolError(
                        f"{self.name}: the MCP server answered initialize with protocol version {version!r}; "
                        f"flakebot speaks {', '.join(SUPPORTED_VERSIONS)}.",
                        stderr=self.logs.text(last=30),
                    )
                self._notify("notifications/initialized")
            except BaseException:
                self.stop()
                raise
            self.server = dict(result)
            return self.server

    def stop(self) -> int | None:
        """Stop the server on purpose: the next call starts a new one, which is not a restart."""
        with self._lock:
            if self.process is None:
                return None
            try:
                return self._stop_process()
            finally:
                self.process = None

    def _stop_process(self, grace: float = 1.0) -> int | None:
        assert self.process is not None
        try:
            return self.process.stop(grace=grace)
        finally:
            cleanup, self._cleanup = self._cleanup, None
            if cleanup is not None:
                cleanup()

    # -- the conversation --------------------------------------------------------

    def request(self, method: str, params: Mapping[str, Any] | None = None, timeout: float = TOOL_TIMEOUT) -> Any:
        """Send one request and wait for its answer; start the server first when it is not running."""
        with self._lock:
            if not self.alive:
                if self.process is not None:
                    self.restarts += 1
                    self.logs.append(
                        f"flakebot: restarting {self.name} (it exited with status {self.process.returncode})\n"
                    )
                self.start()
                if self.on_restart is not None:
                    self.on_restart()
            return self._request(method, params, timeout)

    def _send(self, message: Mapping[str, Any]) -> None:
        assert self.process is not None and self.process.proc is not None and self.process.proc.stdin is not None
        try:
            text = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except ValueError:  # NaN or an infinity: JSON has none, and the server could not parse it
            where = nonfinite(message.get("params")) or "a value"
            raise ValueError(
                f"{self.name}: {message.get('method')} not sent: {where} is NaN or infinite, "
                "which JSON cannot carry; pass a finite number"
            ) from None
        data = text.encode() + b"\n"
        fd = self.process.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def _notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = dict(params)
        self._send(message)

    def _request(self, method: str, params: Mapping[str, Any] | None, timeout: float, *, retry: bool = True) -> Any:
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            message["params"] = dict(params)
        try:
            try:
                self._send(message)
            except BrokenPipeError:
                if not retry:
                    return self._died(method, sent=False)
                # it died before the request reached it: nothing ran, so sending again is safe
                self.stop()
                self.restarts += 1
                self.start()
                return self._request(method, params, timeout, retry=False)
            return self._answer(ident, method, time.monotonic() + timeout, timeout)
        except KeyboardInterrupt:
            self.logs.append(f"flakebot: {method} interrupted; {self.name} stopped (the next call starts it again)\n")
            self.stop()
            raise

    def _answer(self, ident: int, method: str, deadline: float, timeout: float) -> Any:
        while True:
            line = self._read_line(deadline, method, timeout)
            if line is None:
                return self._died(method, sent=True)
            try:
                message = load_json(line)
            except ValueError:
                self.logs.append(f"stdout (not JSON-RPC): {line.decode('utf-8', 'replace')}\n")
                continue
            if not isinstance(message, dict):
                continue
            if "method" in message:
                self._from_server(message)
                continue
            if message.get("id") is None and "error" in message:
                # JSON-RPC: the server could not read a request (a parse error or an invalid request), so it
                # could not say which; the one waited for is the one it could not read
                error = message["error"] if isinstance(message["error"], Mapping) else {}
                raise ToolError(
                    f"{self.name}: the MCP server could not read the {method} request: "
                    f"{error.get('message', 'unknown error')} (JSON-RPC error {error.get('code')})",
                    stderr=self.logs.text(last=30),
                )
            if message.get("id") != ident:
                continue  # the answer to a request given up on earlier
            if "error" in message:
                error = message["error"] if isinstance(message["error"], Mapping) else {}
                raise ToolError(
                    f"{self.name}: {method} failed: {error.get('message', 'unknown error')} "
                    f"(JSON-RPC error {error.get('code')})",
                    stderr=self.logs.text(last=30),
                )
            return message.get("result", {})

    def _from_server(self, message: Mapping[str, Any]) -> None:
        method = message.get("method")
        if "id" in message:  # a request from the server: answer ping, decline the rest
            if method == "ping":
                self._send({"jsonrpc": "2.0", "id": message["id"], "result": {}})
            else:
                self._send(
                    {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "error": {"code": -32601, "message": f"flakebot's client does not support {method}"},
                    }
                )
        elif method == "notifications/message":
            params = message.get("params") or {}
            self.logs.append(f"{params.get('level', 'info')}: {json.dumps(params.get('data'))}\n")

    def _read_line(self, deadline: float, method: str, timeout: float) -> bytes | None:
        assert self.process is not None and self.process.proc is not None and self.process.proc.stdout is not None
        fd = self.process.proc.stdout.fileno()
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n")
            if end >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if line.strip():
                    return line
                continue
            if len(buffer) > self.max_message:
                size = len(buffer)
                self.stop()
                raise ToolError(
                    f"{self.name}: the MCP server sent a message longer than {self.max_message // (1024 * 1024)} MiB "
                    f"(at least {size} bytes without a newline) while answering {method}; it was stopped and the "
                    "message dropped. The next call starts it again.",
                    stderr=self.logs.text(last=30),
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop()
                raise ToolError(
                    f"{self.name}: {method} got no answer within {timeout:g} s, so the server was stopped; "
                    "the next call starts it again. Pass a larger timeout=... if the work is just slow.",
                    stderr=self.logs.text(last=30),
                )
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, min(1 << 16, self.max_message + 1 - len(buffer)))
            if not chunk:
                return None
            buffer += chunk

    def _died(self, method: str, *, sent: bool) -> Any:
        assert self.process is not None
        status = self._stop_process(grace=0.5)
        tail = self.logs.text(last=20)
        when = "while answering" if sent else "before receiving"
        raise ToolError(
            f"{self.name}: the MCP server exited (status {status}) {when} {method}; "
            f"the next call starts it again. Its last output:\n{tail.strip() or '(none)'}",
            returncode=status,
            stderr=tail,
        )


class McpTool(StartedToolClient):
    """A deployed MCP server (stdio), with one Python function per MCP tool.

    ``calc.add(a=1, b=2)``, ``calc.functions()``, ``calc.logs()``,
    ``calc.stop()``; ``calc.call_tool("add", {"a": 1, "b": 2})`` is the raw form.
    """

    kind = "mcp"
    server = True  # one process serves every call: started unconfined or, when confined_now, in the sandbox
    noun, a_noun = "MCP server (stdio)", "an MCP server"
    asked_by = re.compile(r"\bmcp\b|model context protocol", re.I)
    bridged = False  # it speaks MCP itself
    contract_text = (
        "An mcp tool speaks the Model Context Protocol as JSON-RPC 2.0 over stdio, one JSON message per "
        "line: it answers initialize (protocolVersion 2025-06-18), tools/list (each tool with name, "
        "description and an inputSchema) and tools/call (content, structuredContent for data, "
        "isError: true for a failure); it answers unknown methods with error -32601 and exits when "
        "stdin closes."
    )
    member = "MCP tool"

    def __init__(
        self,
        *args: Any,
        contract: ToolContract | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.contract = contract or ToolContract(kind="mcp", bin=self.binary.name)
        self._logs = LogBuffer()
        self.session = McpSession(
            [str(self.binary)],
            env={},
            name=self.name,
            logs=self._logs,
            ready_timeout=self.contract.ready_timeout,
            launch=self._launch,
        )
        self.tools: list[dict[str, Any]] = []
        self._functions: dict[str, ToolFunction] | None = None
        self.session.on_restart = lambda: self._state(status="running", pid=self.pid, started=time.time())

    # -- lifecycle -------------------------------------------------------------

    def _launch(self) -> Launch:
        """How the server starts now: the allowlisted environment, in the sandbox when confined."""
        argv = [str(self.binary)]
        if not self.confined_now:
            return argv, self._environment(), None, None
        confinement = Confinement(self.binary, self.store_path)
        return confinement.command(argv), confinement.env(self.env), confinement.scratch, confinement.close

    def start(self) -> McpTool:
        """Start the server (if it is not running) and read its tools."""
        self.require_binary()
        lifecycle.register(self)
        self.session.start()
        if self._functions is None:
            self.tools = self._list_tools()
            self._functions = self._build_functions(self.tools)
        self._state(status="running", pid=self.pid, started=time.time())
        return self

    def stop(self) -> None:
        was_running = self.running
        self.session.stop()
        if was_running:
            self._state(status="stopped", pid=None)

    @property
    def running(self) -> bool:
        return self.session.alive

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self.session.pid

    def logs(self, last: int | None = None) -> str:
        return self._logs.text(last)

    @property
    def server_info(self) -> dict[str, Any]:
        """``serverInfo`` from the handshake."""
        return dict(self.session.server.get("serverInfo") or {})

    @property
    def instructions(self) -> str:
        return str(self.session.server.get("instructions") or "")

    # -- tools -----------------------------------------------------------------

    def _list_tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            result = self.session.request(
                "tools/list", {"cursor": cursor} if cursor else None, self.contract.ready_timeout
            )
            tools += [t for t in result.get("tools", []) if isinstance(t, dict) and t.get("name")]
            cursor = result.get("nextCursor")
            if not cursor:
                return tools

    def call_tool(self, tool: str, arguments: Mapping[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        """Call the MCP tool ``tool`` with ``arguments`` (not checked against its schema); return its value.

        NaN and infinities are refused (``ValueError``) before anything is sent.
        """
        limit = self.timeout if timeout is None else timeout
        arguments = dict(arguments or {})
        refuse_nonfinite(arguments, f"{self.name}.{tool}")
        result = self.session.request("tools/call", {"name": tool, "arguments": arguments}, limit)
        if result.get("isError"):
            text = _error_text(result)
            raise ToolError(f"{self.name}.{tool} reported an error: {text}", stderr=text)
        return value_of(result)

    def _build_functions(self, tools: list[dict[str, Any]]) -> dict[str, ToolFunction]:
        taken = {name for name in dir(type(self)) if not name.startswith("_")}
        functions: dict[str, ToolFunction] = {}
        for tool in tools:
            remote = str(tool["name"])
            name = python_name(remote, taken | set(functions))
            schema = well_typed(tool.get("inputSchema")) or {"type": "object"}
            description = str(tool.get("description") or tool.get("title") or "")
            params = params_of(schema)
            example_args = ", ".join(f"{p.name}={example_value(p.schema)!r}" for p in params if p.required)
            example = f"{self.name}.{name}({example_args})"

            def send(arguments: dict[str, Any], remote: str = remote) -> Any:
                return self.call_tool(remote, arguments)

            doc = docstring_of(
                description,
                params,
                "object\n    The tool's structured content as Python values, else its text.",
                "ToolError\n    The tool reported an error, or the server failed.\nTypeError, ValueError\n"
                "    An argument does not fit the tool's input schema (checked before sending).",
                example,
            )
            function = make_function(name, schema, send, doc=doc, qualname=f"{self.name}.{name}")
            functions[name] = ToolFunction(
                name=name,
                description=description,
                parameters=schema,
                function=function,
                example=example,
                remote_name=remote,
                wire=send,
                open_arguments=schema.get("additionalProperties") is not False,
            )
        return functions

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """With a single MCP tool, call it; otherwise name one: ``calc.add(...)``."""
        functions = self.functions()
        if len(functions) == 1:
            return next(iter(functions.values())).function(*args, **kwargs)
        raise TypeError(
            f"{self.name} has {len(functions)} tools; call one of them: "
            + ", ".join(f"{self.name}.{n}(...)" for n in functions)
        )

    def example(self) -> str:
        functions = self._functions or {}
        first = next(iter(functions.values()), None)
        return first.example if first is not None else f"{self.name}.<tool>(...)"

    def mcp_config(self) -> dict[str, Any]:
        """The server entry for MCP clients: this very binary over stdio.

        Inside a Jupyter kernel, the official ``mcp`` SDK's ``stdio_client``
        fails with ``UnsupportedOperation: fileno`` (python-sdk#1103): it
        hands ``sys.stderr`` to the server process, and a kernel's
        ``sys.stderr`` is not a file. Pass a real file as ``errlog=``::

            entry = calc.mcp_config()["mcpServers"]["calc"]
            params = StdioServerParameters(command=entry["command"], args=entry["args"])
            with open("calc-stderr.log", "w") as log:
                async with stdio_client(params, errlog=log) as (read, write): ...
        """
        return {"mcpServers": {self.name: {"command": str(self.binary), "args": [], "env": {}}}}

    def _usage_notes(self) -> list[str]:
        return [
            f"One server process serves every call (pid {self.pid}); it restarts by itself if it dies. "
            f"`{self.name}.logs()` shows its stderr; `{self.name}.stop()` stops it. "
            "A tool error raises `flakebot_magic.ToolError`.",
            "",
            *super()._usage_notes(),
        ]

    def _rows(self) -> list[tuple[str, str]]:
        return [*super()._rows(), ("process", f"pid {self.pid}" if self.running else "stopped")]

    def __repr__(self) -> str:
        names = ", ".join(self._functions or {}) or "(not started)"
        return f"{super().__repr__()}\n  tools: {names}\n  process: {f'pid {self.pid}' if self.running else 'stopped'}"
