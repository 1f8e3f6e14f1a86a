"""What every deployed tool object has: provenance, its functions, the views agents use, its display.

:class:`ToolClient` is the base of the CLI, MCP and HTTP clients. A subclass
says which :class:`~flakebot_magic.clients.agents.ToolFunction` objects it
offers (:meth:`ToolClient.functions`); everything agent-facing is derived
from them: ``openai_tools()``, ``call(tool_call)``, ``usage()``,
``mcp_config()``, and the notebook display. What a tool says about itself (its
description, help, function descriptions, logs) is made safe to show where
the client takes it in (:mod:`flakebot_magic.untrusted`); what a call returns
is data, as the tool wrote it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..commands import typed
from ..errors import ToolError
from ..host.entry import runnable_damage
from ..host.environment import environ_stamp
from ..host.fsutil import load_json
from ..host.process import allowed_env
from ..host.trees import remove_tree
from ..options import option
from ..records.provenance import describe_locked, provenance_of
from ..sandbox import Sandbox
from ..untrusted import not_math, safe_html, safe_text
from .agents import ToolFunction, agent_name, openai_tool, parse_tool_call, result_text
from .schema import prepare_arguments

#: seconds one call of a tool may take, unless the caller says otherwise (the option's default)
TOOL_TIMEOUT: float = option("tool_timeout").default

__all__ = ["Confinement", "StartedToolClient", "ToolClient", "bridge_command", "tool_environment"]

_KIND_WORDS = {"cli": "command-line tool", "mcp": "MCP server (stdio)", "http": "HTTP service"}


def tool_environment(*extras: Mapping[str, str] | None) -> dict[str, str]:
    """The whole environment a deployed tool starts with: the allowlist, ``HOME``, then ``extras``.

    The allowlist is :func:`flakebot_magic.host.process.allowed_env` (``PATH``,
    ``LANG``, ``LC_*``, ``TZ`` ...). A deployed tool runs as the user, so it
    gets the user's ``HOME`` (a path, not a secret). Nothing else of the
    kernel's environment passes (no API key, no ``DATABASE_URL``): what a tool
    needs beyond that, the user gives explicitly (the ``tool_env`` setting,
    ``tool(..., env={...})``), later mappings winning.
    """
    env = allowed_env(home=os.environ.get("HOME"))
    for mapping in extras:
        if mapping:
            env.update({str(k): str(v) for k, v in mapping.items()})
    return env


class Confinement:
    """A deployed tool run inside the sandbox: a private scratch dir, the store entry read-only.

    Used for what flakebot runs on its own initiative (the ``--help`` probe,
    acceptance examples) and, with the ``confine_tools`` setting, for every
    call. The scratch dir is the only writable directory and the working
    directory: inside, a tmpfs capped at the sandbox's ``tmp_bytes`` (the files flakebot put there, an
    input text, bound read-only into it), so a tool fills no disk; :meth:`close` removes it.
    """

    def __init__(self, binary: Path, store_path: Path) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="flakebot-tool-"))
        # the store entry and the binary (a nix tool's libraries are in /nix/store: the sandbox then shows it)
        visible = {Path(store_path).resolve(), Path(binary).resolve().parent}
        self.sandbox: Sandbox = Sandbox(
            self.scratch, read_only=tuple(sorted(visible)), cargo_home=self.scratch / ".cargo-home", scratch=True
        )

    def command(self, argv: list[str], timeout: float | None = None) -> list[str]:
        """``argv`` in the sandbox; ``timeout``: the call's wall seconds, which its CPU limit follows."""
        return self.sandbox.command(argv, timeout=timeout)

    def env(self, *extras: Mapping[str, str] | None) -> dict[str, str]:
        """The sandbox's environment plus ``extras`` (what the user passed explicitly)."""
        env = self.sandbox.env()
        for mapping in extras:
            env.update({str(k): str(v) for k, v in (mapping or {}).items()})
        return env

    def close(self) -> None:
        """Remove the scratch dir and the sandbox's process-count cgroups (after the process ended)."""
        self.sandbox.release()
        remove_tree(self.scratch, ignore_errors=True)


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
    """

    kind = "cli"

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
    ) -> None:
        self.name = name
        self.binary = Path(binary)
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

        A running server is restarted on entry and on exit, so the block gets
        a confined process and later calls an ordinary one again (running
        after the block if it ran before or within it).
        """
        with self._confined_lock:
            self._confined_depth += 1
            first = self._confined_depth == 1
        if first and not self.confine:
            self._confinement_changed()
        try:
            yield self
        finally:
            with self._confined_lock:
                self._confined_depth -= 1
                last = self._confined_depth == 0
            if last and not self.confine:
                self._confinement_changed()

    def _confinement_changed(self) -> None:
        """Processes started before no longer match :attr:`confined_now`: a server restarts."""

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
            raise ToolError(
                f"{self.name} cannot run: {why}. Its binary was not run. Build it again with "
                f"{typed(f'rebuild {self.name}')}; {typed('doctor')} sets the damaged entry aside."
            )

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
        kind = _KIND_WORDS.get(self.kind, self.kind)
        lines = [f"### `{self.name}`: {self.crate} {self.version} ({kind})", ""]
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
    contract = getattr(tool, "contract", None)
    if contract is not None and tool.kind == "http":
        args += ["--health", contract.health, "--ready-timeout", f"{contract.ready_timeout:g}"]
    return {"command": sys.executable, "args": [*args, str(tool.binary)], "env": {}}


class StartedToolClient(ToolClient):
    """A tool that runs as a process (MCP server, HTTP service) and learns its functions when started.

    Its functions are attributes too: ``calc.add(a=1, b=2)``.
    """

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
            # a service nothing has started yet (a build runs none of it): what it offers is read at its first use
            functions = self.functions()
        if not name.startswith("_") and functions and name in functions:
            return functions[name].function
        raise AttributeError(
            f"{type(self).__name__} {self.__dict__.get('name', '')!r} has no attribute or {self.member} {name!r}"
        )

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *(self._functions or {})})
