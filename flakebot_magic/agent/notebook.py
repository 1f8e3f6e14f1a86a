"""In a notebook: flakebot's functions and every built tool as OpenAI tools, and one call to run a model's tool call.

::

    tools = flakebot_magic.agent_tools()           # build_tool, search_crates, every built tool (strict mode)
    reply = client.chat.completions.create(model=..., messages=messages, tools=tools)
    for tool_call in reply.choices[0].message.tool_calls or []:
        messages.append(flakebot_magic.call(tool_call))   # builds when asked; returns the `tool` message

A tool the model had built is in the next ``agent_tools()`` and callable at
once, and it is put in the kernel under its name. With the extension loaded
(``%load_ext flakebot_magic``) a build shows itself as ``%%flakebot`` builds
do (the magic's ``progress`` setting: the widget in a Jupyter kernel);
otherwise progress is printed. The kernel's settings
(``%config FlakebotMagics.model = ...``) apply, and the agent limits
(``allow_agent_builds``, ``agent_max_builds``, ``agent_token_budget``) count
this kernel's agent builds in each cache dir, for the kernel's life: a call
passing other options is held to the limits those options set, with the
builds counted so far (no fresh count); the registry records them as
requested by ``notebook``.

Stopping a build: :func:`call` waits on the kernel's own thread, so the
kernel reads no message while it builds and the widget's Cancel button
cannot reach it (interrupting the kernel does stop it). ``await acall(...)``
waits on the kernel's event loop instead, as a ``%%flakebot`` cell does: the
Cancel button works, and so does an interrupt. Either way a stopped build
raises :class:`~flakebot_magic.errors.Cancelled` in the cell (the workspace
is kept): the person stopped it, so the model is not asked to go on.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..clients.agents import parse_tool_call, result_text, strict_schema
from ..config import Settings, apply
from ..errors import Cancelled
from ..events import Observer
from ..options import OPTIONS
from ..request import RunFlags, split_run_flags
from ..views.progress import TextProgress
from .builds import AgentBuild, AgentSession, BuildReport
from .catalog import ToolCatalog, decode_arguments
from .functions import BUILTIN_NAMES, BUILTINS, build_outcome, search

__all__ = ["NOTEBOOK", "acall", "agent_tools", "call", "mcp_config"]

#: who the registry says asked for a build made through :func:`call`
NOTEBOOK = "notebook"
#: the functions of flakebot's own a notebook agent gets
OFFERED = ("build_tool", "search_crates")


class _Agent:
    """A kernel's agent in one cache dir: its session (builds counted), the catalog of built tools.

    The session lives as long as the kernel: the agent limits count every
    build the kernel's agent asked for in this cache dir, whatever options
    each call passes (a call's options change the limits themselves, and
    how the next build runs, never the count so far).
    """

    def __init__(self, settings: Settings, flags: RunFlags) -> None:
        self.session = AgentSession(settings, requested_by=NOTEBOOK, flags=flags)
        self.catalog = ToolCatalog(settings, reserved=BUILTIN_NAMES)
        #: builds under way (an agent with one is never dropped)
        self.active = 0
        self._lock = threading.Lock()

    def busy(self, change: int) -> None:
        """One more (+1) or one fewer (-1) build under way."""
        with self._lock:
            self.active += change

    @property
    def settings(self) -> Settings:
        return self.session.settings

    def use(self, settings: Settings, flags: RunFlags) -> _Agent:
        """This call's settings and run flags: its limits and build options apply from now on; the counts are kept."""
        self.session.settings, self.session.flags = settings, flags
        if settings != self.catalog.settings:  # tool timeout, environment, confinement: clients made anew
            old, self.catalog = self.catalog, ToolCatalog(settings, reserved=BUILTIN_NAMES)
            old.close()
        return self

    def close(self) -> None:
        self.catalog.close()


