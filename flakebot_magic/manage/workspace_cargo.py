"""``flakebot cargo NAME ARGS...``: cargo in a tool's workspace, in the sandbox its builds run in.

A tool's workspace holds code a model wrote or a crate shipped: ``cargo test``
there runs it. So the way flakebot offers to run cargo by hand is the way it
runs cargo itself (:class:`~flakebot_magic.sandbox.cargo.Cargo`): the build profile of
the sandbox (no network, no ``$HOME``, the workspace writable but ``.git``),
after a download in the fetch profile when the registry is online (and only
once the tree policy passes the workspace). cargo runs from ``/`` with
``--manifest-path`` (so ``cargo run`` starts the program in ``/``); output
arrives as :class:`~flakebot_magic.events.LogLine` events.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable, Sequence
from typing import TextIO

from ..commands import typed
from ..config import Settings
from ..errors import ConfigError, UsageError
from ..events import Event, EventBus, LogLine, Notice, Observer
from ..host.git import Git
from ..host.names import is_tool_name
from ..host.process import CancelToken, ProcessRunner
from ..sandbox import Sandbox
from ..sandbox.cargo import MANIFEST_SUBCOMMANDS, Cargo
from ..sandbox.policy import Baseline, TreePolicy
from ..stages.fork import Workspace
from ..stages.search import open_registry
from ..untrusted import safe_text

__all__ = ["USAGE", "cargo_line", "printer", "run_cargo"]

USAGE = f"flakebot cargo NAME SUBCOMMAND [ARGS...], e.g. {typed('cargo hexer test -- --nocapture')}"


def printer(stdout: TextIO | None = None, stderr: TextIO | None = None) -> Observer:
    """An observer printing cargo's lines as they come (stdout to ``stdout``) and flakebot's notes (to
    ``stderr``), each made safe first: what a build script or a test prints is untrusted."""

    def show(event: Event) -> None:
        if isinstance(event, LogLine):
            out = (stdout or sys.stdout) if event.stream == "stdout" else (stderr or sys.stderr)
            print(safe_text(event.line), file=out, flush=True)
        elif isinstance(event, Notice):
            print(safe_text(f"flakebot: {event.message}"), file=stderr or sys.stderr, flush=True)

    return show


def run_cargo(
    settings: Settings,
    name: str,
    args: Sequence[str],
    *,
    observers: Iterable[Observer] = (),
    cancel: CancelToken | None = None,
) -> int:
    """Run ``cargo ARGS`` in the workspace of the tool ``name``, sandboxed; return cargo's exit status.

    Raises :class:`~flakebot_magic.errors.UsageError` for an unknown tool or
    subcommand, :class:`~flakebot_magic.errors.ConfigError` where there is no
    sandbox (unless ``allow_unsandboxed``), and
    :class:`~flakebot_magic.errors.PolicyError` when a download is due and the
    tree breaks the build policy.
    """
    if not name or not args or args[0].startswith("-"):
        raise UsageError(f"Usage: {USAGE}.")
    subcommand, rest = args[0], list(args[1:])
    if subcommand not in MANIFEST_SUBCOMMANDS:
        raise UsageError(
            f"`cargo {subcommand}` is not one flakebot runs in a workspace; use one of: "
            f"{', '.join(sorted(MANIFEST_SUBCOMMANDS))}."
        )
    if not is_tool_name(name):
        raise UsageError(f"{name!r} is not a tool's name ({typed('list')} shows them).")
    workspace = Workspace.load(settings.cache.workspaces / name)
    if workspace is None:
        raise UsageError(
            f"There is no workspace for a tool named {name!r} in {settings.cache.workspaces} "
            f"({typed('list')} shows the tools)."
        )
    sandbox = Sandbox(workspace.path)
    if not sandbox.isolated and not settings.allow_unsandboxed:
        raise ConfigError(
            f"Refusing to run cargo in {workspace.path} without a sandbox: {sandbox.why_not}. Its build scripts "
            "and tests would run with your files, secrets and network. Install bubblewrap (`make install`), "
            "or, accepting that risk, opt in with the `allow_unsandboxed` setting.",
            workspace=workspace.path,
        )
    bus = EventBus(observers)
    if sandbox.notice:
        bus.notice("cargo", sandbox.notice, "warning")
    runner = ProcessRunner(cancel)
    cargo = Cargo(open_registry(settings.registry, settings.cache_dir), runner, sandbox)
    policy = TreePolicy(settings.allow_build_scripts, Baseline.from_git(Git(workspace.path, runner)))

    def log(stream: str, line: str) -> None:
        bus.log("cargo", line, "stderr" if stream == "stderr" else "stdout")

    fetched = cargo.fetch(workspace.path, policy=policy, timeout=settings.build_timeout, on_line=log)
    if fetched is not None and fetched.returncode != 0:
        return 1
    done = cargo.run(
        subcommand, *rest, cwd=workspace.path, timeout=settings.build_timeout + settings.test_timeout, on_line=log
    )
    if done.returncode == -9:  # stopped by a limit: the last line says which
        bus.notice("cargo", (done.stderr.strip().splitlines() or ["stopped"])[-1], "warning")
    elif done.returncode:
        bus.notice("cargo", f"cargo exited with status {done.returncode}", "warning")
    return done.returncode if 0 <= done.returncode < 256 else 1


def cargo_line(settings: Settings, line: str) -> int:
    """``NAME ARGS...`` as one line (``%flakebot cargo``'s), quoted as a shell would; printed as it comes."""
    try:
        words = shlex.split(line) or [""]
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"Usage: {USAGE} ({exc}).") from None
    return run_cargo(settings, words[0], words[1:], observers=[printer()])
