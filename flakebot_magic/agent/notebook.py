"""In a notebook: flakebot's functions and every built tool as OpenAI tools, and one call to run a model's tool call.

::

    tools = flakebot_magic.agent_tools()           # build_tool, search_crates, every built tool (strict mode)
    reply = client.chat.completions.create(model=..., messages=messages, tools=tools)
    for tool_call in reply.choices[0].message.tool_calls or []:
        messages.append(flakebot_magic.call(tool_call))   # builds when asked; returns the `tool` message

A tool the model had built is in the next ``agent_tools()`` and callable at
once, and it is put in the kernel under its name. In a Jupyter kernel the
build shows the same progress widget as ``%%flakebot`` (interrupting the
kernel cancels it); elsewhere progress is printed. The kernel's settings
(``%config FlakebotMagics.model = ...``) apply, and the agent limits
(``allow_agent_builds``, ``agent_max_builds``, ``agent_token_budget``) count
this kernel's agent builds; the registry records them as requested by
``notebook``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..clients.agents import parse_tool_call, result_text, strict_schema
from ..config import Settings
from ..errors import FlakebotError
from ..events import Observer
from ..options import apply
from ..progress import TextProgress
from ..tools import diff_of
from .builds import AgentSession
from .catalog import ToolCatalog, decode_arguments
from .functions import BUILTIN_NAMES, BUILTINS, build_outcome, search

__all__ = ["NOTEBOOK", "agent_tools", "call", "mcp_config"]

#: who the registry says asked for a build made through :func:`call`
NOTEBOOK = "notebook"
#: the functions of flakebot's own a notebook agent gets
OFFERED = ("build_tool", "search_crates")


class _Agent:
    """A kernel's agent: its settings, its session (builds counted), the catalog of built tools."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.session = AgentSession(settings, requested_by=NOTEBOOK)
        self.catalog = ToolCatalog(settings, reserved=BUILTIN_NAMES)


_AGENTS: dict[str, _Agent] = {}


def _shell() -> Any:
    """The running IPython shell, if this is one (IPython is never imported for it)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    return get() if get is not None else None


def _settings(cache_dir: str | Path | None, options: dict[str, Any]) -> Settings:
    """The kernel's settings (its ``FlakebotMagics`` config) when the extension is loaded, then ``options``."""
    settings = Settings()
    shell = _shell()
    magics = getattr(getattr(shell, "magics_manager", None), "registry", {}).get("FlakebotMagics")
    if magics is not None:
        settings = magics._settings(argparse.Namespace())
    return apply(settings, {"cache_dir": cache_dir, **options})


def _agent(cache_dir: str | Path | None = None, **options: Any) -> _Agent:
    settings = _settings(cache_dir, options)
    # one session per settings (the kernel's config and these options): its builds are counted together
    key = repr(settings)
    agent = _AGENTS.get(key)
    if agent is None:
        agent = _AGENTS[key] = _Agent(settings)
    return agent


def agent_tools(*, cache_dir: str | Path | None = None, **options: Any) -> list[dict[str, Any]]:
    """OpenAI function schemas (strict mode) for build_tool, search_crates and every built tool.

    Pass them as ``tools=`` to ``client.chat.completions.create``; run what the
    model calls with :func:`call`. Each passes OpenAI's strict-mode rules (all
    properties required, optional ones nullable, no extra properties). The
    built tools are read from the tool registry each time, so a tool built a
    moment ago (here, by a cell, by the command) is in the list.

    Parameters
    ----------
    cache_dir
        Where the tools live (default: the kernel's, else ``$FLAKEBOT_CACHE_DIR``).
    options
        Build options for this kernel's agent builds (``registry=``, ``model=``,
        ``allow_agent_builds=False`` ...), as ``flakebot_magic.build`` takes them.
    """
    agent = _agent(cache_dir, **options)
    offered = []
    for name in OFFERED:
        description, schema = BUILTINS[name]
        parameters, _ = strict_schema(schema)
        offered.append(
            {
                "type": "function",
                "function": {"name": name, "description": description, "parameters": parameters, "strict": True},
            }
        )
    return offered + [entry.openai()[0] for entry in agent.catalog.entries()]