class _Agents:
    """This interpreter's notebook agents, one per kernel (the IPython shell) and cache dir.

    A kernel's agents go when its shell does (a weak key); a kernel keeps
    at most ``per_kernel`` cache dirs' agents, the least recently used one
    without a build under way dropped first (its tool processes stopped).
    """

    def __init__(self, per_kernel: int = 8) -> None:
        self.per_kernel = per_kernel
        self._kernels: weakref.WeakKeyDictionary[object, OrderedDict[str, _Agent]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, kernel: object, settings: Settings, flags: RunFlags | None = None) -> _Agent:
        """The agent of ``kernel`` in ``settings``' cache dir, using ``settings`` (and ``flags``) from now on."""
        flags = flags or RunFlags()
        root = os.path.realpath(settings.cache.root)
        dropped: list[_Agent] = []
        with self._lock:
            agents = self._kernels.get(kernel)
            if agents is None:
                agents = self._kernels[kernel] = OrderedDict()
                weakref.finalize(kernel, _close_all, agents)  # the kernel ended: its tools' processes stop
            agent = agents.get(root)
            if agent is None:
                agent = agents[root] = _Agent(settings, flags)
            agents.move_to_end(root)
            idle = [key for key, other in agents.items() if other is not agent and other.active == 0]
            while len(agents) > self.per_kernel and idle:
                dropped.append(agents.pop(idle.pop(0)))
            agent.use(settings, flags)
        for old in dropped:
            old.close()
        return agent

    def count(self) -> int:
        """How many agents are kept (every kernel's)."""
        with self._lock:
            return sum(len(agents) for agents in self._kernels.values())


def _close_all(agents: OrderedDict[str, _Agent]) -> None:
    for agent in list(agents.values()):
        agent.close()
    agents.clear()


class _Interpreter:
    """A plain interpreter (no IPython shell): one kernel, for the interpreter's life."""


_NO_SHELL = _Interpreter()
#: this interpreter's notebook agents
_AGENTS = _Agents()


def _shell() -> Any:
    """The running IPython shell, if this is one (IPython is never imported for it)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    return get() if get is not None else None


def _magics() -> Any:
    """The kernel's ``FlakebotMagics`` when the extension is loaded (None otherwise)."""
    return getattr(getattr(_shell(), "magics_manager", None), "registry", {}).get("FlakebotMagics")


def _settings(cache_dir: str | Path | None, options: dict[str, Any]) -> tuple[Settings, RunFlags]:
    """The kernel's settings (its ``FlakebotMagics`` config traits) when the extension is loaded, then ``options``;
    and the run flags (``candidates``, ``plan``...) the agent's builds get, from the same two."""
    settings, flags = Settings(), RunFlags()
    magics = _magics()
    if magics is not None:  # the traits are the magic's public configuration (%config, ipython_config.py)
        apply(settings, {"cache_dir": magics.cache_dir})
        given, run = split_run_flags({o.name: getattr(magics, o.name) for o in OPTIONS if o.config})
        apply(settings, given)
        flags = RunFlags.given(run, flags)
    given, run = split_run_flags(options)
    return apply(settings, {"cache_dir": cache_dir, **given}), RunFlags.given(
        {k: v for k, v in run.items() if k != "follow_up"}, flags
    )


def _agent(cache_dir: str | Path | None = None, **options: Any) -> _Agent:
    """The kernel's agent in the cache dir these settings name (one session per kernel and cache dir)."""
    settings, flags = _settings(cache_dir, options)
    shell = _shell()
    return _AGENTS.get(shell if shell is not None else _NO_SHELL, settings, flags)


def agent_tools(*, cache_dir: str | Path | None = None, **options: Any) -> list[dict[str, Any]]:
    """OpenAI function schemas (strict mode) for build_tool, search_crates and every built tool.

    Pass them as ``tools=`` to ``client.chat.completions.create``; run what the
    model calls with :func:`call`. Each passes OpenAI's strict-mode rules (all
    properties required, optional ones nullable, no extra properties). The
    built tools are read from the tool inventory each time, so a tool built a
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
    builds (shown as ``%%flakebot`` shows a build) and the new tool is
    callable in the next turn; a failure (a refused or failed build, a tool
    error, bad arguments) becomes the message's content, so the model can
    read it and try something else. A build stopped by a person (a kernel
    interrupt) raises :class:`~flakebot_magic.errors.Cancelled`. In a Jupyter
    kernel, ``await acall(tool_call)`` lets the widget's Cancel button stop it too.
    """
    answer = _Answer(tool_call, cache_dir, options)
    if answer.pending is not None:
        with answer.waiting() as pending:
            answer.report = pending.build.wait(pending.observers, tick=pending.tick)
    return answer.message()


