"""flakebot-magic: turn a request into a compiled, tested, reproducible Rust tool.

In a notebook::

    %load_ext flakebot_magic

    %%flakebot --name md
    Render Markdown text to HTML.

From Python::

    >>> import flakebot_magic
    >>> md = flakebot_magic.build("render markdown to html", name="md")  # doctest: +SKIP
    >>> md("# Hi")                                                        # doctest: +SKIP
    '<h1>Hi</h1>\\n'

Importing this package is cheap: IPython, openai, ipywidgets and tornado are
imported only by the parts that need them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import errors
from ._version import __version__
from .errors import *  # noqa: F403  (the error classes: their one list is errors.__all__)

if TYPE_CHECKING:
    from .clients import ToolClient
    from .events import Observer
    from .registry.base import CrateCandidate

__all__ = [
    "__version__",
    "acall",
    "agent_tools",
    "build",
    "call",
    "load",
    "load_ipython_extension",
    "search",
    "unload_ipython_extension",
]
__all__ += errors.__all__  # every error a caller may catch, listed once in errors.py (mypy reads this form)


def build(
    request: str = "",
    *,
    name: str | None = None,
    crate: str | None = None,
    cache_dir: str | Path | None = None,
    observers: Iterable[Observer] = (),
    **options: Any,
) -> ToolClient:
    """Build the tool for ``request`` and return it, callable.

        The same pipeline as ``%%flakebot`` and ``flakebot build``, with every
        build option of theirs as a keyword (the list below is made from the
        options table, :mod:`flakebot_magic.options`). Ctrl-C cancels the build
        and keeps its workspace; the run's log is kept like the magic's.

        Parameters
        ----------
        request
            What the tool should do, in words.
        name
            The tool's name (a Python identifier); default: from the crate's name.
        crate
            Use this crate instead of searching.
        cache_dir
            Where workspaces, the store and the index live.
        observers
            Callables that receive every pipeline event.
    {options}
    """
    from .config import Settings, apply
    from .pipeline.background import start_build
    from .request import BuildRequest, PersonText, split_run_flags

    given, flags = split_run_flags(options)  # rebuild, candidates...: this run's, in the request
    settings = apply(Settings(), {"cache_dir": cache_dir, **given})
    wanted = BuildRequest(PersonText(request), name=name, crate=crate).with_options(flags)  # the person's own words
    tool: ToolClient = start_build(settings, wanted).wait(list(observers))
    return tool


def _document_build() -> None:
    """Give :func:`build` the signature and parameter list of the options table."""
    import inspect

    from .options import OPTIONS

    signature = inspect.signature(build)
    fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    extra = [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=f"{o.type.__name__} | None")
        for o in OPTIONS
    ]
    build.__signature__ = signature.replace(parameters=[*fixed, *extra])  # type: ignore[attr-defined]
    import textwrap

    entries = [
        f"    {o.name}\n"
        + textwrap.fill(o.help[0].upper() + o.help[1:] + ".", 72, initial_indent=" " * 8, subsequent_indent=" " * 8)
        for o in OPTIONS
    ]
    build.__doc__ = (build.__doc__ or "").format(options="\n".join(entries))


def load(
    name: str,
    *,
    cache_dir: str | Path | None = None,
    provenance: Mapping[str, Any] | None = None,
    notebook: str | Path | None = None,
    **options: Any,
) -> ToolClient:
    """The tool ``name`` built earlier (by any front door), callable again; nothing is rebuilt.

    A command-line tool is returned as it is; an MCP or HTTP tool has its
    process started. Nothing is put in a namespace: after a kernel restart,
    ``%flakebot load NAME`` (or ``--all``) does that, or assign the result.
    ``options`` are build options that apply to calling tools
    (``tool_timeout``, ``confine_tools``, ...).

    With ``provenance`` (what a ``%%flakebot`` cell's output recorded, its
    ``metadata["flakebot"]``) or ``notebook`` (a .ipynb holding it), the tool
    is that exact nix store path: the one here when it is, else pulled from
    ``nix_substituters`` with its signature (``nix_trusted_public_keys``) and
    narHash checked, as ``flakebot pull`` does.

    Examples
    --------
    >>> md = flakebot_magic.load("md")  # doctest: +SKIP
    >>> md("# Hi")                      # doctest: +SKIP
    '<h1>Hi</h1>\\n'
    """
    from .config import Settings, apply
    from .manage import tools

    settings = apply(Settings(), {"cache_dir": cache_dir, **options})
    if provenance is None and notebook is None:
        tool: ToolClient = tools.load(settings, name)
        return tool
    from .pipeline import team

    recorded = dict(provenance) if provenance is not None else team.notebook_provenance(Path(str(notebook)), name)
    return team.load_pinned(settings, name, recorded)


def search(
    query: str, *, registry: str | Path | None = None, limit: int = 10, cache_dir: str | Path | None = None
) -> list[CrateCandidate]:
    """Ranked crate candidates for ``query`` (binaries first when a tool is asked for)."""
    from .config import Settings
    from .stages import search as search_stage

    settings = Settings(registry=str(registry) if registry is not None else None)
    if cache_dir is not None:
        settings.cache_dir = Path(cache_dir)
    found = search_stage.open_registry(settings.registry, settings.cache_dir, settings.embedding_model)
    return search_stage.search(found, query, limit=limit)


_document_build()


def agent_tools(*, cache_dir: str | Path | None = None, **options: Any) -> list[dict[str, Any]]:
    """OpenAI function schemas (strict mode) for ``build_tool``, ``search_crates`` and every built tool.

    Pass them as ``tools=`` to a chat completion and run the model's tool calls
    with :func:`call`; see :func:`flakebot_magic.agent.notebook.agent_tools`.
    """
    from .agent.notebook import agent_tools as tools_for_agents

    return tools_for_agents(cache_dir=cache_dir, **options)


def call(tool_call: Any, *, cache_dir: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """Run one tool call from a chat completion (building a tool when asked); return the ``tool`` message.

    A tool built this way is in the next :func:`agent_tools` and callable at
    once; see :func:`flakebot_magic.agent.notebook.call`.
    """
    from .agent.notebook import call as call_for_agent

    return call_for_agent(tool_call, cache_dir=cache_dir, **options)


async def acall(tool_call: Any, *, cache_dir: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """:func:`call`, awaited on the kernel's event loop, so the widget's Cancel button stops a build.

    ``messages.append(await flakebot_magic.acall(tool_call))``; see
    :func:`flakebot_magic.agent.notebook.acall`.
    """
    from .agent.notebook import acall as acall_for_agent

    return await acall_for_agent(tool_call, cache_dir=cache_dir, **options)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext flakebot_magic``: register the ``%%flakebot`` magic; advice from here on names the notebook's
    form of a command."""
    from .commands import advise
    from .magics import FlakebotMagics

    ipython.register_magics(FlakebotMagics)
    advise("notebook")


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext flakebot_magic``: remove the kernel's input transformer for ``%%flakebot`` cells."""
    from .commands import advise
    from .magic_cells import uninstall_transformer

    uninstall_transformer(ipython)
    advise("")