def call(tool_call: Any, *, cache_dir: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """Run one tool call from a chat completion; return the ``tool`` message to send back.

    ``tool_call`` is an item of ``message.tool_calls`` (the ``openai`` object or
    its dict form) naming a function of :func:`agent_tools`. ``build_tool``
    builds (with the progress widget in a kernel) and the new tool is callable
    in the next turn; a failure (a refused or failed build, a tool error, bad
    arguments) becomes the message's content, so the model can read it and try
    something else.
    """
    call_id, name, arguments = parse_tool_call(tool_call)
    agent = _agent(cache_dir, **options)
    try:
        content = _run(agent, name, arguments)
    except KeyboardInterrupt:
        raise
    except FlakebotError as exc:
        content = f"error: {type(exc).__name__}: {exc}"
    except Exception as exc:  # the model sees what went wrong, and may correct itself
        content = f"error: {type(exc).__name__}: {exc}"
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _run(agent: _Agent, name: str, arguments: str) -> str:
    if name == "build_tool":
        args = decode_arguments(arguments)
        return _build(agent, str(args.get("request") or ""), args.get("name"), args.get("crate"))
    if name == "search_crates":
        return search(agent.settings, decode_arguments(arguments)).text
    entry = agent.catalog.find(name)
    if entry is None:
        known = ", ".join([*OFFERED, *(e.name for e in agent.catalog.entries())])
        return f"error: there is no function {name!r}; the functions are {known}"
    _, json_text = entry.openai()
    return result_text(entry.invoke(decode_arguments(arguments, json_text)))


def _build(agent: _Agent, request: str, name: str | None, crate: str | None) -> str:
    build = agent.session.start(request, name=name, crate=crate)
    observers, tick, done = _progress(agent.settings, request or crate or "", build.cancel)
    try:
        report = build.wait(observers, tick=tick)
    finally:
        done()
    agent.catalog.adopt(report.tool)
    shell = _shell()
    if shell is not None:
        shell.push({report.tool.name: report.tool})
    functions = [e.name for e in agent.catalog.entries() if e.tool == report.tool.name]
    return build_outcome(report.tool, functions, report.requested_by, report.tokens).text


def _progress(
    settings: Settings, title: str, cancel: Callable[[], None]
) -> tuple[list[Observer], Callable[[], None] | None, Callable[[], None]]:
    """How a build shows itself: the ``%%flakebot`` widget in a Jupyter kernel, else printed lines."""
    shell = _shell()
    if getattr(shell, "kernel", None) is not None:
        try:
            from IPython.display import display

            from ..ui import ProgressWidget
        except ImportError:  # no ipywidgets: printed progress
            pass
        else:
            # the model gets the error, not the notebook: the widget shows it to the user
            widget = ProgressWidget(title, on_cancel=cancel, diff=lambda tool: diff_of(settings, tool), show_error=True)
            handle = display(widget.mimebundle(), raw=True, display_id=True)  # type: ignore[no-untyped-call]

            def refresh() -> None:
                handle.update(widget.mimebundle(), raw=True)

            return [widget], widget.tick, refresh
    return [TextProgress(sys.stdout)], None, lambda: None


def mcp_config(
    *, name: str = "flakebot", cache_dir: str | Path | None = None, registry: str | None = None
) -> dict[str, Any]:
    """An ``mcpServers`` entry that starts ``flakebot mcp`` (stdio), to paste into an MCP client's settings.

    Examples
    --------
    >>> mcp_config()["mcpServers"]["flakebot"]["args"]             # doctest: +SKIP
    ['mcp']
    """
    command = Path(sys.executable).parent / "flakebot"
    args = ["mcp"]
    if registry:
        args += ["--registry", str(registry)]
    env: dict[str, str] = {}
    if cache_dir is not None:
        env["FLAKEBOT_CACHE_DIR"] = str(Path(cache_dir).expanduser())
    entry: dict[str, Any] = {"command": str(command) if command.exists() else "flakebot", "args": args, "env": env}
    return {"mcpServers": {name: entry}}
