"""The ``flakebot`` command: build, rebuild, search, list, show, steer, cargo, clean, doctor, export, eval.

``--json`` everywhere, for scripts and agents.

Every command but ``clean`` and ``doctor`` (which do it their own way) starts
with :func:`~flakebot_magic.manage.doctor.prepare`: what an interrupted build left is
finished or undone, a tool inventory that cannot be trusted is rebuilt, and what
was done is said on stderr.

What it prints to a terminal goes through :func:`_say` (text made safe by
:mod:`flakebot_magic.untrusted`) or :func:`_say_json` (every string in the
data made safe, then JSON); progress through
:class:`~flakebot_magic.views.progress.TextProgress`, which does the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .agent import command as agent_command
from .commands import ALL, IF_UNTRUSTED, IF_UNTRUSTED_HELP, TAIL, advise
from .config import Settings, add_arguments, apply
from .errors import FlakebotError, UsageError
from .eval import command as eval_command
from .events import outcome_of
from .options import OPTIONS
from .untrusted import safe_data, safe_text

if TYPE_CHECKING:
    from .manage.tools import Answer
    from .request import RunFlags

__all__ = ["main"]

#: what ``flakebot list`` says when there is no tool yet
NO_TOOLS = "No tools yet. Build one with `flakebot build REQUEST`."


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flakebot",
        description="Turn a request into a compiled, tested Rust tool from a published crate.",
    )
    common = argparse.ArgumentParser(add_help=False)
    # --registry is a build option (from the options table) every subcommand takes
    add_arguments(common, skip=[o.name for o in OPTIONS if o.name != "registry"])
    common.add_argument(
        "--cache-dir",
        help="Where workspaces, the store and the search index live. "
        "Default: $FLAKEBOT_CACHE_DIR, else the user cache dir.",
    )
    common.add_argument(
        "--json", action="store_true", help="Print JSON on stdout (progress and notes still go to stderr)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_build_commands(sub, common)
    _add_tool_commands(sub, common)
    _add_team_commands(sub, common)
    mcp = sub.add_parser(
        "mcp",
        parents=[common],
        help="Serve flakebot to MCP clients (stdio, or --http PORT): build_tool and every built tool.",
    )
    add_arguments(mcp, skip=("registry",))  # agent builds take the build options too
    agent_command.add_arguments(mcp)

    evaluate = sub.add_parser(
        "eval",
        help="Measure how often a model makes a working tool: a suite of tasks with hidden tests, models side by side.",
    )
    eval_command.add_arguments(evaluate)
    return parser


def _add_build_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """build, and what finds what to build: search, catalog, index."""
    build = sub.add_parser("build", parents=[common], help="Build a tool for a request.")
    build.add_argument("request", nargs="?", default="", help="What the tool should do, in words.")
    build.add_argument("--name", "-n", help="The tool's name. Default: from the crate.")
    build.add_argument("--crate", "-c", help="Use this crate instead of searching.")
    build.add_argument("--verbose", "-v", action="store_true", help="Print cargo's output as it comes.")
    build.add_argument("--quiet", "-q", action="store_true", help="Print no progress on stderr.")
    add_arguments(build, skip=("registry",))  # --registry is common to every subcommand

    search = sub.add_parser("search", parents=[common], help="Rank crates for a query.")
    search.add_argument("query", help="What you are looking for, in words.")
    search.add_argument("--limit", "-l", type=int, default=10, help="How many candidates to show. Default: 10.")

    catalog = sub.add_parser(
        "catalog", parents=[common], help="What builds a tool with no model: crates whose own binary is one."
    )
    catalog.add_argument("words", nargs="*", help="Only those the search finds for these words.")
    index = sub.add_parser(
        "index", parents=[common], help="Build the registry's search index now (make install runs it)."
    )
    index.add_argument("--system", action="store_true", help="Into the machine's place, read by every user (as root).")


def _add_tool_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The built tools by name: list, rebuild, show, logs, steer, cargo, stop, doctor, clean, export."""
    sub.add_parser("list", parents=[common], help="List the tools built on this machine.")
    rebuild = sub.add_parser(
        "rebuild",
        parents=[common],
        help="Fork and build a tool again from its crate, for its recorded request (its cache entry is not used).",
    )
    rebuild.add_argument("name", help="The tool's name (`flakebot list` shows them).")
    rebuild.add_argument("--quiet", "-q", action="store_true", help="Print no progress on stderr.")
    rebuild.add_argument("--verbose", "-v", action="store_true", help="Print cargo's output as it comes.")

    show = sub.add_parser(
        "show", parents=[common], help="Show a tool's provenance (crate, checksum, commit, store path)."
    )
    show.add_argument("name", help="The tool's name (`flakebot list` shows them).")
    logs = sub.add_parser("logs", parents=[common], help="Show a tool's build log (and its process output).")
    logs.add_argument("name", help="The tool's name.")
    TAIL.add_to(logs, "logs")
    steer = sub.add_parser(
        "steer",
        parents=[common],
        help="Send a message to a tool's running edit session: the model reads it in its next request.",
    )
    steer.add_argument("name", help="The tool being built (its --name).")
    steer.add_argument(
        "text", nargs="+", help="The message, e.g. 'also accept --upper' (quote it; words are joined by spaces)."
    )
    cargo = sub.add_parser(
        "cargo",
        parents=[common],
        help="Run cargo in a tool's workspace, in the sandbox its builds run in (e.g. `flakebot cargo NAME test`).",
    )
    cargo.add_argument("name", help="The tool whose workspace cargo works on.")
    cargo.add_argument("args", nargs=argparse.REMAINDER, help="cargo's subcommand and its arguments.")
    stop = sub.add_parser("stop", parents=[common], help="Stop a tool's process (http and mcp tools).")
    stop.add_argument("name", nargs="?", help="The tool's name.")
    ALL.add_to(stop, "stop")

    sub.add_parser(
        "doctor",
        parents=[common],
        help="Check the tool inventory and the tools on disk; rebuild the inventory from disk when it is damaged.",
    )
    clean_ = sub.add_parser(
        "clean",
        parents=[common],
        help="Remove unused store entries and workspaces (it stops short when the tool inventory cannot be trusted).",
    )
    ALL.add_to(clean_, "clean")

    export = sub.add_parser("export", parents=[common], help="Write a project that builds a tool elsewhere.")
    export.add_argument(
        "--replit",
        metavar="DIR",
        required=True,
        help="Write DIR/.replit and DIR/replit.nix (and the flake in DIR/NAME) for Replit.",
    )
    export.add_argument("name", help="The tool's name (`flakebot list` shows them).")


