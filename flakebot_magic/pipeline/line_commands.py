"""What the magic's line commands answer (``%flakebot list``, ``search``, ``catalog``, ...): each written once,
in :mod:`~flakebot_magic.manage.tools`, :mod:`~flakebot_magic.manage.crates` and the other management modules
(a team's push and pull in :mod:`.team`); this only dispatches.

A mistake is a :class:`~flakebot_magic.errors.UsageError`, which the magic shows as IPython's (no traceback).
"""

from __future__ import annotations

from ..commands import COMMAND_NAMES, typed
from ..config import Settings
from ..errors import UsageError
from ..manage import crates, tools, verify
from ..manage.cleanup import clean
from ..manage.doctor import doctor
from ..untrusted import safe_text
from . import team

__all__ = ["answer"]


def _say(line: str) -> None:
    print(safe_text(f"flakebot: {line}"), flush=True)  # progress, while a first search builds the index


def answer(
    settings: Settings,
    command: str,
    rest: list[str],
    *,
    everything: bool = False,
    tail: int | None = None,
    rebuild: bool | None = None,
) -> tools.Answer:
    """The answer of ``%flakebot COMMAND REST...`` (``load``, ``rebuild``, ``steer``, ``cargo``, ``help`` and
    ``dashboard`` are the magic's own: they act on the kernel)."""
    if command == "list":
        return tools.table(settings)
    if command == "search":
        if not rest:
            raise UsageError("Usage: %flakebot search QUERY")
        return crates.search_crates(settings, " ".join(rest), say=_say)
    if command == "catalog":
        return crates.catalog(settings, " ".join(rest), say=_say)
    if command == "clean":
        return clean(settings, everything=everything)
    if command == "doctor":
        return doctor(settings)
    if command == "stop" and everything and not rest:
        return tools.stop_tools(settings)
    if command in ("push", "pull"):
        return team.line_command(settings, command, rest, rebuild=bool(rebuild))
    if command not in ("show", "logs", "stop", "verify"):
        raise UsageError(f"Unknown subcommand {command!r}: use {COMMAND_NAMES}.")
    if len(rest) != 1:
        raise UsageError(f"Usage: %flakebot {command} NAME ({typed('list')} shows the names).")
    if command in ("show", "verify"):
        return (tools.show if command == "show" else verify.verify)(settings, rest[0])
    if command == "logs":
        return tools.tool_logs(settings, rest[0], last=tail or None)
    return tools.stop_tools(settings, rest[0])
