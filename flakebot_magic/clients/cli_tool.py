"""The Python client of a command-line tool: its ``--help`` (see :mod:`.cli_tool_help`) as a typed, documented callable.

:class:`CliTool` turns the options and arguments :func:`~.cli_tool_help.parse_help`
finds into keyword arguments with a real :class:`inspect.Signature` and a
numpydoc docstring::

    >>> hexyl(input=b"\\x00\\x01", length=2, color="never")   # doctest: +SKIP
    >>> md("# Hi", enable_tables=True)                         # doctest: +SKIP

Positional ``*args`` still go on the command line as they are; for a tool that
reads standard input (its help says so) a first plain ``str`` or ``bytes`` is
the input. A tool whose help shows it reads one input file and no standard
input gets a first ``str`` that is not a path through a temporary file.

A result is data: tools start with ``NO_COLOR=1``, ``CLICOLOR=0`` and
``TERM=dumb``, and ANSI escape sequences that still come through are
stripped (``raw=True`` keeps the output as the tool wrote it); a tool that drew
with colour or style anyway returns a :class:`~.terminal_text.TerminalText`, which
shows the drawing.
When the help cannot be parsed, the tool still takes plain arguments, and its
docstring says so.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..commands import typed
from ..errors import ToolArgumentError, ToolError
from ..host.deadline import Deadline
from ..host.exchange import OUTPUT_BYTES, STDERR_BYTES, Exchange, Started
from ..host.process import spawn, start_call
from ..untrusted import safe_text, strip_sequences
from .agents import ToolFunction
from .base import Confinement, ToolClient
from .cli_tool_doc import cli_docstring, cli_signature
from .cli_tool_help import CliArgument, CliSpec, as_text, help_of, parse_help, probe_help, reads_stdin
from .schema import sentence
from .terminal_text import shown_help, tool_result

__all__ = ["CALL_KEYWORDS", "PLAIN_ENV", "CliTool", "strip_ansi"]

#: what a tool is started with so that it writes plain text (a call's ``env=`` may override it)
PLAIN_ENV = {"NO_COLOR": "1", "CLICOLOR": "0", "TERM": "dumb"}
#: an argument placeholder that names one input file
_FILE_ARGUMENT = re.compile(r"^(?:in(?:put)?[-_]?)?(?:file|path)(?:name)?$|^input$", re.I)


#: ``text`` without ANSI escape sequences, the rest as written (:func:`flakebot_magic.untrusted.strip_sequences`)
strip_ansi = strip_sequences


class _InstanceAttribute:
    """An attribute computed per instance (``__signature__``, ``__doc__``), plain on the class."""

    def __init__(self, method: str, class_value: Any = None) -> None:
        self.method = method
        self.class_value = class_value

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self.class_value
        return getattr(obj, self.method)()


class CliTool(ToolClient):
    """A deployed command-line tool, callable from Python.

    ``tool(*args, input=None, timeout=None, env=None, **options)`` runs the
    binary and returns its standard output; options and named positional
    arguments parsed from its ``--help`` are keyword arguments (see
    ``help(tool)`` or ``inspect.signature(tool)``).

    Examples
    --------
    >>> md("# Hi")                                        # doctest: +SKIP
    '<h1>Hi</h1>\\n'
    >>> hexyl(input=b"\\x00\\x01", length=2, color="never")   # doctest: +SKIP
    """

    kind = "cli"
    server = False  # it runs only while called: a process per call, confined when ``confined_now`` says so
    noun, a_noun = "command-line tool", "a command-line tool"
    contract_text = (
        "A cli tool takes its input from arguments or standard input and prints its result to standard "
        "output. Its --help must exit 0 and describe the usage; if it reads standard input, its help "
        'must say "standard input".'
    )

    @classmethod
    def runs_confined(cls, binary: Path, store_path: Path) -> str:
        """Its ``--help`` run in the sandbox, as the first call asks it (:func:`~.cli_tool_help.probe_help`)."""
        return probe_help(binary, store_path).failed

    def __init__(self, *args: Any, _help: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._help = _help
        self._safe_help: str | None = None
        self._reads_stdin: bool | None = None
        self._spec: CliSpec | None = None
        self._sig: inspect.Signature | None = None

    # -- what the help says ----------------------------------------------------

    @property
    def help(self) -> str:
        """The binary's ``--help`` text (run once, then remembered), made safe to show."""
        return self._help_within(None)

    def _help_within(self, deadline: Deadline | None) -> str:
        """:attr:`help`; a probe it runs ends by ``deadline`` too (a first call's: the probe is part of the call)."""
        if self._safe_help is None:  # made safe once: every call asks (reads_stdin), the text never changes
            if self._help is None:
                self._help = help_of(self.binary, self.store_path, name=self.name, deadline=deadline)
            self._safe_help = shown_help(self.name, safe_text(self._help, style=True))  # its value: plain
        return self._safe_help

    @property
    def spec(self) -> CliSpec:
        """The options and arguments parsed from :attr:`help`."""
        if self._spec is None:
            self._spec = parse_help(self.help, CALL_KEYWORDS)
        return self._spec

    @property
    def reads_stdin(self) -> bool:
        if self._reads_stdin is None:
            self._reads_stdin = reads_stdin(self.help)
        return self._reads_stdin

    def _signature(self) -> inspect.Signature:
        if self._sig is None:
            self._sig = cli_signature(self.spec)
        return self._sig

    __signature__ = _InstanceAttribute("_signature")

    def _docstring(self) -> str:
        summary = f"{self.name}: {self.crate} {self.version}. {sentence(self.spec.description or self.description)}"
        return cli_docstring(
            self.spec,
            summary=summary.strip(),
            name=self.name,
            timeout=self.timeout,
            reads_stdin=self.reads_stdin,
            example=self._rich_example(),
        )

    __doc__ = _InstanceAttribute("_docstring", __doc__)

    # -- calling ---------------------------------------------------------------

    def argv(self, *args: Any, **options: Any) -> list[str]:
        """The command line a call with ``options`` runs (without the binary)."""
        spec = self.spec
        by_name = {o.name: o for o in spec.options}
        positional = {a.name: a for a in spec.arguments}
        argv: list[str] = []
        tail: list[str] = []
        for key, value in options.items():
            if key in by_name:
                argv += by_name[key].argv(value)
            elif key in positional:
                if value is None:
                    continue
                values = value if isinstance(value, (list, tuple)) else [value]
                tail += [as_text(v) for v in values]
            else:
                names = sorted([*by_name, *positional])
                known = ", ".join(names) or "none: its --help could not be parsed"
                close = difflib.get_close_matches(key, names, n=1)
                hint = (
                    f"did you mean {close[0]}={value!r}?"
                    if close
                    else f'plain command-line arguments go as strings: {self.name}("--{key.replace("_", "-")}", ...)'
                )
                raise ToolArgumentError(
                    f"{self.name}() got an unexpected keyword argument {key!r}: {hint} Its options are: {known}."
                )
        argv += [as_text(a) for a in args]
        if any(t.startswith("-") for t in tail):
            tail.insert(0, "--")
        return argv + tail

    def __call__(
        self,
        *args: str | bytes | os.PathLike[str] | int | float,
        input: str | bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        raw: bool = False,
        **options: Any,
    ) -> str:
        """Run the tool; return its standard output (see ``help(tool)`` for its options).

        ``raw=True`` returns the output as written (colours and all); by
        default the tool is asked for plain text and escapes are stripped.
        """
        __tracebackhide__ = True  # IPython shows the caller's line and the error, not this method's workings
        deadline = Deadline.of_call(self.timeout if timeout is None else timeout)  # the call's, its every wait's
        limit = deadline.limit
        confined = self.confined_now
        if confined or self.entry is not None:  # a store entry: checked every call (stats while unchanged)
            self.require_binary()
        self._help_within(deadline)  # a first call's --help probe runs within the call's time
        items: list[Any] = list(args)
        if input is None and items and isinstance(items[0], bytes):
            if not self.reads_stdin:
                raise TypeError(
                    f"{self.name}() got bytes as a positional argument, and its help does not say it reads "
                    f"standard input. Pass them as input=b'...' to send them there, or write them to a file "
                    f"and pass its pathlib.Path."
                )
            input = items.pop(0)
        if input is None and items and isinstance(items[0], str) and not items[0].startswith("-") and self.reads_stdin:
            input = str(items.pop(0))
        if any(isinstance(item, bytes) for item in items):
            raise TypeError(f"{self.name}(): bytes go to standard input as input=b'...', not as a later argument.")
        text_file = self._text_for_file(items) if input is None and not options else None
        confinement = Confinement(self.binary, self.store_path) if confined else None
        scratch = None
        try:
            if text_file is not None:
                # a tool that reads one input file, handed text: the text goes through a temporary file
                scratch = Path(confinement.scratch if confinement else tempfile.mkdtemp(prefix="flakebot-input-"))
                path = scratch / "input.txt"
                path.write_text(items[0], encoding="utf-8")
                items[0] = str(path) if confinement is None else path.name
            argv = self.argv(*items, **options) if options else [as_text(a) for a in items]
            data = input.encode() if isinstance(input, str) else input
            command = [str(self.binary), *argv]
            plain = {} if raw else PLAIN_ENV
            extra = {**plain, **(env or {})}
            failed: OSError | None = None
            try:
                # its own session (a kill stops what it started, too); the allowlist, tool_env, this call's env
                proc: Started
                if confinement:
                    wrapped, scratch_dir = confinement.command(command, deadline.left()), confinement.scratch
                    proc = spawn(wrapped, stdin=True, cwd=scratch_dir, env=confinement.env(self.env, extra))
                else:
                    proc = start_call(command, env=self._environment(extra))
            except OSError as exc:
                failed = exc
            if failed is not None:  # outside the handler: the ToolError below carries no OSError
                if isinstance(failed, FileNotFoundError):
                    self.require_binary()  # the binary is gone: say how to get the tool back
                raise ToolError(  # its binary truncated, overwritten, gone: no raw OSError for the caller
                    f"{self.name} could not start: {failed.strerror or failed} ({self.binary}). Its binary is "
                    f"damaged or missing: {typed('doctor')} checks it and sets a damaged store entry aside; then "
                    f"{typed(f'rebuild {self.name}')} builds it again.",
                    returncode=None,
                )
            out = self._exchange(proc, data or b"", limit, items, deadline.at)
            return out if raw else tool_result(out)
        finally:
            if confinement is not None:
                confinement.close()
            elif scratch is not None:
                for leftover in scratch.iterdir():
                    leftover.unlink()
                scratch.rmdir()

    def _file_argument(self) -> CliArgument | None:
        """The one positional argument when it names an input file (``<FILE>``, ``[INPUT]``), else None."""
        arguments = self.spec.arguments
        if len(arguments) != 1:
            return None
        argument = arguments[0]
        return argument if _FILE_ARGUMENT.match(argument.name) or _FILE_ARGUMENT.match(argument.placeholder) else None

    def _text_for_file(self, items: list[Any]) -> str | None:
        """The text to pass through a temporary file: a lone ``str`` that is no path, for a file-only tool."""
        if self.reads_stdin or len(items) != 1 or not isinstance(items[0], str) or items[0].startswith("-"):
            return None
        text = items[0]
        if self._file_argument() is None or _is_path(text):
            return None
        return text

    def _exchange(
        self, proc: Started, data: bytes, limit: float, items: Sequence[Any] = (), deadline: float | None = None
    ) -> str:
        """Run the started call ``proc`` until ``deadline`` (default: ``limit`` s from now)."""
        exchange = Exchange(proc, stdout_cap=OUTPUT_BYTES, stderr_cap=STDERR_BYTES)
        try:
            out, err = exchange.run(data, limit if deadline is None else deadline - time.monotonic())
        except subprocess.TimeoutExpired:
            exchange.abandon()
            what = (  # when it exited: what it left running outside its group held its output
                f"exited (status {proc.returncode}), but a process it started and left running kept its output open "
                f"past its time limit of {limit:g} s; that process was stopped and the output dropped. A command-line "
                "tool must not leave processes behind that hold its standard output or error."
                if exchange.exited
                else f"ran past its time limit of {limit:g} s and was stopped. Pass a larger timeout=... if the input "
                "is just big."
            )
            raise ToolError(
                f"{self.name} {what}",
                returncode=proc.returncode if exchange.exited else None,
                stderr=exchange.stderr.decode("utf-8", "replace"),
            ) from None
        except BaseException:  # KeyboardInterrupt: stop the tool with the call
            exchange.abandon()
            raise
        if exchange.overflow:
            raise ToolError(
                f"{self.name} wrote more than {OUTPUT_BYTES // (1024 * 1024)} MiB to standard output and was "
                "stopped (the output was dropped). Write big results to a file and pass its path instead.",
                returncode=proc.returncode,
                stderr=err.decode("utf-8", "replace"),
            )
        stdout = out.decode("utf-8", "replace")
        if proc.returncode != 0:
            stderr = err.decode("utf-8", "replace")
            hint = self._not_a_file_hint(items)
            raise ToolError(
                f"{hint}{self.name} exited with status {proc.returncode}: "
                f"{strip_ansi(stderr).strip()[-1500:] or '(no error output)'}",
                returncode=proc.returncode,
                stderr=stderr,
            )
        return stdout

    def _not_a_file_hint(self, items: Sequence[Any]) -> str:
        """What to do when a failed call was handed text where the tool wants a file path."""
        texts = [i for i in items if isinstance(i, str) and not i.startswith("-") and not _is_path(i)]
        if self.reads_stdin or not texts:
            return ""
        shown = texts[0] if len(texts[0]) <= 40 else texts[0][:37] + "..."
        return (
            f"{self.name} reads files, not text, and its help does not say it reads standard input: "
            f"{shown!r} is not a file. Write the text to a file and pass its pathlib.Path, "
            f"or send it with input='...' if the tool reads standard input after all.\n"
        )

    # -- describing ------------------------------------------------------------

    def example(self) -> str:
        """The first call to try; never one that passes ``--help`` as data (``tool.help`` shows the help)."""
        if self.reads_stdin:
            return f'{self.name}("some input text")'
        # with help, the plain call (its help, tool.help, says what it takes); with none, what a binary deployed as
        # published takes: text, as an argument (qrencode draws its first argument; qr() would panic)
        return f"{self.name}()" if self.help else f'{self.name}("some text")'

    def _rich_example(self) -> str:
        """The first call to try: the plain one, with an argument only where the tool needs one.

        Never an option for show: the first flag of a help text is as often
        ``--dry-run`` or ``--debug`` as anything useful.
        """
        spec = self.spec
        parts: list[str] = []
        if self.reads_stdin:
            parts.append('"some input text"')
        for argument in spec.arguments[:1]:
            if argument.required or not self.reads_stdin:
                parts.append(f'{argument.name}="{argument.placeholder.lower()}"')
        return f"{self.name}({', '.join(parts)})" if parts else self.example()

    def functions(self) -> dict[str, ToolFunction]:
        properties: dict[str, Any] = {}
        spec = self.spec
        for option in spec.options:
            text = re.sub(r"(?<!\s)\s*\[(default|possible values): [^\][]*\]", "", option.help).strip()
            form = ", ".join(option.flags)
            schema: dict[str, Any]
            if not option.takes_value:
                schema = {"type": "boolean"}
            elif option.choices:
                schema = {"type": "string", "enum": list(option.choices)}
            else:
                schema = {"type": "string"}
            if option.repeatable and option.takes_value:
                schema = {"type": "array", "items": schema}
            default = f" (tool default: {option.default})" if option.default is not None else ""
            schema["description"] = f"{form}: {text}{default}".strip()
            properties[option.name] = schema
        for argument in spec.arguments:
            item = {"type": "string"}
            schema = {"type": "array", "items": item} if argument.repeatable else dict(item)
            schema["description"] = f"positional <{argument.placeholder}>" + (
                f": {argument.help}" if argument.help else ""
            )
            properties[argument.name] = schema
        if self.reads_stdin:
            properties["input"] = {"type": "string", "description": "Text sent to the tool's standard input."}
        properties["args"] = {
            "type": "array",
            "items": {"type": "string"},
            "description": "Extra command-line arguments, as they are (rarely needed).",
        }
        description = sentence(spec.description or self.description or f"Run {self.crate}")
        description += " Returns the tool's standard output."
        if not spec.parsed:
            description += " Its options could not be parsed from --help; pass command-line arguments in args."

        def wire(arguments: dict[str, Any]) -> Any:
            arguments = dict(arguments)
            extra = arguments.pop("args", None) or []
            return self(*extra, **arguments)

        return {
            self.name: ToolFunction(
                name=self.name,
                description=description,
                parameters={"type": "object", "properties": properties, "required": []},
                function=self,
                example=self._rich_example(),
                wire=wire,
                hidden=("env", "raw"),  # flakebot's plumbing (one call's environment, escapes kept): not shown
            )
        }

    def _usage_notes(self) -> list[str]:
        notes = []
        if self.reads_stdin:
            notes.append(
                "A first plain `str` argument is sent to standard input; later ones are command-line arguments. Use `pathlib.Path` for files."
            )
        if not self.spec.parsed:
            notes.append(
                f"flakebot could not parse the tool's `--help`; pass plain command-line arguments (see `{self.name}.help`)."
            )
        notes.append("A non-zero exit raises `flakebot_magic.ToolError` (`returncode`, `stderr`).")
        return [" ".join(notes), "", *super()._usage_notes()]

    def summary(self) -> str:
        """Plain text: how to call the tool (what ``repr`` shows)."""
        lines = [
            f"{self.name}: {self.crate} {self.version} ({self.description or 'a command-line tool'})",
            f"  call:    {self.example()}",
            f"  args:    {self.name}(*args, input=None, timeout={self.timeout:g}, **options) -> str (standard output)",
        ]
        if self.reads_stdin:
            lines.append(
                "  input:   a first plain-str argument is sent to standard input; later ones are options; use pathlib.Path for files"
            )
        if self.spec.options or self.spec.arguments:
            names = [o.name for o in self.spec.options] + [a.name for a in self.spec.arguments]
            lines.append(f"  options: {', '.join(names)} (keyword arguments; help({self.name}) explains them)")
        elif self.help:
            lines.append("  options: could not be parsed from --help; pass plain command-line arguments")
        lines += [
            "  errors:  ToolError(returncode, stderr) on a non-zero exit",
            f"  help:    {self.name}.help",
            f"  binary:  {self.binary}",
            f"  source:  {self.crate} {self.version}, checksum {self.checksum[:16]}…",
            f"  store:   {self.store_path} (hash {self.source_hash})",
        ]
        if self.backend == "nix":
            nixpkgs = f", nixpkgs {self._nixpkgs()}" if self._nixpkgs() else ""
            lines.append(f"  flake:   flake.lock {self.lock_hash}{nixpkgs}")
        lines.append(f"  backend: {self.backend}")
        return safe_text("\n".join(lines))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # what IPython shows for `md` (text/plain): how to call it; repr() stays one line (pydoc's help starts so)
        printer.text(f"<flakebot tool {self.name}: {self.crate} {self.version}, {self.backend}, {self.store_path}>")
        for line in self.summary().splitlines():
            printer.break_()
            printer.text(line)


#: the names a call itself takes (``self``, ``args``, ``input``, ``timeout``, ``env``, ``raw``), read off
#: :meth:`CliTool.__call__`: an option of the tool's with one of these names gets another keyword
#: (``--raw`` is ``raw_``; :func:`~.schema.python_name`), so a keyword added to the call is reserved too
CALL_KEYWORDS = frozenset(
    name
    for name, parameter in inspect.signature(CliTool.__call__).parameters.items()
    if parameter.kind is not inspect.Parameter.VAR_KEYWORD
)


def _is_path(text: str) -> bool:
    """Whether ``text`` names an existing file (text with a newline never does)."""
    if "\n" in text or "\0" in text or len(text) > 4096:
        return False
    try:
        return os.path.exists(text)
    except (OSError, ValueError):
        return False
