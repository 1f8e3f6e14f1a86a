"""Where flakebot keeps things, and the defaults every front door shares."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .host.fsutil import private_dir

if TYPE_CHECKING:
    from .llm.model import ModelConfig
    from .llm.usage import Prices

__all__ = ["BACKENDS", "DEBIAN_REGISTRY", "Settings", "default_cache_dir", "default_prices", "default_registry"]

#: where Debian's librust-*-dev packages install crate sources
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")
#: deploy backends: ``auto`` is nix when the ``nix`` command is on PATH, else cargo
BACKENDS = ("auto", "nix", "cargo")


def default_cache_dir() -> Path:
    """``$FLAKEBOT_CACHE_DIR``, else the user cache dir (``~/.cache/flakebot`` on Linux)."""
    env = os.environ.get("FLAKEBOT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("flakebot", appauthor=False))


def default_tool_env(text: str | None = None) -> dict[str, str]:
    """The ``tool_env`` setting from ``$FLAKEBOT_TOOL_ENV``: ``NAME=VALUE`` entries and bare ``NAME`` s, comma-separated.

    A bare name passes that variable of the kernel's environment on (when
    set); ``NAME=VALUE`` sets it. This is the only way a variable the
    allowlist drops (an API key) reaches a deployed tool::

        FLAKEBOT_TOOL_ENV="GITHUB_TOKEN,RUST_LOG=debug"
    """
    text = os.environ.get("FLAKEBOT_TOOL_ENV", "") if text is None else text
    env: dict[str, str] = {}
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, value = entry.partition("=")
        name = name.strip()
        if sep:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    return env


def default_prices(text: str | None = None) -> Prices:
    """The ``prices`` setting from ``$FLAKEBOT_PRICES`` (``model=IN/OUT,...``, USD per million tokens); ``{}`` unset.

    A malformed value is a :class:`~flakebot_magic.errors.ConfigError` saying
    how to fix it (never a silent "no price")::

        FLAKEBOT_PRICES="gpt-4.1-mini=0.4/1.6,llama3=0/0"
    """
    text = os.environ.get("FLAKEBOT_PRICES", "") if text is None else text
    if not text.strip():
        return {}
    from .errors import ConfigError, UsageError
    from .llm.usage import parse_prices

    try:
        return parse_prices(text)
    except UsageError as exc:
        raise ConfigError(f"$FLAKEBOT_PRICES={text!r}: {exc} Fix or unset $FLAKEBOT_PRICES.") from None


def default_registry() -> str | None:
    """``$FLAKEBOT_REGISTRY``, else Debian's registry when present, else None (crates.io)."""
    env = os.environ.get("FLAKEBOT_REGISTRY")
    if env:
        return env
    if DEBIAN_REGISTRY.is_dir():
        return str(DEBIAN_REGISTRY)
    return None