def _add_team_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """A team's binary cache: push, pull, verify."""
    team = ("registry", "nix_store", "nix_substituters", "nix_trusted_public_keys")
    push = sub.add_parser(
        "push",
        parents=[common],
        help="Copy a nix-built tool and its proof to the team's binary cache, signed.",
    )
    push.add_argument("name", help="The tool's name (`flakebot list` shows them).")
    push.add_argument("--to", help="The cache: any URL `nix copy --to` takes. Default: the push_to setting.")
    add_arguments(push, skip=[o.name for o in OPTIONS if o.name not in (*team, "nix_secret_key")] + ["registry"])
    pull = sub.add_parser(
        "pull",
        parents=[common],
        help="Fetch the exact tool a notebook recorded from the team's cache (signature and hash checked).",
    )
    pull.add_argument("name", help="The tool's name in the notebook.")
    pull.add_argument("--from", dest="notebook", required=True, metavar="NOTEBOOK", help="The .ipynb that recorded it.")
    pull.add_argument(
        "--if-untrusted",
        choices=IF_UNTRUSTED,
        default="stop",
        help=f"{IF_UNTRUSTED_HELP[0].upper()}{IF_UNTRUSTED_HELP[1:]}. Default: stop.",
    )
    add_arguments(pull, skip=[o.name for o in OPTIONS if o.name not in team] + ["registry"])

    verify = sub.add_parser(
        "verify",
        parents=[common],
        help="Rebuild a nix-built tool and say whether it is bit-identical to what was deployed or pulled "
        "(the answer goes in its provenance: `flakebot show NAME`).",
    )
    verify.add_argument("name", help="The tool's name (`flakebot list` shows them).")
    add_arguments(verify, skip=[o.name for o in OPTIONS if o.name not in team] + ["registry"])


