"""The Python client of an MCP server: one process, JSON-RPC 2.0 over stdio, one function per MCP tool.

:class:`McpTool` starts the server once and learns which revision it speaks
(:class:`~flakebot_magic.clients.mcp_session.McpSession`: a ``server/discover``
probe; 2026-07-28, stateless, for a server that answers it, else the
``initialize`` handshake of 2025-11-25 and older), asks for its tools
(``tools/list``) and builds a Python function for each from its input schema:
required and optional parameters, types, a docstring. ``repr(calc)``, its
display and ``show`` say which revision (``calc.revision``). Calls check their arguments before
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
on the next call; a call's ``timeout`` bounds the whole call, its wait behind
other calls included; a call that times out or is interrupted stops the server
(the next call starts a fresh one). Messages are newline-delimited JSON
(the MCP stdio transport); the server's stderr is kept in ``calc.logs()``.

The server starts with the allowlisted environment (plus the ``tool_env``
setting): no API key of the kernel's reaches it. A message is read in chunks
and may be at most :data:`MAX_MESSAGE_BYTES` long: a server that sends more
without a newline is stopped and the call fails with a ``ToolError``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from ..errors import ToolError
from ..host.deadline import Deadline
from . import lifecycle
from .agents import ToolFunction
from .base import Confinement, StartedToolClient, ToolContract
from .lifecycle import LogBuffer
from .mcp_session import MAX_MESSAGE_BYTES, PROTOCOL_VERSION, SUPPORTED_VERSIONS, Launch, McpSession
from .revisions import describe
from .schema import docstring_of, example_value, make_function, params_of, python_name, refuse_nonfinite
from .schema_shape import well_typed

__all__ = ["MAX_MESSAGE_BYTES", "PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "McpSession", "McpTool", "value_of"]


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
        self.session.on_restart = lambda: self._state(
            status="running", pid=self.pid, started=time.time(), protocol=self.revision
        )

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
        self._state(status="running", pid=self.pid, started=time.time(), protocol=self.revision)
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
    def revision(self) -> str:
        """The MCP revision spoken with the server: ``2026-07-28`` (stateless) or a handshake one ("" before a start)."""
        return self.session.revision

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
        with Deadline.of_call(self.timeout).running():  # a start to learn its tools is part of the call
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
        return [
            *super()._rows(),
            ("process", f"pid {self.pid}" if self.running else "stopped"),
            ("protocol", describe(self.revision)),
        ]

    def __repr__(self) -> str:
        names = ", ".join(self._functions or {}) or "(not started)"
        return (
            f"{super().__repr__()}\n  tools: {names}\n  process: {f'pid {self.pid}' if self.running else 'stopped'}"
            f"\n  protocol: {describe(self.revision)}"
        )
