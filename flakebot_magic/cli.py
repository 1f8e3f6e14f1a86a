"""The ``flakebot`` command: build, search, list, clean, export; ``--json`` for scripts and agents."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import Cancelled, FlakebotError, UsageError
from .options import OPTIONS, add_arguments, apply

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flakebot",
        description="Turn a request into a compiled, tested Rust tool from a published crate.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--registry", "-r", help="a cargo directory source, or 'crates.io' (default: Debian's registry when installed)")
    common.add_argument("--cache-dir", help="where workspaces, the store and the index live (default: the user cache dir)")
    common.add_argument("--json", action="store_true", help="print JSON on stdout (progress still goes to stderr)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = sub.add_parser("build", parents=[common], help="build a tool for a request")
    build.add_argument("request", nargs="?", default="", help="what the tool should do, in words")
    build.add_argument("--name", "-n", help="the tool's name (default: from the crate)")
    build.add_argument("--crate", "-c", help="use this crate instead of searching")
    build.add_argument("--verbose", "-v", action="store_true", help="print cargo's output as it comes")
    build.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    add_arguments(build, skip=("registry",))  # --registry is common to every subcommand

    search = sub.add_parser("search", parents=[common], help="rank crates for a query")
    search.add_argument("query", help="what you are looking for")
    search.add_argument("--limit", "-l", type=int, default=10, help="how many candidates (default 10)")

    sub.add_parser("list", parents=[common], help="the tools built on this machine")

    show = sub.add_parser("show", parents=[common], help="a tool's provenance (crate, checksum, commit, store path)")
    show.add_argument("name", help="the tool's name (`flakebot list` shows them)")
    logs = sub.add_parser("logs", parents=[common], help="a tool's build log (and its process output)")
    logs.add_argument("name", help="the tool's name")
    logs.add_argument("--tail", type=int, default=200, help="how many of the last lines (0: all; default 200)")
    stop = sub.add_parser("stop", parents=[common], help="stop a tool's process (http and mcp tools)")
    stop.add_argument("name", nargs="?", help="the tool's name")
    stop.add_argument("--all", action="store_true", help="stop every running tool")

    clean = sub.add_parser("clean", parents=[common], help="remove unused store entries and workspaces")
    clean.add_argument("--all", action="store_true", help="remove every tool, workspace, store entry and index")

    export = sub.add_parser("export", parents=[common], help="write a project that builds a tool elsewhere")
    export.add_argument("--replit", metavar="DIR", required=True,
                        help="write DIR/.replit and DIR/replit.nix (and the flake in DIR/NAME) for Replit")
    export.add_argument("name", help="the tool's name (`flakebot list` shows them)")
    return parser


def _settings(args: argparse.Namespace) -> Any:
    from .config import Settings

    settings = Settings(registry=args.registry)
    if args.cache_dir:
        settings.cache_dir = Path(args.cache_dir)
    return settings


def _tool_json(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "crate": tool.crate,
        "version": tool.version,
        "binary": str(tool.binary),
        "store_path": str(tool.store_path),
        "source_hash": tool.source_hash,
        "checksum": tool.checksum,
        "backend": tool.backend,
        "lock_hash": getattr(tool, "lock_hash", ""),
        "reads_stdin": tool.reads_stdin,
        "example": tool.example(),
        "usage": tool.usage(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except FlakebotError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": type(exc).__name__, "message": str(exc),
                              "workspace": str(exc.workspace) if exc.workspace else None}))
        print(f"flakebot: error: {exc}", file=sys.stderr)
        return 130 if isinstance(exc, Cancelled) else 1
    except KeyboardInterrupt:
        print("flakebot: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if args.command == "build":
        from .background import start_build
        from .progress import TextProgress

        apply(settings, {o.name: getattr(args, o.name, None) for o in OPTIONS if o.per_build})
        observers = [] if args.quiet else [TextProgress(sys.stderr, verbose=args.verbose)]
        # on a background thread, so Ctrl-C cancels cleanly (cargo's process group killed, workspace kept)
        tool = start_build(settings, args.request, name=args.name, crate=args.crate).wait(observers)
        if args.json:
            print(json.dumps(_tool_json(tool), indent=2))
        else:
            print(tool.usage())
        return 0
    if args.command == "search":
        from .stages import search as search_stage

        registry = search_stage.open_registry(settings.registry, settings.cache_dir)
        found = search_stage.search(registry, args.query, limit=args.limit)
        if args.json:
            print(json.dumps([c.to_json() for c in found], indent=2))
        elif not found:
            print(f"No crate matches {args.query!r}.", file=sys.stderr)
        else:
            width = max(len(f"{c.name} {c.version}") for c in found)
            for c in found:
                label = f"{c.name} {c.version}"
                print(f"{c.score:8.2f}  {label:<{width}}  {'bin' if c.has_bin else 'lib'}  {c.description[:50]:<50}"
                      f"  ({search_stage.why(c)})")
        return 0
    if args.command == "list":
        from .inventory import Inventory
        from .tools import ToolTable

        records = Inventory(settings.tools_dir).all()
        if args.json:
            print(json.dumps([r.public_json() for r in records], indent=2))
        elif not records:
            print("No tools yet. Build one with `flakebot build REQUEST`.")
        else:
            print(repr(ToolTable(records)))
        return 0
    if args.command in ("show", "logs", "stop"):
        from . import tools

        if args.command == "show":
            data = tools.describe(settings, args.name)
            print(json.dumps(data, indent=2) if args.json else tools.show_text(settings, args.name))
        elif args.command == "logs":
            print(tools.logs(settings, args.name, last=args.tail or None))
        elif args.all and not args.name:
            print("\n".join(tools.stop_all(settings)) or "No tool is running.")
        elif args.name:
            print(tools.stop(settings, args.name))
        else:
            raise UsageError("flakebot stop NAME, or flakebot stop --all")
        return 0
    if args.command == "clean":
        from .cleanup import clean

        if args.all:  # the registry goes too: stop the tools whose processes it records first
            from .tools import stop_all

            for line in stop_all(settings):
                print(line, file=sys.stderr)
        report = clean(settings, everything=args.all)
        if args.json:
            print(json.dumps({"removed": [str(p) for p in report.removed], "freed_bytes": report.freed}))
        else:
            print("\n".join(report.summary()))
        return 0
    if args.command == "export":
        from .export import export_replit

        exported = export_replit(settings, args.name, Path(args.replit))
        if args.json:
            print(json.dumps({"directory": str(exported.directory), "source": str(exported.source),
                              "replit_nix": str(exported.replit_nix), "dot_replit": str(exported.dot_replit)}))
        else:
            print("\n".join(exported.summary()))
        return 0
    raise AssertionError(args.command)


if __name__ == "__main__":
    raise SystemExit(main())
