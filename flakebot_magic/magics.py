"""The ``%%flakebot`` cell magic and ``%flakebot`` line magic (the only module importing IPython)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Int
from traitlets import Bool, Float, Unicode

from . import errors
from .config import Settings, default_cache_dir
from .progress import TextProgress

__all__ = ["FlakebotMagics"]


@magics_class
class FlakebotMagics(Magics):
    """Build Rust tools from a request and call them from Python."""

    registry = Unicode(
        None,
        allow_none=True,
        help="Crate registry: a cargo directory source path, or 'crates.io'. "
        "Default: Debian's /usr/share/cargo/registry when installed, else crates.io.",
    ).tag(config=True)
    cache_dir = Unicode(
        None, allow_none=True, help="Where workspaces, the store and the search index live."
    ).tag(config=True)
    build_timeout = Float(1800.0, help="Seconds allowed for cargo build, and for cargo test.").tag(config=True)
    tool_timeout = Float(60.0, help="Default seconds allowed for one call of a deployed tool.").tag(config=True)
    keep_workspace = Bool(
        False, help="Keep build outputs (target/) in the workspace after a successful build."
    ).tag(config=True)
    verbose = Bool(False, help="Print cargo's output as it comes.").tag(config=True)
    model = Unicode(
        None,
        allow_none=True,
        help="The language model of the edit loop, which turns a crate (a library too) into the "
        "requested tool. Any OpenAI-compatible endpoint: set base_url or provider too. "
        "Default: $FLAKEBOT_MODEL; none: crates with a binary are deployed as published.",
    ).tag(config=True)
    base_url = Unicode(
        None, allow_none=True,
        help="The model's OpenAI-compatible endpoint, e.g. http://localhost:11434/v1. Default: the provider's.",
    ).tag(config=True)
    provider = Unicode(
        None, allow_none=True,
        help="A preset that knows its base URL and key variable: openai (OPENAI_API_KEY), groq "
        "(GROQ_API_KEY), ollama (no key), openrouter (OPENROUTER_API_KEY). Keys come from the environment.",
    ).tag(config=True)
    max_iterations = Int(8, help="Check runs (cargo build + cargo test) the model may ask for in one session.").tag(
        config=True
    )
    token_budget = Int(400_000, help="Tokens one edit session may spend (prompt + completion).").tag(config=True)
    allow_build_scripts = Bool(
        False, help="Let the model write build.rs (build scripts run arbitrary code at build time)."
    ).tag(config=True)

    def _settings(self, args: Any) -> Settings:
        settings = Settings(
            registry=args.registry if args.registry is not None else self.registry,
            build_timeout=self.build_timeout,
            test_timeout=self.build_timeout,
            tool_timeout=self.tool_timeout,
            keep_workspace=args.keep_workspace or self.keep_workspace,
            rebuild=args.rebuild,
        )
        settings.cache_dir = Path(self.cache_dir) if self.cache_dir else default_cache_dir()
        for attr in ("model", "base_url", "provider", "max_iterations"):
            value = getattr(args, attr, None)
            value = value if value is not None else getattr(self, attr)
            if value is not None:  # else the Settings default ($FLAKEBOT_MODEL, ...)
                setattr(settings, attr, value)
        settings.token_budget = self.token_budget
        settings.allow_build_scripts = bool(getattr(args, "allow_build_scripts", False) or self.allow_build_scripts)
        settings.follow_up = bool(getattr(args, "follow_up", False))
        return settings

    @magic_arguments()
    @argument("command", nargs="*", help="Line mode only: `list`, `clean [--all]` or `search QUERY`.")
    @argument("--name", "-n", help="Name of the tool in the kernel (a Python identifier). Default: from the crate.")
    @argument("--crate", "-c", help="Use this crate instead of searching.")
    @argument("--registry", "-r", help="A cargo directory source (e.g. `cargo vendor` output), or 'crates.io'.")
    @argument("--rebuild", action="store_true", help="Fork and build again, ignoring the cache.")
    @argument("--keep-workspace", action="store_true", help="Keep build outputs (target/) after success.")
    @argument("--all", action="store_true", help="With `clean`: remove every tool, workspace and store entry.")
    @argument("--verbose", "-v", action="store_true", help="Print cargo's output as it comes.")
    @argument("--model", "-m", help="The edit loop's model (any OpenAI-compatible endpoint); see FlakebotMagics.model.")
    @argument("--base-url", help="The model's OpenAI-compatible endpoint (default: the provider's).")
    @argument("--provider", help="openai, groq, ollama or openrouter: knows the base URL and the key variable.")
    @argument("--max-iterations", type=int, help="Check runs the model may ask for (default 8).")
    @argument(
        "--continue", dest="follow_up", action="store_true",
        help="Apply the cell's instructions to the existing tool --name (its workspace and history), then redeploy.",
    )
    @argument("--allow-build-scripts", action="store_true", help="Let the model write build.rs.")
    @line_cell_magic
    def flakebot(self, line: str, cell: str | None = None) -> Any:
        """Turn a request into a compiled, tested Rust tool, and put it in the kernel.

        Cell mode builds a tool::

            %%flakebot --name md
            Render Markdown text to HTML.

        flakebot searches the crate registry, forks the best crate's published
        source into a git workspace, proves it with `cargo build --release`
        and `cargo test`, writes a flake.nix, deploys the binary to a
        content-addressed store, and injects a Python callable under --name:
        `md("# Hi")` returns `<h1>Hi</h1>\\n`. Re-running an unchanged cell is a
        cache hit. A failed run keeps its workspace and says where it is.

        With a model (--model NAME with --provider or --base-url, or
        `%config FlakebotMagics.model = 'NAME'`), the best crate may be a
        library: the edit loop lets the model write the tool, and cargo build
        and cargo test prove every step in a sandbox until they pass.
        `%%flakebot --name N --continue` applies new instructions to the tool
        N, with its workspace and history, and redeploys it::

            %%flakebot --name sha --continue
            Also accept a --upper flag.

        Line mode manages tools::

            %flakebot list            the tools built on this machine
            %flakebot search QUERY    ranked crate candidates
            %flakebot clean [--all]   remove unused workspaces and store entries
        """
        args = parse_argstring(self.flakebot, line)
        if cell is None:
            return self._line(args)
        if args.command:
            raise UsageError(
                f"Unexpected words after %%flakebot: {' '.join(args.command)!r}. "
                "Options go on the %%flakebot line (see %%flakebot?), the request in the cell body."
            )
        if not cell.strip() and not args.crate:
            raise UsageError(
                "The cell is empty. Write what the tool should do under the %%flakebot line, e.g.\n"
                "    %%flakebot --name md\n    Render Markdown text to HTML."
            )
        from .pipeline import Pipeline

        progress = TextProgress(sys.stdout, verbose=args.verbose or self.verbose)
        pipeline = Pipeline(self._settings(args), observers=[progress])
        try:
            tool = pipeline.run(cell, name=args.name, crate=args.crate)
        except errors.UsageError as exc:
            raise UsageError(str(exc)) from None
        self.shell.push({tool.name: tool})
        print(f"flakebot: `{tool.name}` is ready in the kernel: {tool.example()}")
        return tool

    def _line(self, args: Any) -> Any:
        if not args.command:
            raise UsageError("Usage: %flakebot list | search QUERY | clean [--all]; or %%flakebot as a cell magic.")
        command, rest = args.command[0], args.command[1:]
        settings = self._settings(args)
        if command == "list":
            from .inventory import Inventory

            records = Inventory(settings.tools_dir).all()
            if not records:
                print("No tools yet. Build one with %%flakebot.")
                return None
            for r in records:
                print(f"{r.name:<16} {r.crate}@{r.version:<12} {r.source_hash[:12]}  {r.backend:<6} {r.store_path}")
            return None
        if command == "search":
            if not rest:
                raise UsageError("Usage: %flakebot search QUERY")
            from . import search

            for c in search(" ".join(rest), registry=settings.registry, cache_dir=settings.cache_dir):
                print(f"{c.score:8.2f}  {c.name} {c.version}{' [bin]' if c.has_bin else ''}  {c.description[:80]}")
            return None
        if command == "clean":
            from .cleanup import clean

            for line in clean(settings, everything=args.all).summary():
                print(line)
            return None
        raise UsageError(f"Unknown subcommand {command!r}: use list, search or clean.")
