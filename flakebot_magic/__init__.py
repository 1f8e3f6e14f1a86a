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

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import (
    BudgetExhausted,
    BuildError,
    Cancelled,
    ConfigError,
    DeployError,
    EditError,
    FlakebotError,
    FlakeError,
    ForkError,
    ModelError,
    NeedsModelError,
    RegistryError,
    SearchError,
    StageTimeout,
    TestError,
    ToolError,
    UsageError,
)

if TYPE_CHECKING:
    from .events import Observer
    from .registry.base import CrateCandidate
    from .clients.base import ToolClient

__version__ = "0.1.0"

__all__ = [
    "BudgetExhausted",
    "BuildError",
    "Cancelled",
    "ConfigError",
    "DeployError",
    "EditError",
    "FlakeError",
    "FlakebotError",
    "ForkError",
    "ModelError",
    "NeedsModelError",
    "RegistryError",
    "SearchError",
    "StageTimeout",
    "TestError",
    "ToolError",
    "UsageError",
    "__version__",
    "build",
    "load_ipython_extension",
    "search",
    "unload_ipython_extension",
]


def build(
    request: str = "",
    *,
    name: str | None = None,
    crate: str | None = None,
    registry: str | Path | None = None,
    rebuild: bool = False,
    keep_workspace: bool = False,
    cache_dir: str | Path | None = None,
    observers: Iterable[Observer] = (),
    model: str | None = None,
    base_url: str | None = None,
    provider: str | None = None,
    max_iterations: int | None = None,
    token_budget: int | None = None,
    follow_up: bool = False,
    allow_build_scripts: bool = False,
    backend: str | None = None,
    nixpkgs: str | None = None,
    nix_builders: str | None = None,
    nix_substituters: str | None = None,
    nix_trusted_public_keys: str | None = None,
) -> ToolClient:
    """Build the tool for ``request`` and return it, callable.

    Parameters
    ----------
    request
        What the tool should do, in words.
    name
        The tool's name (a Python identifier); default: from the crate's name.
    crate
        Use this crate instead of searching.
    registry
        A cargo directory source, ``"crates.io"``, or None for the default
        (Debian's ``/usr/share/cargo/registry`` when installed).
    rebuild
        Fork and build again even when the store has the tool.
    keep_workspace
        Keep the build outputs (``target/``) in the workspace after success.
    cache_dir
        Where workspaces, the store and the index live.
    observers
        Callables that receive every pipeline event.
    model
        The edit loop's model (default ``$FLAKEBOT_MODEL``). With one, a
        library crate becomes the requested tool: the model edits the fork,
        cargo build and cargo test prove each step. None: crates with a
        binary are deployed as published.
    base_url, provider
        The model's OpenAI-compatible endpoint, or a preset (``"openai"``,
        ``"groq"``, ``"ollama"``, ``"openrouter"``) that knows its URL and
        key variable. Keys come from the environment.
    max_iterations, token_budget
        The edit session's limits (default 8 check runs, 400,000 tokens).
    follow_up
        Apply ``request`` to the existing tool ``name`` (its workspace and
        history) and redeploy it, like ``%%flakebot --continue``.
    allow_build_scripts
        Let the model write ``build.rs``.
    backend
        ``"nix"`` (``nix build`` of the generated flake; the tool is a
        /nix/store path), ``"cargo"``, or ``"auto"``: nix when the ``nix``
        command is installed. Default: ``$FLAKEBOT_BACKEND``, else auto.
    nixpkgs
        Flake reference for the flake's nixpkgs input, e.g.
        ``"github:NixOS/nixpkgs/<rev>"`` or ``"path:/a/local/nixpkgs"``.
    nix_builders, nix_substituters, nix_trusted_public_keys
        Passed to nix as ``--option builders`` (etc.): remote builders and a
        shared binary cache.
    """
    from .config import Settings
    from .pipeline import Pipeline

    settings = Settings(registry=str(registry) if registry is not None else None, rebuild=rebuild, keep_workspace=keep_workspace)
    if cache_dir is not None:
        settings.cache_dir = Path(cache_dir)
    for attr, value in (("model", model), ("base_url", base_url), ("provider", provider),
                        ("max_iterations", max_iterations), ("token_budget", token_budget)):
        if value is not None:
            setattr(settings, attr, value)
    settings.follow_up, settings.allow_build_scripts = follow_up, allow_build_scripts
    for attr, value in (("backend", backend), ("nixpkgs", nixpkgs), ("nix_builders", nix_builders),
                        ("nix_substituters", nix_substituters), ("nix_trusted_public_keys", nix_trusted_public_keys)):
        if value is not None:
            setattr(settings, attr, value)
    return Pipeline(settings, observers=observers).run(request, name=name, crate=crate)


def search(
    query: str, *, registry: str | Path | None = None, limit: int = 10, cache_dir: str | Path | None = None
) -> list[CrateCandidate]:
    """Ranked crate candidates for ``query`` (binaries first when a tool is asked for)."""
    from .config import Settings
    from .stages import search as search_stage

    settings = Settings(registry=str(registry) if registry is not None else None)
    if cache_dir is not None:
        settings.cache_dir = Path(cache_dir)
    found = search_stage.open_registry(settings.registry, settings.cache_dir)
    return search_stage.search(found, query, limit=limit)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext flakebot_magic``: register the ``%%flakebot`` magic."""
    from .magics import FlakebotMagics

    ipython.register_magics(FlakebotMagics)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext flakebot_magic``: remove the kernel's input transformer for ``%%flakebot`` cells."""
    from .magics import _uninstall_transformer

    _uninstall_transformer(ipython)