def _settings(args: argparse.Namespace) -> Settings:
    """The command's options over the defaults (the environment's, then the table's); run flags aside."""
    given = {o.name: getattr(args, o.name, None) for o in OPTIONS if o.per_build and not o.run_flag}
    return apply(Settings(), {**given, "cache_dir": args.cache_dir})


def _agent_flags(args: argparse.Namespace) -> RunFlags:
    """``flakebot mcp``'s run flags, for every agent build (``--continue`` is not one: an agent's builds are its own)."""
    from .request import RunFlags

    return RunFlags.given({k: v for k, v in _run_flags(args).items() if k != "follow_up"})


def _run_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The command's run flags (``--rebuild``, ``--candidates``...): the request's
    (:meth:`~flakebot_magic.request.BuildRequest.with_options`)."""
    return {o.name: getattr(args, o.name, None) for o in OPTIONS if o.per_build and o.run_flag}


#: a command whose output was closed (``flakebot list | head``) ends as a shell's SIGPIPE-killed command does
EXIT_PIPE_CLOSED = 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    advise("shell")  # this process's advice is read in a shell
    try:
        return _main(argv)
    finally:
        advise("")  # an in-process caller (a test, a script) gets both forms back


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except BrokenPipeError:
        return _pipe_closed()
    except FlakebotError as exc:
        try:
            return _report(args, exc)
        except BrokenPipeError:
            return _pipe_closed()
    except KeyboardInterrupt:
        _say("flakebot: interrupted", sys.stderr)
        return 130


def _pipe_closed() -> int:
    """Whoever read our output went away: end quietly (nothing more is written to the closed pipe, not even at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no real file (a test's capture): nothing will flush into a pipe
        pass
    return EXIT_PIPE_CLOSED


def _report(args: argparse.Namespace, exc: FlakebotError) -> int:
    """``exc`` said on stderr (and as JSON on stdout with ``--json``); the exit status."""
    if getattr(args, "json", False):
        _say_json(
            {
                "error": type(exc).__name__,
                "message": str(exc),
                "workspace": str(exc.workspace) if exc.workspace else None,
            },
            indent=None,
        )
    outcome = outcome_of(exc)
    # a cancel is no error, and neither is the search's answer that no crate fits (it says so itself)
    said = {"cancelled": "cancelled: ", "unfit": ""}.get(outcome, "error: ")
    _say(f"flakebot: {said}{exc}", sys.stderr)
    return 130 if outcome == "cancelled" else 1


def _say(text: str, stream: TextIO | None = None) -> None:
    """Print ``text`` for a person: a crate, a tool or a build may have written part of it."""
    print(safe_text(text), file=stream or sys.stdout)


def _say_json(data: object, *, indent: int | None = 2) -> None:
    """Print ``data`` as JSON on stdout, every string in it made safe to show."""
    print(json.dumps(safe_data(data), indent=indent))


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "eval":  # its attempts each build in a cache of their own, under --out
        return eval_command.run(args)
    settings = _settings(args)
    if args.command not in ("build", "clean", "doctor"):  # a build prepares in the pipeline
        from .manage.doctor import prepare

        for note in prepare(settings):
            _say(f"flakebot: {note}", sys.stderr)
    if args.command == "mcp":
        return agent_command.run(args, settings, _agent_flags(args))
    # the pipeline and the tool clients are imported by the subcommands that use them:
    # `flakebot --help` and a warm `flakebot build` start quickly
    if args.command in ("build", "rebuild"):
        from .manage import tools
        from .pipeline.background import start_build
        from .request import BuildRequest, PersonText, UntrustedText
        from .views.progress import TextProgress

        if args.command == "rebuild":  # as `%flakebot rebuild NAME`: the recorded request, the cache not used
            from .host.storage import storage_errors

            with storage_errors("flakebot rebuild", settings.cache_dir):
                record = tools.find(settings, args.name)
            # a recorded request (the cache's, maybe an agent's): its ">>>" lines are words, never examples
            request = BuildRequest(UntrustedText(record.request), name=record.name, crate=record.crate)
            request = request.with_options({**_run_flags(args), "rebuild": True})
        else:
            words = PersonText(args.request)  # the person's command line: its ">>>" examples are checks
            request = BuildRequest(words, name=args.name, crate=args.crate).with_options(_run_flags(args))
        observers = [] if args.quiet else [TextProgress(sys.stderr, verbose=args.verbose)]
        # on a background thread, so Ctrl-C cancels cleanly (cargo's process group killed, workspace kept)
        tool = start_build(settings, request).wait(observers)
        if args.json:
            _say_json(tools.tool_json(tool, settings))
        else:
            _say(tool.usage())
        from .stages.deps import filling

        if filling() and not args.quiet:  # the process stays until they are sealed (Ctrl-C stops it: nothing lost)
            sys.stderr.write("flakebot: sealing this tool's dependencies for later tools, in the background ...\n")
        return 0
    from .host.storage import storage_errors

    with storage_errors(f"flakebot {args.command}", settings.cache_dir):
        if args.command == "cargo":
            from .manage.workspace_cargo import printer, run_cargo

            return run_cargo(settings, args.name, args.args, observers=[printer()])
        answer = _answer(args, settings)
    # printed outside storage_errors: a closed stdout is the reader gone, not the cache's disk failing
    _print(answer, as_json=args.json)
    return 1 if getattr(answer, "failed", False) else 0  # a clean that stopped short, a doctor with problems left


def _answer(args: argparse.Namespace, settings: Settings) -> Answer:
    """What a management command answers (each is written once, in :mod:`flakebot_magic.manage.tools`)."""
    from .manage import tools

    if args.command in ("search", "catalog", "index"):
        from .manage import crates

        def say(line: str) -> None:
            _say(f"flakebot: {line}", sys.stderr)

        if args.command == "catalog":
            return crates.catalog(settings, " ".join(args.words), say=say)
        if args.command == "index":
            return crates.build_index(settings, system=args.system, say=say)
        return crates.search_crates(settings, args.query, limit=args.limit, say=say)
    if args.command == "list":
        return tools.table(settings, empty=NO_TOOLS)
    if args.command == "show":
        return tools.show(settings, args.name)
    if args.command == "logs":
        return tools.tool_logs(settings, args.name, last=args.tail or None)
    if args.command == "steer":
        return tools.steer(settings, args.name, " ".join(args.text), source="cli")
    if args.command == "stop":
        if not args.name and not args.all:
            raise UsageError("flakebot stop NAME, or flakebot stop --all")
        return tools.stop_tools(settings, args.name or None)
    if args.command == "clean":
        from .manage.cleanup import clean

        return clean(settings, everything=args.all)
    if args.command == "doctor":
        from .manage.doctor import doctor

        return doctor(settings)
    if args.command == "push":
        from .pipeline.team import push

        return push(settings, args.name, to=args.to, secret_key=args.nix_secret_key)
    if args.command == "pull":
        from .pipeline.team import notebook_provenance, pull

        provenance = notebook_provenance(Path(args.notebook), args.name)
        return pull(settings, args.name, provenance, if_untrusted=args.if_untrusted)
    if args.command == "verify":
        from .manage.verify import verify

        return verify(settings, args.name)
    if args.command == "export":
        from .manage.export import export_replit

        return export_replit(settings, args.name, Path(args.replit))
    raise AssertionError(args.command)


def _print(answer: Answer, *, as_json: bool) -> None:
    """Notes on stderr; on stdout the answer's JSON with ``--json``, else its text."""
    for note in answer.notes:
        _say(note, sys.stderr)
    if as_json:
        _say_json(answer.data)
    elif answer.text:
        _say(answer.text)


if __name__ == "__main__":
    raise SystemExit(main())