@dataclass
class Settings:
    """Everything a run needs besides the request; front doors fill it from their options.

    ``registry`` is a directory path (a cargo ``directory`` source such as
    Debian's registry or a ``cargo vendor`` dir), the word ``crates.io``, or
    None for the default.
    """

    cache_dir: Path = field(default_factory=default_cache_dir)
    registry: str | None = None
    #: semantic search's model: a directory, ``off``, or None for the installed one
    #: (``$FLAKEBOT_EMBEDDING_MODEL``; :func:`flakebot_magic.registry.embedding.find_model`)
    embedding_model: str | None = field(default_factory=lambda: os.environ.get("FLAKEBOT_EMBEDDING_MODEL") or None)
    build_timeout: float = 1800.0
    test_timeout: float = 1800.0
    tool_timeout: float = 60.0
    keep_workspace: bool = False
    rebuild: bool = False
    #: ``auto``, ``nix`` or ``cargo`` (default ``$FLAKEBOT_BACKEND``, else ``auto``)
    backend: str = field(default_factory=lambda: os.environ.get("FLAKEBOT_BACKEND") or "auto")
    #: flake reference for the generated flakes' nixpkgs input (``$FLAKEBOT_NIXPKGS``);
    #: None: the default in :mod:`flakebot_magic.stages.flake`
    nixpkgs: str | None = field(default_factory=lambda: os.environ.get("FLAKEBOT_NIXPKGS") or None)
    #: passed to every nix command as ``--option builders`` etc. when set
    nix_builders: str | None = field(default_factory=lambda: os.environ.get("FLAKEBOT_NIX_BUILDERS"))
    nix_substituters: str | None = field(default_factory=lambda: os.environ.get("FLAKEBOT_NIX_SUBSTITUTERS"))
    nix_trusted_public_keys: str | None = field(
        default_factory=lambda: os.environ.get("FLAKEBOT_NIX_TRUSTED_PUBLIC_KEYS")
    )
    #: the edit loop's model (``$FLAKEBOT_MODEL``); None: no model, crates are deployed as published
    model: str | None = field(default_factory=lambda: os.environ.get("FLAKEBOT_MODEL") or None)
    #: an OpenAI-compatible endpoint (``$FLAKEBOT_BASE_URL``); default: the provider's
    base_url: str | None = field(default_factory=lambda: os.environ.get("FLAKEBOT_BASE_URL") or None)
    #: a preset: openai, groq, ollama, openrouter (``$FLAKEBOT_PROVIDER``)
    provider: str | None = field(default_factory=lambda: os.environ.get("FLAKEBOT_PROVIDER") or None)
    #: check runs the model may ask for in one edit session
    max_iterations: int = 8
    #: tokens (prompt + completion, summed over the session's model calls)
    token_budget: int = 400_000
    #: USD one edit session may spend (by ``prices``); None: no limit
    max_cost: float | None = None
    #: model -> :class:`~flakebot_magic.llm.usage.Price` (USD per million input, output and optionally cached
    #: input tokens); default ``$FLAKEBOT_PRICES``
    prices: Prices = field(default_factory=default_prices)
    #: the model's context size: older turns are compacted before a request would pass it
    context_tokens: int = 128_000
    #: ``--resume``: continue the tool's last unfinished edit session from its journal
    resume: bool = False
    #: edit sessions racing from forks of one workspace (1 to 8); the judge keeps the best
    candidates: int = 1
    #: one architect request (a plan) before the engineers start
    plan: bool = False
    #: the architect's model; None: the edit loop's
    architect_model: str | None = None
    #: let the model write build.rs (build scripts run code at build time)
    allow_build_scripts: bool = False
    #: without bubblewrap, let model-written code build and run unconfined (it sees $HOME, secrets, network)
    allow_unsandboxed: bool = False
    #: ``--continue``: apply the request to the existing tool's workspace and history
    follow_up: bool = False
    #: seconds allowed for one model request before the SDK retries it
    model_timeout: float = 120.0
    #: the largest model reply read, and how long one may stream (longer ones are unusable replies)
    max_reply_bytes: int = 4 * 1024 * 1024
    max_reply_seconds: float = 300.0
    #: variables added to every deployed tool's allowlisted environment (CLI calls, MCP and HTTP
    #: starts); nothing else of the kernel's environment, no API key, reaches a tool
    #: (default from ``$FLAKEBOT_TOOL_ENV``, see :func:`default_tool_env`)
    tool_env: dict[str, str] = field(default_factory=default_tool_env)
    #: run deployed tools inside the sandbox too (by default a deployed tool runs as the user)
    confine_tools: bool = False
    #: let agents (``flakebot mcp``'s clients, ``flakebot_magic.call``) ask for builds
    allow_agent_builds: bool = True
    #: builds one agent session may ask for, and the model tokens they may spend together
    agent_max_builds: int = 10
    agent_token_budget: int = 1_000_000

    def __post_init__(self) -> None:
        if self.prices:  # given as plain (input, output) tuples too: one shape, usage.Price, from here on
            from .llm.usage import parse_prices

            self.prices = parse_prices(dict(self.prices))

    def model_config(self) -> ModelConfig | None:
        """The configured model, or None (then libraries cannot become tools)."""
        from .llm.model import ModelConfig

        return ModelConfig.resolve(
            self.model, base_url=self.base_url, provider=self.provider, timeout=self.model_timeout
        )

    def private_cache_dir(self) -> Path:
        """The cache dir, created (or fixed) as mode 0700: logs, workspaces and the store are the user's alone."""
        return private_dir(self.cache_dir)

    # Every place under the cache is reached through these, so the cache dir is
    # private before anything is written into it.

    @property
    def workspaces_dir(self) -> Path:
        return self.private_cache_dir() / "workspaces"

    @property
    def store_dir(self) -> Path:
        return self.private_cache_dir() / "store"

    @property
    def tools_dir(self) -> Path:
        return self.private_cache_dir() / "tools"

    @property
    def attempts_dir(self) -> Path:
        """Builds that made no tool (failed, cancelled): one record each, beside the tool registry."""
        return self.tools_dir / "attempts"

    @property
    def recipes_dir(self) -> Path:
        return self.private_cache_dir() / "recipes"

    @property
    def index_dir(self) -> Path:
        return self.private_cache_dir() / "index"

    @property
    def logs_dir(self) -> Path:
        return self.private_cache_dir() / "logs"

    @property
    def intents_dir(self) -> Path:
        """Transactions not finished yet (:mod:`flakebot_magic.manage.transaction`): one intent record per tool name."""
        return self.private_cache_dir() / "intents"

    @property
    def gcroots_dir(self) -> Path:
        """Nix GC roots of live tools (nix backend): one symlink per tool name."""
        return self.private_cache_dir() / "gcroots"
