"""What every deployed tool object has: provenance, its kind, its functions, the views agents use, its display.

:class:`ToolClient` is the base of the clients of every tool kind (the table
:data:`~flakebot_magic.clients.kinds.KINDS`: command-line tools, MCP servers,
HTTP services). Its class attributes are the kind's row: its name in the
contract (:attr:`ToolClient.kind`), whether it is a long-running server
(:attr:`ToolClient.server`), how it is named to a person and described to a
model, which requests ask for it. A subclass says which
:class:`~flakebot_magic.clients.agents.ToolFunction` objects it offers
(:meth:`ToolClient.functions`); everything agent-facing is derived from them:
``openai_tools()``, ``call(tool_call)``, ``usage()``, ``mcp_config()``, and the
notebook display. What a tool says about itself (its description, help,
function descriptions, logs) is made safe to show where the client takes it
in (:mod:`flakebot_magic.untrusted`); what a call returns is data, as the tool
wrote it.

Every kind starts its process in the sandbox (:class:`Confinement`) whenever
:attr:`ToolClient.confined_now` says so: what flakebot runs on its own account
(the ``--help`` probe, acceptance examples, the judge, eval's hidden checks, a
build reading a server's functions) and every call with ``confine_tools``.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, ParamSpec, TypeVar

from ..commands import typed
from ..errors import ToolError
from ..host.deadline import Deadline
from ..host.entry import remedy, runnable_damage
from ..host.environment import environ_stamp
from ..host.fsutil import load_json
from ..options import option
from ..records.provenance import describe_locked, provenance_of
from ..untrusted import not_math, safe_html, safe_text
from .agents import ToolFunction, agent_name, openai_tool, parse_tool_call, result_text
from .confine import Confinement, tool_environment
from .schema import prepare_arguments

#: seconds one call of a tool may take, unless the caller says otherwise (the option's default)
TOOL_TIMEOUT: float = option("tool_timeout").default

__all__ = [
    "DEFAULT_HEALTH",
    "DEFAULT_KIND",
    "DEFAULT_READY_TIMEOUT",
    "Confinement",
    "StartedToolClient",
    "ToolClient",
    "ToolContract",
    "bridge_command",
    "tool_environment",
]

#: the kind of a crate whose contract names none (its row is in :data:`~flakebot_magic.clients.kinds.KINDS`)
DEFAULT_KIND = "cli"
DEFAULT_HEALTH = "/health"
DEFAULT_READY_TIMEOUT = 10.0

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass(frozen=True)
class ToolContract:
    """How to run a deployed tool: its kind, its binary, and (servers) how it starts.

    Read from Cargo.toml by :func:`~flakebot_magic.clients.contract.read_contract`, the one reader.
    """

    kind: str = DEFAULT_KIND
    bin: str = ""
    health: str = DEFAULT_HEALTH
    ready_timeout: float = DEFAULT_READY_TIMEOUT

    def __str__(self) -> str:
        return f'kind = "{self.kind}", bin = "{self.bin}"'

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, default_bin: str = "") -> ToolContract:
        """Read a stored contract (already checked at deploy); an entry without one is of the default kind."""
        if not data:
            return cls(kind=DEFAULT_KIND, bin=default_bin)
        return cls(
            kind=str(data.get("kind") or DEFAULT_KIND),
            bin=str(data.get("bin") or default_bin),
            health=str(data.get("health") or DEFAULT_HEALTH),
            ready_timeout=float(data.get("ready_timeout") or DEFAULT_READY_TIMEOUT),
        )


class ToolClient:
    """A deployed tool, callable from Python and describable to agents.

    Parameters
    ----------
    name
        The tool's name in the kernel (a Python identifier).
    binary
        The deployed executable.
    crate, version
        Where it came from.
    source_hash, store_path
        Its store entry.
    checksum
        The published source's checksum.
    backend
        ``cargo`` or ``nix``: what built and deployed it.
    timeout
        Default seconds allowed for one call.
    provenance
        The store manifest (description, commit, flags ...).
    lock_hash
        Nix backend: ``sha256-<hex>`` of the flake.lock it was built with.
    env
        Variables added to the allowlisted environment of every start of
        the tool (the ``tool_env`` setting); nothing else of the kernel's
        environment reaches it.
    confine
        Run the tool inside the sandbox (the ``confine_tools`` setting).
        By default a deployed tool runs as the user, outside the sandbox.
    home
        The cache dir whose tool inventory holds it (default: its store
        entry). Its process is known by home and name, so a tool of the
        same name in another cache dir never shares or stops it.
    contract
        Its tool contract (default: its kind's, with ``binary``'s name).

    A subclass is a tool kind: its class attributes below are the kind's row
    in :data:`~flakebot_magic.clients.kinds.KINDS` (docs/ARCHITECTURE.md, "Adding a tool kind").
    """

    #: the kind's name: ``kind = "..."`` in the tool contract, its key in the table, the inventory's ``kind``
    kind: ClassVar[str] = ""
    #: a long-running process, started, watched, stopped and restarted (an MCP server, an HTTP service);
    #: False: the tool runs only while it is called, and there is nothing to start or stop
    server: ClassVar[bool] = False
    #: the kind in a person's words, as a title ("HTTP service") and in a sentence ("an HTTP service")
    noun: ClassVar[str] = "tool"
    a_noun: ClassVar[str] = "a tool"
    #: what a model is told a tool of this kind must do (the edit loop's system prompt)
    contract_text: ClassVar[str] = ""
    #: the words by which a request asks for this kind; None: the default kind, which any request may get
    asked_by: ClassVar[re.Pattern[str] | None] = None
    #: MCP clients reach it through flakebot's bridge (False: it speaks MCP itself)
    bridged: ClassVar[bool] = True
    #: it answers HTTP while it runs: the Jupyter server's proxy may forward to it
    proxied: ClassVar[bool] = False

    @classmethod
    def runs_confined(cls, binary: Path, store_path: Path) -> str:
        """Why a tool of this kind at ``binary`` cannot run in the sandbox, found by running it there without a call
        (``flakebot doctor``); "" when it ran, or when the kind has nothing to run but a call."""
        return ""

    def __init__(
        self,
        name: str,
        binary: Path | str,
        crate: str,
        version: str,
        source_hash: str,
        store_path: Path | str,
        checksum: str = "",
        backend: str = "cargo",
        timeout: float = TOOL_TIMEOUT,
        provenance: Mapping[str, Any] | None = None,
        lock_hash: str = "",
        env: Mapping[str, str] | None = None,
        confine: bool = False,
        home: Path | str | None = None,
        contract: ToolContract | None = None,
    ) -> None:
        self.name = name
        self.binary = Path(binary)
        #: how it runs: its kind, its binary and (a server) its start
        self.contract = contract or ToolContract(kind=self.kind, bin=self.binary.name)
        self.crate = crate
        self.version = version
        self.source_hash = source_hash
        self.store_path = Path(store_path)
        #: where its process is known (:mod:`~flakebot_magic.clients.lifecycle`): the cache dir, else the store entry
        self.home = Path(home) if home is not None else self.store_path
        #: the store entry checked before every run (:meth:`require_binary`): one with a manifest when made
        #: (a deployed tool); a nix output and a candidate's scratch copy have none (nix checks its own by narHash)
        self.entry: Path | None = self.store_path if (self.store_path / "manifest.json").is_file() else None
        self.checksum = checksum
        self.backend = backend
        self.timeout = timeout
        self.provenance: dict[str, Any] = dict(provenance or {})
        self.lock_hash = lock_hash
        #: added to the allowlisted environment at every start (the ``tool_env`` setting)
        self.env: dict[str, str] = {str(k): str(v) for k, v in (env or {}).items()}
        #: run inside the sandbox (the ``confine_tools`` setting)
        self.confine = confine
        #: the last environment made (:meth:`_environment`): os.environ's stamp, what it was made of, it
        self._env_kept: tuple[object, tuple[Any, ...], dict[str, str]] | None = None
        self._confined_depth = 0
        self._confined_lock = threading.Lock()
        #: a server ran when the outermost :meth:`confined` block began (it runs again after it)
        self._ran_before = False
        #: the acceptance examples' results, when the cell had examples
        self.acceptance: Any = None
        #: called as ``on_state(status=..., pid=..., url=...)`` when the tool's process starts or
        #: stops (the pipeline points it at the tool inventory)
        self.on_state: Callable[..., object] | None = None

    def _state(self, **changes: Any) -> None:
        if self.on_state is not None:
            try:
                self.on_state(**changes)
            except Exception:  # bookkeeping must never break a call
                pass

    # -- confinement -----------------------------------------------------------

    @property
    def confined_now(self) -> bool:
        """Do the tool's processes start in the sandbox now (setting, or inside :meth:`confined`)?"""
        return self.confine or self._confined_depth > 0

    @contextmanager
    def confined(self) -> Iterator[ToolClient]:
        """Within the block, the tool runs in the sandbox (what acceptance examples use).

        A server running on entry is restarted confined; on exit the confined
        one is stopped, and the ordinary one started again only if one ran
        before the block (the person's). A server the block alone started is
        never started again outside the sandbox on flakebot's account: the
        person's next call starts it.
        """
        with self._confined_lock:
            self._confined_depth += 1
            first = self._confined_depth == 1
        if first and not self.confine:
            self._ran_before = self.running
            self._confinement_changed(restart=self._ran_before)
        try:
            yield self
        finally:
            with self._confined_lock:
                self._confined_depth -= 1
                last = self._confined_depth == 0
            if last and not self.confine:
                self._confinement_changed(restart=self._ran_before)

    def _confinement_changed(self, restart: bool) -> None:
        """Processes started before no longer match :attr:`confined_now`: a server stops (and starts again
        with the new confinement when ``restart``)."""
        if self.running:
            self.stop()
        if restart:
            self.start()

    def _environment(self, *extras: Mapping[str, str] | None) -> dict[str, str]:
        """The unconfined environment of a start: the allowlist, ``tool_env``, then ``extras`` (a new dict).

        Kept between calls while ``os.environ`` (:func:`~flakebot_magic.host.environment.environ_stamp`),
        :attr:`env` and ``extras`` are the same: every call of a CLI tool asks.
        """
        stamp = environ_stamp()
        key = (tuple(self.env.items()), *(tuple(extra.items()) if extra else () for extra in extras))
        kept = self._env_kept
        if kept is not None and kept[0] is stamp and kept[1] == key:
            return dict(kept[2])
        env = tool_environment(self.env, *extras)
        self._env_kept = (stamp, key, env)
        return dict(env)

    # -- subclasses ------------------------------------------------------------

    def functions(self) -> dict[str, ToolFunction]:
        """The tool's functions by Python name."""
        raise NotImplementedError

    @property
    def description(self) -> str:
        return safe_text(str(self.provenance.get("description") or ""))

    @property
    def reads_stdin(self) -> bool:
        return False

    @property
    def running(self) -> bool:
        """True while the tool's own process runs (always False for a CLI tool)."""
        return False

    def start(self) -> ToolClient:
        """Start the tool's process; a tool that runs only while called (not a :attr:`server`) has none."""
        return self

    def require_binary(self) -> None:
        """Raise :class:`~flakebot_magic.errors.ToolError` when the binary is gone or its store entry is no longer
        whole (:func:`~flakebot_magic.host.entry.runnable_damage`), saying how to get the tool back.

        ``%flakebot clean --all`` (or a cleaned store) removes what a tool
        loaded in a kernel runs; starting it then would end in a
        ``FileNotFoundError`` deep in ``subprocess``.
        """
        # a kept whole verdict is an lstat of the manifest and of the binary: the binary is there
        why = runnable_damage(self.entry, self.binary) if self.entry is not None else ""
        if (why or self.entry is None) and not Path(self.binary).is_file():
            raise ToolError(
                f"{self.name}'s binary {self.binary} is gone ({typed('clean')} removed its store entry?). "
                f"Build it again with {typed(f'rebuild {self.name}')}, or {typed(f'load {self.name}')} "
                "if another kernel has built it since."
            )
        if why:  # changed since the client was made: the check of a cache hit, kept while no file changes
            raise ToolError(f"{self.name} cannot run: {why}. Its binary was not run. {remedy(self.name, why)}.")

    def stop(self) -> None:
        """Stop the tool's process, if it has one (a later call starts it again)."""

    def close(self) -> None:
        """Stop the tool and release its resources."""
        self.stop()

    def logs(self, last: int | None = None) -> str:
        """The tool process's recent output (stderr; stdout too for HTTP services)."""
        return ""

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def example(self) -> str:
        """A call to show first."""
        functions = self.functions()
        first = next(iter(functions.values()), None)
        return first.example if first is not None and first.example else f"{self.name}()"

    # -- for agents ------------------------------------------------------------

    def _agent_functions(self) -> dict[str, tuple[ToolFunction, tuple[str, ...], dict[str, Any]]]:
        functions = self.functions()
        table: dict[str, tuple[ToolFunction, tuple[str, ...], dict[str, Any]]] = {}
        for fn in functions.values():
            name = agent_name(self.name, fn, alone=len(functions) == 1)
            while name in table:  # two names that differ only in characters OpenAI rejects
                name = name[:63] + "_"
            entry, json_text = openai_tool(name, fn)
            table[entry["function"]["name"]] = (fn, json_text, entry)
        return table

    def openai_tools(self) -> list[dict[str, Any]]:
        """Function-calling schemas for ``client.chat.completions.create(tools=...)``.

        Each passes OpenAI's strict-mode rules (``"strict": true``): all
        properties required, optional ones nullable, no extra properties.
        """
        return [entry for _, _, entry in self._agent_functions().values()]

    def handles(self, tool_call: Any) -> bool:
        """Does ``tool_call`` name one of this tool's functions?"""
        return parse_tool_call(tool_call)[1] in self._agent_functions()

    def call(self, tool_call: Any) -> dict[str, Any]:
        """Run a tool call from a chat completion; return the ``tool`` message to send back.

        ``tool_call`` is an item of ``message.tool_calls`` (the ``openai``
        object or its dict form). ``null`` for an optional argument counts
        as not given (the rule of every door, docs/tool-contract.md). A
        failure (a tool error, bad arguments) becomes the message's content,
        so the model can read it and try again.
        """
        call_id, name, arguments = parse_tool_call(tool_call)
        with Deadline.of_call(self.timeout).running():  # a server's start to learn its functions is the call's
            return self._call(call_id, name, arguments)

    def _call(self, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        table = self._agent_functions()
        content: str
        if name not in table:
            content = f"error: {self.name} has no function {name!r}; it has {', '.join(sorted(table))}"
        else:
            fn, json_text, _ = table[name]
            try:
                args = load_json(arguments or "{}")
                if not isinstance(args, dict):
                    raise ValueError("the arguments must be a JSON object")
                for key in json_text:
                    if isinstance(args.get(key), str):
                        args[key] = load_json(args[key])
                content = result_text(self._invoke(fn, args))
            except Exception as exc:  # the model sees what went wrong, and may correct itself
                content = f"error: {type(exc).__name__}: {exc}"
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    def _invoke(self, fn: ToolFunction, args: Mapping[str, Any]) -> Any:
        """Call ``fn`` with arguments named as in its schema (as a model or an MCP client gives them).

        They go through :func:`~flakebot_magic.clients.schema.prepare_arguments`
        against ``fn.enforced_schema``: ``null`` for an optional argument is
        not given, extra keys are refused (unless the MCP server takes them),
        NaN is refused, whole floats for integers become integers.
        """
        if fn.wire is not None:
            return fn.wire(prepare_arguments(args, fn.enforced_schema, fn.name))
        required = set(fn.parameters.get("required") or [])
        return fn.function(**{k: v for k, v in args.items() if v is not None or k in required})

    def mcp_config(self) -> dict[str, Any]:
        """An ``mcpServers`` entry an MCP client (Claude Desktop, Cursor, the ``mcp`` SDK) can use.

        For a command-line tool or an HTTP service the server is flakebot's
        bridge, which serves this tool's functions over MCP (stdio).

        Inside a Jupyter kernel, give the official ``mcp`` SDK's
        ``stdio_client`` a real file as ``errlog=`` (python-sdk#1103: its
        default, the kernel's ``sys.stderr``, has no ``fileno``); see
        :meth:`flakebot_magic.clients.mcp.McpTool.mcp_config`.
        """
        return {"mcpServers": {self.name: bridge_command(self)}}

    def usage(self) -> str:
        """Markdown: what the tool does, and each function with an example."""
        lines = [f"### `{self.name}`: {self.crate} {self.version} ({self.noun})", ""]
        if self.description:
            lines += [self.description, ""]
        for fn in self.functions().values():
            signature = fn.signature_text()
            lines += [f"#### `{signature}`", "", (fn.description.strip() or "(no description)"), ""]
            if fn.example:
                lines += ["```python", fn.example, "```", ""]
        lines += self._usage_notes()
        return safe_text("\n".join(lines).rstrip() + "\n")

    def _usage_notes(self) -> list[str]:
        return [
            "Errors raise `flakebot_magic.ToolError`. For agents: `.openai_tools()`, "
            "`.call(tool_call)`, `.mcp_config()`.",
        ]

    # -- display ---------------------------------------------------------------

    def _nixpkgs(self) -> str:
        """The locked nixpkgs, in words; "" when not recorded (a pulled tool: its flake.lock hash pins it)."""
        locked = self.provenance.get("nixpkgs")
        return describe_locked(locked) if isinstance(locked, dict) and locked else ""

    def _rows(self) -> list[tuple[str, str]]:
        rows = [
            ("crate", f"{self.crate} {self.version}"),
            ("kind", self.kind),
            ("source hash", self.source_hash),
            ("store path", str(self.store_path)),
            ("backend", self.backend),
        ]
        if self.backend == "nix":
            rows.append(("flake.lock", self.lock_hash))
            if self._nixpkgs():
                rows.append(("nixpkgs", self._nixpkgs()))
        return rows

    def __repr__(self) -> str:
        # one short line: pydoc's help(tool) and IPython's `tool?` start with it (pydoc cuts it at 100)
        return f"<flakebot tool {self.name}: {self.crate} {self.version} ({self.kind}, {self.backend})>"

    def _repr_html_(self) -> str:
        e = safe_html
        # left-aligned and unstriped whatever the page's table style (JupyterLab right-aligns rendered tables);
        # a hash or a store path breaks anywhere, so a narrow window wraps it rather than cutting it off
        body = "".join(
            f"<tr style='background:none'><th style='text-align:left;padding:1px 1em 1px 0'>{e(k)}</th>"
            f"<td style='text-align:left;padding:1px 0;overflow-wrap:anywhere'><code>{e(v)}</code></td></tr>"
            for k, v in self._rows()
        )
        calls = "".join(
            f"<li><code>{e(fn.signature_text())}</code> &mdash; {e(_first_line(fn.description))}"
            + (f"<br>e.g. <code>{e(fn.example)}</code>" if fn.example else "")
            + "</li>"
            for fn in self.functions().values()
        )
        tools = e(json.dumps(self.openai_tools(), indent=2))
        mcp = e(json.dumps(self.mcp_config(), indent=2))
        return not_math(
            f"<div class='flakebot-tool'><b>flakebot tool <code>{e(self.name)}</code></b>"
            + (f" &mdash; {e(self.description)}" if self.description else "")
            + f"<table style='margin:4px 0'>{body}</table>"
            f"<p>Call it: <code>{e(self.example())}</code></p>"
            f"<ul>{calls}</ul>"
            f"<details><summary>For agents: <code>{e(self.name)}.openai_tools()</code></summary><pre>{tools}</pre></details>"
            f"<details><summary>For MCP clients: <code>{e(self.name)}.mcp_config()</code></summary><pre>{mcp}</pre></details>"
            f"<details><summary>Usage: <code>{e(self.name)}.usage()</code></summary><pre>{e(self.usage())}</pre></details>"
            "</div>"
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        # no data of its own (text and HTML come from the methods beside it); the
        # output's metadata records the provenance, so a notebook says which tool it got
        return {}, {"flakebot": provenance_of(self)}


def _within(function: Callable[_P, _R], deadline: Deadline) -> Callable[_P, _R]:
    """``function``, called within ``deadline`` (a call whose lookup started the tool); its signature and doc kept."""

    @functools.wraps(function)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with deadline.running():
            return function(*args, **kwargs)

    return call


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0]


def bridge_command(tool: ToolClient) -> dict[str, Any]:
    """The ``mcpServers`` entry that serves ``tool`` through :mod:`flakebot_magic.clients.bridge`."""
    args = [
        "-m",
        "flakebot_magic.clients.bridge",
        "--name",
        tool.name,
        "--kind",
        tool.kind,
        "--timeout",
        f"{tool.timeout:g}",
    ]
    # how it starts (a server's health path, its start deadline)
    args += ["--contract", json.dumps(tool.contract.to_json(), sort_keys=True)]
    return {"command": sys.executable, "args": [*args, str(tool.binary)], "env": {}}


class StartedToolClient(ToolClient):
    """A tool that runs as a process (MCP server, HTTP service) and learns its functions when started.

    Its functions are attributes too: ``calc.add(a=1, b=2)``.
    """

    server = True
    #: what one of its functions is called in error messages
    member = "function"
    _functions: dict[str, ToolFunction] | None = None

    def start(self) -> StartedToolClient:
        raise NotImplementedError

    def functions(self) -> dict[str, ToolFunction]:
        if self._functions is None:
            self.start()
        assert self._functions is not None
        return dict(self._functions)

    def __getattr__(self, name: str) -> Any:
        functions = self.__dict__.get("_functions")
        if functions is None and "_functions" in self.__dict__ and not name.startswith("_"):
            # a service nothing has started yet (a build runs none of it): what it offers is read at its first
            # use, which is a call: the start and the call that follows share one deadline, made now
            deadline = Deadline.of_call(self.timeout)
            with deadline.running():
                functions = self.functions()
            if name in functions:
                return _within(functions[name].function, deadline)
        if not name.startswith("_") and functions and name in functions:
            return functions[name].function
        raise AttributeError(
            f"{type(self).__name__} {self.__dict__.get('name', '')!r} has no attribute or {self.member} {name!r}"
        )

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(self._functions or {})})