async def acall(tool_call: Any, *, cache_dir: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """:func:`call`, awaited on the running event loop: ``messages.append(await acall(tool_call))``.

    In a Jupyter kernel the cell then awaits on the kernel's loop (as a
    ``%%flakebot`` cell does), so the kernel keeps reading messages while a
    tool builds: the widget's Cancel button stops the build, and a kernel
    interrupt does too; either raises :class:`~flakebot_magic.errors.Cancelled`.
    Calls of built tools run as in :func:`call`.
    """
    answer = _Answer(tool_call, cache_dir, options)
    if answer.pending is not None:
        with answer.waiting() as pending:
            answer.report = await pending.build.wait_async(pending.observers, tick=pending.tick)
    return answer.message()


class _Answer:
    """One tool call's answer, but for the wait on a build, which :func:`call` blocks on and :func:`acall` awaits.

    A failure (a refused or failed build, a tool error, bad arguments) becomes
    the answer's content, for the model to read; a person's stop (a kernel
    interrupt, :class:`~flakebot_magic.errors.Cancelled`) propagates.
    """

    def __init__(self, tool_call: Any, cache_dir: str | Path | None, options: dict[str, Any]) -> None:
        self.call_id, name, arguments = parse_tool_call(tool_call)
        agent = _agent(cache_dir, **options)
        self.pending: _PendingBuild | None = None
        self.report: BuildReport | None = None
        self.content = ""
        with self._told():
            if name == "build_tool":
                self.pending = _start(agent, arguments)
            else:
                self.content = _run(agent, name, arguments)

    @contextmanager
    def _told(self) -> Iterator[None]:
        try:
            yield
        except (KeyboardInterrupt, Cancelled):
            raise
        except Exception as exc:  # the model sees what went wrong, and may correct itself
            self.content = _error_text(exc)

    @contextmanager
    def waiting(self) -> Iterator[_PendingBuild]:
        """Around the wait for :attr:`pending`, which sets :attr:`report`: the agent not busy, the build's progress
        refreshed, then the answer made from the report."""
        pending = self.pending
        assert pending is not None, "waiting() is for a build_tool call"
        with self._told():
            try:
                yield pending
            finally:
                pending.agent.busy(-1)
                pending.refresh()
            assert self.report is not None, "the wait sets the report"
            self.content = pending.finish(self.report)

    def message(self) -> dict[str, Any]:
        """The ``tool`` message to send back."""
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.content}


def _error_text(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {exc}"


def _run(agent: _Agent, name: str, arguments: str) -> str:
    if name == "search_crates":
        return search(agent.settings, decode_arguments(arguments)).text
    entry = agent.catalog.find(name)
    if entry is None:
        known = ", ".join([*OFFERED, *(e.name for e in agent.catalog.entries())])
        return f"error: there is no function {name!r}; the functions are {known}"
    _, json_text = entry.openai()
    return result_text(entry.invoke(decode_arguments(arguments, json_text)))


class _PendingBuild:
    """A ``build_tool`` call under way: the build, how it shows itself, and what its answer says."""

    def __init__(self, agent: _Agent, build: AgentBuild, title: str) -> None:
        self.agent = agent
        self.build = build
        self.observers, self.tick, self.refresh = _progress(
            agent.settings, title, lambda: build.cancel("cancelled from the widget")
        )

    def finish(self, report: BuildReport) -> str:
        """The tool is built: into the kernel and the catalog; the answer for the model."""
        agent = self.agent
        agent.catalog.adopt(report.tool)
        shell = _shell()
        if shell is not None:
            shell.push({report.tool.name: report.tool})
        functions = [e.name for e in agent.catalog.entries() if e.tool == report.tool.name]
        return build_outcome(report.tool, functions, report.requested_by, report.tokens).text


def _start(agent: _Agent, arguments: str) -> _PendingBuild:
    args = decode_arguments(arguments)
    request, name, crate = str(args.get("request") or ""), args.get("name"), args.get("crate")
    agent.busy(+1)
    try:
        build = agent.session.start(request, name=name, crate=crate)
        return _PendingBuild(agent, build, request or crate or "")
    except BaseException:
        agent.busy(-1)
        raise


def _progress(
    settings: Settings, title: str, cancel: Callable[[], None]
) -> tuple[list[Observer], Callable[[], None] | None, Callable[[], None]]:
    """How a build shows itself: as the magic shows its builds when the extension is loaded, else printed lines."""
    magics = _magics()
    if magics is not None:
        # the build's error goes to the model as the tool message: the person watching sees it in the widget
        shown = magics.show_build(title, settings, cancel, show_error=True)
        return list(shown.observers), shown.tick, shown.refresh
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
