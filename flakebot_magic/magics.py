"""The ``%%flakebot`` cell magic and ``%flakebot`` line magic: IPython's side of the package.

Only this module and :mod:`flakebot_magic.commands` (whose decorators it calls) and :mod:`flakebot_magic.magic_cells` import
IPython. What it prints may quote a crate, a build or a tool: every print goes through
:func:`flakebot_magic.untrusted.safe_text` (a notebook's output and IPython in a terminal obey escape
sequences), and errors are :class:`~flakebot_magic.errors.FlakebotError` s, whose messages are safe.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, kwds, magic_arguments, parse_argstring
from traitlets import Bool, Enum, Unicode

from . import errors
from .clients.base import ToolClient
from .commands import (
    ALL,
    LINE_COMMANDS,
    LINE_USAGE,
    TAIL,
    explain_usage,
    what_next,
)
from .config import Settings, apply, config_traits, magic_argument_decorators
from .events import Observer
from .host.names import check_tool_name
from .host.storage import storage_errors
from .magic_cells import install_transformer, spare_examples
from .manage import tools
from .manage.doctor import prepare
from .manage.workspace_cargo import cargo_line
from .options import OPTIONS
from .pipeline import line_commands, team
from .pipeline.background import BackgroundRun, start_build
from .request import BuildRequest, PersonText, RequestText, UntrustedText
from .server.saved import live_mark
from .untrusted import safe_text
from .views import hooks, interrupted
from .views.dashboard_link import dashboard_link
from .views.progress import TextProgress

__all__ = ["FlakebotMagics"]


@dataclass(frozen=True)
class MagicLine:
    """The ``%%flakebot`` / ``%flakebot`` line's arguments, typed: what IPython's parser made of the line."""

    #: the line command and its words (``["logs", "md"]``); empty on a cell's line
    command: list[str]
    name: str | None
    crate: str | None
    verbose: bool
    #: ``--all`` (load, stop, clean)
    everything: bool
    #: ``--tail N`` (logs)
    tail: int
    #: the build options by name, None where the line does not give one (the options table's types: mixed)
    options: dict[str, Any]

    @classmethod
    def of(cls, parsed: argparse.Namespace) -> MagicLine:
        return cls(
            command=list(parsed.command),
            name=parsed.name,
            crate=parsed.crate,
            verbose=bool(parsed.verbose),
            everything=bool(getattr(parsed, ALL.dest)),
            tail=int(getattr(parsed, TAIL.dest)),
            options={o.name: getattr(parsed, o.name, None) for o in OPTIONS if o.per_build},
        )


@dataclass
class _Build:
    """One build in progress in this kernel: its background run and how it is shown."""

    run: BackgroundRun[ToolClient] | None
    settings: Settings
    observers: list[Observer] = field(default_factory=list)
    tick: Callable[[], None] | None = None
    widget: Any = None
    handle: Any = None

    def refresh(self) -> None:
        """The build is over: its display becomes the record (static HTML and text), and the widget goes.

        A widget in a saved notebook needs the kernel that made it: after a
        restart, or reopened elsewhere, it is "model not found". The record
        needs nothing (see :mod:`flakebot_magic.views.record`).
        """
        interrupted.untrack(self)
        if self.handle is not None and self.widget is not None:
            self.handle.update(self.widget.record().bundle(), raw=True)
            self.widget.close()


#: the build options' config traits (``%config FlakebotMagics.model = ...``), made from the options table
if TYPE_CHECKING:
    _OptionTraits = Magics
else:
    _OptionTraits = type("_OptionTraits", (Magics,), {"__doc__": "The build options as traits.", **config_traits()})


def _with_build_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for decorate in reversed(magic_argument_decorators()):
        # a value among choices reads as its name (BACKEND), not IPython's `<{auto,nix,cargo}>`
        if decorate.kwds.get("choices") and not decorate.kwds.get("metavar"):
            decorate.kwds["metavar"] = decorate.args[0].lstrip("-").replace("-", "_").upper()
        func = decorate(func)
    return func


#: the help's first lines, the cell form then the line form (argparse shows ``%%`` as ``%``; IPython adds a ``%``)
_USAGE = f"""%%flakebot [--name NAME] [--crate CRATE] [build options]
  what the tool should do, in words (the cell's body)

  %%flakebot {LINE_USAGE}"""


_F = TypeVar("_F", bound=Callable[..., Any])


def _with_line_commands(func: _F) -> _F:
    """``func``'s docstring, its line-mode section made from :data:`LINE_COMMANDS`."""
    table = "\n".join(f"            %flakebot {usage:<18}{what}" for usage, what in LINE_COMMANDS)
    func.__doc__ = (func.__doc__ or "").replace("{line_commands}", table.lstrip())
    return func


@magics_class
class FlakebotMagics(_OptionTraits):
    """Build Rust tools from a request and call them from Python."""

    cache_dir = Unicode(None, allow_none=True, help="Where workspaces, the store and the search index live.").tag(
        config=True
    )
    verbose = Bool(False, help="Print cargo's output as it comes.").tag(config=True)
    progress = Enum(
        ["auto", "widget", "text", "none"],
        "auto",
        help="How a build shows its progress: 'widget' (live ipywidgets, with a Cancel button), "
        "'text' (printed lines), 'none', or 'auto': the widget in a Jupyter kernel, text elsewhere "
        "(terminal IPython). The widget's display also carries the final text, for nbconvert.",
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        if shell is not None:
            spare_examples(shell)
        if shell is not None and getattr(shell, "kernel", None) is not None:
            install_transformer(shell)

    def _settings(self, given: MagicLine) -> Settings:
        """The line's options over this kernel's settings (config traits) over the defaults; run flags aside
        (:meth:`_request`)."""
        try:
            settings = Settings()
            apply(settings, {"cache_dir": self.cache_dir})
            apply(settings, {o.name: getattr(self, o.name) for o in OPTIONS if o.config and not o.run_flag})
            apply(settings, {o.name: given.options.get(o.name) for o in OPTIONS if o.per_build and not o.run_flag})
            settings.private_cache_dir()  # a cache dir that is a file: said here, not a traceback later
        except (errors.UsageError, errors.ConfigError) as exc:
            raise UsageError(str(exc)) from None
        return settings

    def _request(
        self, given: MagicLine, text: RequestText, *, name: str | None, crate: str | None, **flags: Any
    ) -> BuildRequest:
        """The request; how its run goes: ``flags`` over the line's run flags over this kernel's over the defaults."""
        kernel = {o.name: getattr(self, o.name) for o in OPTIONS if o.config and o.run_flag}
        line = {o.name: given.options.get(o.name) for o in OPTIONS if o.per_build and o.run_flag}
        try:
            if name:  # said before anything is shown: no empty output above the error
                check_tool_name(name, what="--name")
            request = BuildRequest(text, name=name, crate=crate)  # a cell's text is PersonText, a record's not
            return request.with_options(kernel).with_options(line).with_options(flags)
        except errors.UsageError as exc:
            raise UsageError(str(exc)) from None

    @magic_arguments()
    @kwds(usage=_USAGE)
    @argument_group("the tool")
    @argument("--name", "-n", help="Name of the tool in the kernel (a Python identifier). Default: from the crate.")
    @argument("--crate", "-c", help="Use this crate instead of searching.")
    @argument_group("build options (also `%config FlakebotMagics.OPTION`, except --rebuild and --continue)")
    @argument("--verbose", "-v", action="store_true", help="Print cargo's output as it comes.")
    @_with_build_options
    @argument_group("line mode (%flakebot COMMAND)")
    @argument(
        "command",
        nargs="*",
        metavar="COMMAND",
        help=", ".join(f"`{usage}`" for usage, _ in LINE_COMMANDS) + ".",
    )
    @ALL.magic_argument()
    @TAIL.magic_argument()
    @line_cell_magic
    @_with_line_commands
    def flakebot(self, line: str, cell: str | None = None) -> ToolClient | None:
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

        With the nix backend (--backend nix, or auto when nix is installed)
        the flake is the deployment: it is locked and committed, `nix build`
        replaces `cargo build --release` (cargo test still runs beside it),
        and the tool is the /nix/store path, kept by a GC root in the cache.

        With a model (--model NAME with --provider or --base-url, or
        `%config FlakebotMagics.model = 'NAME'`), the best crate may be a
        library: the edit loop lets the model write the tool, and cargo build
        and cargo test prove every step in a sandbox until they pass.
        `%%flakebot --name N --continue` applies new instructions to the tool
        N, with its workspace and history, and redeploys it::

            %%flakebot --name sha --continue
            Also accept a --upper flag.


        While it builds, a progress widget shows each stage, the tests passing
        and cargo's log; its Cancel button (or interrupting the kernel) stops
        cargo and keeps the workspace. The result's output metadata carries
        the tool's provenance (crate, checksum, commit, store path, backend).
        Re-run from a saved notebook on a machine without the tool, with the
        team's cache set (--substituters, --trusted-public-keys), the cell
        pulls the exact nix tool the notebook pinned instead of building.

        Line mode manages tools::

            {line_commands}
        """
        if cell is None and line.split(None, 1)[:1] in (["steer"], ["cargo"]):  # the rest as written, not parsed
            return (self._steer if line.split()[0] == "steer" else self._cargo)(line)  # a text; cargo's options
        given = self._parse(line)
        if cell is None:
            return self._line(given)
        request = self._check_cell(given, cell)
        pinned = self._pull_pinned(given, request)
        if pinned is not None:
            return pinned
        build = self._start(given, self._request(given, PersonText(request), name=given.name, crate=given.crate))
        return self._finish(build, self._wait(build))

    async def run_cell_async(self, line: str, cell: str) -> ToolClient | None:
        """``%%flakebot`` in a Jupyter kernel: the same, awaited on the kernel's event loop.

        The kernel keeps handling messages while the build runs, so the
        widget's Cancel button works; a kernel interrupt cancels the build.
        (IPython runs a cell that awaits on its own loop; see :func:`~flakebot_magic.magic_cells.install_transformer`.)
        """
        assert self.shell is not None
        given = self._parse(self.shell.var_expand(line, 1))
        request = self._check_cell(given, cell)
        pinned = self._pull_pinned(given, request)
        if pinned is not None:
            return pinned
        build = self._start(given, self._request(given, PersonText(request), name=given.name, crate=given.crate))
        return self._finish(build, await self._wait_async(build))

    async def run_line_async(self, line: str) -> ToolClient | None:
        """``%flakebot rebuild NAME`` in a Jupyter kernel, awaited like a cell."""
        assert self.shell is not None
        given = self._parse(self.shell.var_expand(line, 1))
        build = self._start_rebuild(given)
        return self._finish(build, await self._wait_async(build))

    def _parse(self, line: str) -> MagicLine:
        """The line's arguments; a mistake says what to do: the nearest option, and where the options are."""
        try:
            parsed = parse_argstring(self.flakebot, line)
        except (UsageError, ValueError) as exc:  # ValueError: shlex's unclosed quote
            raise UsageError(explain_usage(str(exc), self.flakebot.parser)) from None
        return MagicLine.of(parsed)

    def _check_cell(self, given: MagicLine, cell: str) -> str:
        if given.command:
            raise UsageError(
                f"Unexpected words after %%flakebot: {' '.join(given.command)!r}. "
                "Options go on the %%flakebot line (see %%flakebot?), the request in the cell body."
            )
        if not cell.strip() and not given.crate and not given.options.get("resume"):
            raise UsageError(
                "The cell is empty. Write what the tool should do under the %%flakebot line, e.g.\n"
                "    %%flakebot --name md\n    Render Markdown text to HTML."
            )
        return cell

    def _pull_pinned(self, given: MagicLine, request: str) -> ToolClient | None:
        """A re-run cell of a saved notebook: the tool it pinned, pulled (:func:`~flakebot_magic.pipeline.team.
        pull_for_cell`); None: the cell builds, as it always did."""
        assert self.shell is not None
        if any(given.options.get(flag) for flag in ("rebuild", "follow_up", "resume")):
            return None
        notebook = self.shell.user_ns.get("__session__")
        tool, lines = team.pull_for_cell(self._settings(given), notebook, given.name, request, given.crate)
        for line in lines:
            print(safe_text(f"flakebot: {line}"))
        if tool is not None:
            self.shell.push({tool.name: tool})
        return tool

    # -- running a build ------------------------------------------------------

    def _progress_mode(self) -> str:
        if self.progress != "auto":
            return str(self.progress)
        if getattr(self.shell, "kernel", None) is None:
            return "text"  # terminal IPython, a plain InteractiveShell: nothing renders widgets
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            return "text"
        return "widget"

    def _start(self, given: MagicLine, request: BuildRequest, settings: Settings | None = None) -> _Build:
        settings = settings or self._settings(given)
        build = self.show_build(
            request.text,
            settings,
            lambda: build.run.cancel("cancelled from the widget") if build.run is not None else None,
            verbose=bool(given.verbose or self.verbose),
            steer_name=request.name,
            crate=request.crate,
            since=hooks.previous_commit(settings, request),
        )
        build.run = start_build(settings, request)
        return build

    def show_build(
        self,
        title: str,
        settings: Settings,
        cancel: Callable[[], None],
        *,
        verbose: bool | None = None,
        show_error: bool = False,
        steer_name: str | None = None,
        crate: str | None = None,
        since: str = "",
    ) -> _Build:
        """Show a build in this kernel the way ``%%flakebot`` shows its own (also for an agent's, from ``call``).

        The ``progress`` trait says how: the widget (its Cancel button calls
        ``cancel``), printed lines, or nothing. Pass the result's ``observers``
        and ``tick`` to the run's ``wait``; its ``refresh()`` then puts the
        final text in the display. ``show_error``: the widget shows why a
        build failed (for an agent's build, whose error goes to the model; a
        ``%%flakebot`` cell raises its error, which IPython shows).
        ``steer_name``: the tool's name, when known before the build starts;
        the widget's steer box then sends to its edit session
        (:func:`flakebot_magic.manage.tools.steer`), and the title names it.
        ``crate``: the title's subject when the request has no words.
        ``since``: a follow-up's starting commit (the tool's previous
        version); its changes since then are shown beside those against the
        published crate.
        """
        build = _Build(run=None, settings=settings)
        verbose = self.verbose if verbose is None else verbose
        mode = self._progress_mode()
        if mode == "widget":
            from IPython.display import display

            from .views.widget import ProgressWidget

            widget = ProgressWidget(
                title,
                name=steer_name,
                crate=crate,
                on_cancel=cancel,
                diff=lambda tool: tools.diffs_of(settings, tool, since=since),
                show_error=show_error,
                on_steer=hooks.steer_to(settings, steer_name) if steer_name else None,
            )
            if verbose:
                widget.log.selected_index = 0
            build.widget, build.tick = widget, widget.tick
            build.observers.append(widget)
            build.handle = display(widget.mimebundle(), raw=True, display_id=True, metadata=live_mark())
            interrupted.track(build, lambda: interrupted.why_stopped(self.shell))  # a restart ends it as a record
        elif mode == "text":
            build.observers.append(TextProgress(sys.stdout, verbose=verbose))
        return build

    def _wait(self, build: _Build) -> ToolClient | None:
        assert build.run is not None, "a build shown is started before it is waited for"
        with self._shown(build):
            return build.run.wait(build.observers, tick=build.tick)
        return None  # no crate fits: the record (or the printed answer) says so

    async def _wait_async(self, build: _Build) -> ToolClient | None:
        assert build.run is not None, "a build shown is started before it is waited for"
        with self._shown(build):
            return await build.run.wait_async(build.observers, tick=build.tick)
        return None

    @contextmanager
    def _shown(self, build: _Build) -> Iterator[None]:
        """A build's end as the cell shows it: its record; a usage error or a cancel raised as IPython's; "no crate
        fits" (``NeedsModelError``) is the search's answer, not an error: the record says it, amber, no error box."""
        try:
            yield
        except errors.UsageError as exc:
            raise UsageError(str(exc)) from None
        except errors.Cancelled as exc:
            raise what_next(exc) from None
        except errors.NeedsModelError as exc:
            if build.widget is None:
                print(safe_text(str(exc)))
            else:
                build.widget.show_error = True
        finally:
            build.refresh()

    def _finish(self, build: _Build, tool: ToolClient | None) -> ToolClient | None:
        assert self.shell is not None
        if tool is None:  # no crate fits: answered in the cell's output
            return None
        self.shell.push({tool.name: tool})
        if build.widget is None:
            print(safe_text(f"flakebot: `{tool.name}` is ready in the kernel: {tool.example()}"))
        return tool

    def _start_rebuild(self, given: MagicLine) -> _Build:
        if len(given.command) != 2:
            raise UsageError("Usage: %flakebot rebuild NAME (`%flakebot list` shows the names).")
        settings = self._settings(given)
        try:
            record = tools.find(settings, given.command[1])
        except errors.UsageError as exc:
            raise UsageError(str(exc)) from None
        again = self._request(given, UntrustedText(record.request), name=record.name, crate=record.crate, rebuild=True)
        return self._start(given, again, settings)

    def _line(self, given: MagicLine) -> ToolClient | None:
        if not given.command:
            raise UsageError(f"Usage: %flakebot {LINE_USAGE}; or %%flakebot as a cell magic (see %%flakebot?).")
        command, rest = given.command[0], given.command[1:]
        if command == "help":  # what `%%flakebot?` shows: the cell form, the options, the line commands
            print((self.flakebot.__doc__ or "").lstrip(": \n"))
            return None
        if command == "dashboard":  # a link to the server extension's page, where this kernel's server serves it
            from IPython.display import display

            display(dashboard_link())
            return None
        if command == "rebuild":
            build = self._start_rebuild(given)
            return self._finish(build, self._wait(build))
        settings = self._settings(given)
        if command not in ("clean", "doctor"):  # they prepare their own way
            for note in prepare(settings):
                print(safe_text(f"flakebot: {note}"))
        if command == "load":
            self._load(settings, rest, everything=given.everything)
            return None
        try:
            with storage_errors(f"%flakebot {command}", settings.cache_dir):
                answer = line_commands.answer(
                    settings,
                    command,
                    rest,
                    everything=given.everything,
                    tail=given.tail,
                    rebuild=given.options.get("rebuild"),
                )
        except errors.FlakebotError as exc:  # a refused pull, a failed verify: said, not a traceback
            raise UsageError(str(exc)) from None
        if isinstance(answer, tools.ToolTable):
            from IPython.display import display

            # displayed, not returned: a returned value shows only as the cell's last line
            display(answer)  # a table as text, and as HTML in a notebook
            return None
        if isinstance(answer, team.Pulled):
            self.shell.push({answer.tool.name: answer.tool})  # type: ignore[union-attr]
        for note in answer.notes:
            print(safe_text(note))
        if answer.text:
            print(safe_text(answer.text))
        return None

    def _steer(self, line: str) -> None:
        """``steer NAME TEXT``: queue TEXT for NAME's running edit session (quotes around TEXT are optional)."""
        parts = line.split(None, 2)
        if len(parts) < 3:
            raise UsageError('Usage: %flakebot steer NAME TEXT, e.g. %flakebot steer md "also accept --upper".')
        text = parts[2].strip()
        try:
            words = shlex.split(text)
        except ValueError:
            words = []
        if len(words) == 1:  # one quoted string: its content
            text = words[0]
        try:
            answer = tools.steer(self._settings(self._parse("")), parts[1], text, source="magic")
        except errors.UsageError as exc:
            raise UsageError(str(exc)) from None
        print(safe_text(answer.text))

    def _cargo(self, line: str) -> None:
        """``cargo NAME ARGS``: cargo in the tool's workspace, sandboxed; its output (made safe) as it comes."""
        try:
            cargo_line(self._settings(self._parse("")), line.strip().partition(" ")[2])
        except errors.FlakebotError as exc:
            raise UsageError(str(exc)) from None

    def _load(self, settings: Settings, names: list[str], *, everything: bool) -> None:
        """``load NAME`` / ``load --all``: tools built earlier into the kernel's namespace, without rebuilding."""
        assert self.shell is not None
        if everything == bool(names) or len(names) > 1:
            raise UsageError("Usage: %flakebot load NAME, or %flakebot load --all (`%flakebot list` shows the names).")
        if everything:
            loaded, problems = tools.load_all(settings)
            if not loaded and not problems:
                print(tools.NO_TOOLS)
                return None
        else:
            try:
                loaded, problems = {names[0]: tools.load(settings, names[0])}, []
            except errors.FlakebotError as exc:
                raise UsageError(str(exc)) from None
        self.shell.push(loaded)
        for name, tool in loaded.items():
            print(safe_text(f"flakebot: `{name}` is ready in the kernel: {tool.example()}"))
        for problem in problems:
            print(safe_text(f"flakebot: {problem}"), file=sys.stderr)
        return None
