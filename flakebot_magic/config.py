"""Where flakebot keeps things, and the defaults every front door shares."""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .commands import sentence, typed
from .errors import ConfigError
from .host.cache import CacheLayout
from .options import OPTION_BY_NAME, OPTIONS, Option, accepted, option

if TYPE_CHECKING:
    from .llm.limits import ReplyLimits
    from .llm.model import ModelConfig
    from .llm.usage import Prices

__all__ = [
    "BACKENDS",
    "DEBIAN_REGISTRY",
    "LoopLimits",
    "Settings",
    "absolute_dir",
    "add_arguments",
    "apply",
    "config_traits",
    "default_cache_dir",
    "default_registry",
    "magic_argument_decorators",
]

#: where Debian's librust-*-dev packages install crate sources
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")
#: deploy backends: ``auto`` is nix when the ``nix`` command is on PATH, else cargo
BACKENDS = ("auto", "nix", "cargo")


def absolute_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` with ``~`` expanded, made absolute against today's working directory (``..`` and symlinks kept,
    for the kernel to resolve as it would have).

    A cache dir given relative would name another place once the kernel's or
    a tool server's working directory changes, and the paths its records
    keep would no longer be its own.

    >>> absolute_dir("/tmp/c"), absolute_dir("c") == Path.cwd() / "c"
    (PosixPath('/tmp/c'), True)
    """
    return Path(os.path.expanduser(os.fspath(path))).absolute()


def default_cache_dir() -> Path:
    """``$FLAKEBOT_CACHE_DIR``, else the user cache dir (``~/.cache/flakebot`` on Linux)."""
    env = os.environ.get("FLAKEBOT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("flakebot", appauthor=False))


def default_registry() -> str | None:
    """The registry when none is given: ``$FLAKEBOT_REGISTRY`` (read by its option), else Debian's when present,
    else None (crates.io)."""
    given = option("registry").default_value()
    if given:
        return str(given)
    if DEBIAN_REGISTRY.is_dir():
        return str(DEBIAN_REGISTRY)
    return None


@dataclass(frozen=True)
class LoopLimits:
    """What one edit loop may do, from the settings (:meth:`Settings.loop_limits`): the loop has no defaults of its own.

    ``max_iterations`` check runs the model may ask for; each check run's
    ``cargo build`` (and clippy, and downloads) within ``build_timeout`` and
    its ``cargo test`` within ``test_timeout`` seconds; the conversation kept
    within ``context_tokens``; build scripts only with ``allow_build_scripts``.
    """

    max_iterations: int
    build_timeout: float
    test_timeout: float
    context_tokens: int
    allow_build_scripts: bool


def _option(name: str) -> Any:
    """A :class:`Settings` field whose default is the option ``name``'s (:data:`~flakebot_magic.options.OPTIONS`):
    its default, or its environment variable's value, read when the settings are made."""
    opt = option(name)
    return field(default_factory=lambda: copy.deepcopy(opt.default_value()))


@dataclass
class Settings:
    """Everything a run needs besides the request; front doors fill it from their options.

    Every field but ``cache_dir`` is an option: its meaning, default and
    environment variable are in :data:`~flakebot_magic.options.OPTIONS`, and
    nowhere else (``cache_dir``: :func:`default_cache_dir`). The options that
    say how one run goes (``run_flag``: rebuild, resume, follow_up,
    candidates, plan) are not settings: they travel in the
    :class:`~flakebot_magic.request.BuildRequest`. ``registry`` is a
    directory path (a cargo ``directory`` source such as Debian's registry or
    a ``cargo vendor`` dir), the word ``crates.io``, or None for the default.
    """

    cache_dir: Path = field(default_factory=default_cache_dir)
    registry: str | None = _option("registry")
    #: semantic search's model: a directory, ``off``, or None for the installed one
    #: (:func:`flakebot_magic.registry.embedding.find_model`)
    embedding_model: str | None = _option("embedding_model")
    build_timeout: float = _option("build_timeout")
    test_timeout: float = _option("test_timeout")
    tool_timeout: float = _option("tool_timeout")
    keep_workspace: bool = _option("keep_workspace")
    backend: str = _option("backend")
    nixpkgs: str | None = _option("nixpkgs")
    nix_builders: str | None = _option("nix_builders")
    nix_substituters: str | None = _option("nix_substituters")
    nix_trusted_public_keys: str | None = _option("nix_trusted_public_keys")
    nix_max_jobs: int | None = _option("nix_max_jobs")
    nix_store: str | None = _option("nix_store")
    push_to: str | None = _option("push_to")
    nix_secret_key: str | None = _option("nix_secret_key")
    push_after_build: bool = _option("push_after_build")
    model: str | None = _option("model")
    base_url: str | None = _option("base_url")
    provider: str | None = _option("provider")
    max_iterations: int = _option("max_iterations")
    token_budget: int = _option("token_budget")
    max_cost: float | None = _option("max_cost")
    prices: Prices = _option("prices")
    context_tokens: int = _option("context_tokens")
    architect_model: str | None = _option("architect_model")
    allow_build_scripts: bool = _option("allow_build_scripts")
    allow_unsandboxed: bool = _option("allow_unsandboxed")
    model_timeout: float = _option("model_timeout")
    tool_format: str | None = _option("tool_format")
    max_reply_bytes: int = _option("max_reply_bytes")
    max_reply_seconds: float = _option("max_reply_seconds")
    tool_env: dict[str, str] = _option("tool_env")
    confine_tools: bool = _option("confine_tools")
    allow_agent_builds: bool = _option("allow_agent_builds")
    agent_max_builds: int = _option("agent_max_builds")
    agent_token_budget: int = _option("agent_token_budget")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "cache_dir":  # every way in (the constructor, apply, a front door's assignment): one place
            value = absolute_dir(value)
        super().__setattr__(name, value)

    def __post_init__(self) -> None:
        if self.prices:  # given as plain (input, output) tuples too: one shape, usage.Price, from here on
            from .llm.usage import parse_prices

            self.prices = parse_prices(dict(self.prices))

    def model_config(self) -> ModelConfig | None:
        """The configured model, or None (then libraries cannot become tools)."""
        from .llm.model import ModelConfig

        return ModelConfig.resolve(
            self.model,
            base_url=self.base_url,
            provider=self.provider,
            timeout=self.model_timeout,
            tool_format=self.tool_format,
        )

    def loop_limits(self) -> LoopLimits:
        """The limits every edit loop of a run gets."""
        return LoopLimits(
            max_iterations=self.max_iterations,
            build_timeout=self.build_timeout,
            test_timeout=self.test_timeout,
            context_tokens=self.context_tokens,
            allow_build_scripts=self.allow_build_scripts,
        )

    def reply_limits(self) -> ReplyLimits:
        """The caps on every model reply of a run."""
        from .llm.limits import ReplyLimits

        return ReplyLimits(max_bytes=self.max_reply_bytes, max_seconds=self.max_reply_seconds)

    def private_cache_dir(self) -> Path:
        """The cache dir, its layout's directories made private (``0700``): it is the user's alone."""
        return self.cache.root

    @property
    def cache(self) -> CacheLayout:
        """The cache dir's layout, each directory made private (``0700``) first: every path under the cache comes
        from it (:meth:`~flakebot_magic.host.cache.CacheLayout.create`)."""
        root = Path(self.cache_dir)
        for place in (root, *root.parents):  # the nearest part that exists must be a directory
            if os.path.lexists(place):
                if not place.is_dir():
                    what = "it is not a directory" if place == root else f"{place} is not a directory"
                    raise ConfigError(
                        f"The cache dir {root} cannot be used ({what}): it must be a directory you can write, or a "
                        "path where one can be made. Choose another with --cache-dir, the FLAKEBOT_CACHE_DIR "
                        "environment variable or the cache_dir= argument, or move what is there away."
                    )
                break
        return CacheLayout(root).create()


def apply(settings: Settings, values: Mapping[str, Any]) -> Settings:
    """Set every option in ``values`` that is not None on ``settings``; return it (the front doors' one way in).

    >>> settings = apply(Settings(), {"model": "m", "max_iterations": 3, "keep_workspace": None})
    >>> settings.model, settings.max_iterations, settings.keep_workspace
    ('m', 3, False)

    ``cache_dir`` is accepted too (a path). Unknown names raise
    :class:`~flakebot_magic.errors.UsageError` naming the known ones. A run
    flag (``rebuild``...) is the request's, not a setting: a front door
    splits its options first (:func:`~flakebot_magic.request.split_run_flags`,
    then :meth:`~flakebot_magic.request.BuildRequest.with_options`); given
    here it is a UsageError.
    """
    from .errors import UsageError

    for name, value in values.items():
        if value is None:
            continue
        if name == "cache_dir":
            settings.cache_dir = value  # made absolute by Settings itself
            continue
        opt = OPTION_BY_NAME.get(name)
        if opt is None:
            raise UsageError(f"Unknown option {name!r}. Options: {', '.join(sorted(OPTION_BY_NAME))}.")
        if opt.run_flag:  # a front door splits them off first (request.split_run_flags)
            raise UsageError(
                f"{name} is an option of one build, not a setting: give it with the build, "
                f"{typed('build ...', 'on the %%flakebot line')}, or to flakebot_magic.build()."
            )
        setattr(settings, name, accepted(opt, value))
    return settings


# -- the options table as each front door's flags (argparse, the magic's @arguments, config traits) ------


def _argparse_kwargs(opt: Option, *, defaults: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dest": opt.name, "help": sentence(opt.help)}
    if opt.type is not bool and not opt.choices:
        kwargs["metavar"] = opt.flags[0].lstrip("-").replace("-", "_").upper()
    if opt.type is bool:
        kwargs["action"] = "store_true"
        # None, not False: "not given" lets the kernel's config trait or the Settings default decide
        kwargs["default"] = None
    else:
        kwargs["type"] = opt.type
        if opt.choices:
            kwargs["choices"] = list(opt.choices)
        kwargs["default"] = None
    if defaults:
        kwargs["help"] += _default_text(opt)
    return kwargs


def _default_text(opt: Option) -> str:
    otherwise = opt.default_doc or (str(opt.default) if opt.default is not None else "")
    if opt.env:
        return f" Default: ${opt.env}" + (f", else {otherwise}." if otherwise else ".")
    if opt.default_doc:
        return f" Default: {opt.default_doc}."
    if opt.default not in (None, False):
        return f" Default: {opt.default}."
    return ""


def _flags(opt: Option) -> list[str]:
    return [*opt.flags, *([opt.short] if opt.short else [])]


def add_arguments(parser: argparse.ArgumentParser, *, skip: Iterable[str] = ()) -> None:
    """Add every per-build option to an argparse parser, in argument groups."""
    groups: dict[str, Any] = {}
    for opt in OPTIONS:
        if not opt.per_build or opt.name in skip:
            continue
        target = parser if opt.group == "build" else groups.setdefault(opt.group, parser.add_argument_group(opt.group))
        target.add_argument(*_flags(opt), **_argparse_kwargs(opt, defaults=True))


def magic_argument_decorators() -> list[Callable[[Any], Any]]:
    """``@argument(...)`` decorators for the per-build options, in table order."""
    from IPython.core.magic_arguments import argument

    return [argument(*_flags(o), **_argparse_kwargs(o, defaults=False)) for o in OPTIONS if o.per_build]


def config_traits() -> dict[str, Any]:
    """traitlets traits (``.tag(config=True)``) for the options that are kernel settings."""
    from traitlets import Bool, Dict, Enum, Float, Int, Unicode

    traits: dict[str, Any] = {}
    for opt in OPTIONS:
        if not opt.config:
            continue
        help_text = sentence(opt.help) + _default_text(opt)
        if opt.choices:
            trait: Any = Enum(list(opt.choices), None, allow_none=True, help=help_text)
        elif opt.type is dict:
            trait = Dict(None, allow_none=True, help=help_text)
        elif opt.type is bool:
            trait = Bool(None, allow_none=True, help=help_text)
        elif opt.type is int:
            trait = Int(None, allow_none=True, help=help_text)
        elif opt.type is float:
            trait = Float(None, allow_none=True, help=help_text)
        else:
            trait = Unicode(None, allow_none=True, help=help_text)
        traits[opt.name] = trait.tag(config=True)
    return traits
