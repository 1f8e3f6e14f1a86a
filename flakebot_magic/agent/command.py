"""``flakebot mcp``: its arguments and what it runs (stdio, or Streamable HTTP with ``--http PORT``)."""

from __future__ import annotations

import argparse
import os

from ..config import Settings
from ..errors import UsageError
from ..request import RunFlags

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``mcp`` subcommand's own flags (the build options come from the options table)."""
    parser.add_argument(
        "--http",
        type=int,
        metavar="PORT",
        help="Serve Streamable HTTP on 127.0.0.1:PORT (0: any free port) instead of stdio; "
        "clients send `Authorization: Bearer TOKEN` (printed on stderr).",
    )
    parser.add_argument(
        "--token",
        help="The bearer token HTTP clients must send. Default: $FLAKEBOT_MCP_TOKEN, else a new random one.",
    )
    parser.add_argument(
        "--no-builds", action="store_true", help="Refuse build_tool: agents only call the tools already built."
    )
    parser.add_argument("--max-builds", type=int, metavar="N", help="Builds one MCP session may ask for.")
    parser.add_argument(
        "--max-tokens", type=int, metavar="N", help="Model tokens one MCP session's builds may spend together."
    )


def run(args: argparse.Namespace, settings: Settings, flags: RunFlags | None = None) -> int:
    """Serve MCP with ``settings`` (the user's defaults and the command's options) and the agent limits given;
    ``flags`` say how each agent build goes (``--candidates``, ``--plan``...)."""
    if args.no_builds:
        settings.allow_agent_builds = False
    for flag, field in (("max_builds", "agent_max_builds"), ("max_tokens", "agent_token_budget")):
        value = getattr(args, flag)
        if value is not None:
            if value < 0:
                raise UsageError(f"--{flag.replace('_', '-')} must be 0 or more, not {value}.")
            setattr(settings, field, value)
    if args.http is None:
        from .stdio import serve_stdio

        return serve_stdio(settings, flags=flags)
    from .http import serve_http

    token = args.token or os.environ.get("FLAKEBOT_MCP_TOKEN") or None
    return serve_http(settings, port=args.http, token=token, flags=flags)
