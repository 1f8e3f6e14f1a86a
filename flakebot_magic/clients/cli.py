"""The Python client of a command-line tool: its ``--help`` parsed into a typed, documented callable.

:func:`parse_help` reads the layouts clap prints (2.x ``FLAGS:``/``OPTIONS:``/
``ARGS:``, 3.x, 4.x short and long help), getopts' and GNU/argparse's
``-o, --output FILE`` lines, into :class:`CliSpec`: options (flags and
options with a value, their defaults and possible values) and positional
arguments. :class:`CliTool` turns them into keyword arguments with a real
:class:`inspect.Signature` and a numpydoc docstring::

    >>> hexyl(input=b"\\x00\\x01", length=2, color="never")   # doctest: +SKIP
    >>> md("# Hi", enable_tables=True)                         # doctest: +SKIP

Positional ``*args`` still go on the command line as they are; for a tool that
reads standard input (its help says so) a first plain ``str`` is the input.
When the help cannot be parsed, the tool still takes plain arguments, and its
docstring says so.
"""

from __future__ import annotations

import inspect
import keyword
import os
import re
import select
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from ..errors import ToolError
from .agents import ToolFunction
from .base import Confinement, ToolClient

__all__ = ["CliArgument", "CliOption", "CliSpec", "CliTool", "parse_help", "reads_stdin"]

_STDIN_HINT = re.compile(r"standard input|\bstdin\b|from input|reads? (?:from )?(?:the )?input", re.I)

#: keyword names the call itself uses; an option with one of these names gets a trailing ``_``
CALL_KEYWORDS = frozenset({"input", "timeout", "env", "args"})


def reads_stdin(help_text: str) -> bool:
    """Does the tool's help say it reads standard input?"""
    return bool(_STDIN_HINT.search(help_text))


# -- the help ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CliOption:
    """One option: ``-n, --length <N>``."""

    name: str  # the Python keyword
    flags: tuple[str, ...]  # as written: ("-n", "--length")
    value: str | None = None  # the value's placeholder, None for a flag
    value_optional: bool = False  # ``--color[=WHEN]``
    help: str = ""
    default: str | None = None
    choices: tuple[str, ...] = ()
    repeatable: bool = False

    @property
    def takes_value(self) -> bool:
        return self.value is not None

    @property
    def flag(self) -> str:
        """The flag to pass: the long one when there is one."""
        longs = [f for f in self.flags if f.startswith("--")]
        return longs[0] if longs else self.flags[0]


@dataclass(frozen=True)
class CliArgument:
    """One positional argument: ``<FILE>``, ``[FILE]...``."""

    name: str
    placeholder: str
    help: str = ""
    required: bool = False
    repeatable: bool = False


@dataclass(frozen=True)
class CliSpec:
    """What a tool's ``--help`` says: its options, arguments, subcommands and description."""

    options: tuple[CliOption, ...] = ()
    arguments: tuple[CliArgument, ...] = ()
    commands: tuple[str, ...] = ()
    description: str = ""
    usage: str = ""
    parsed: bool = False


_HEADER = re.compile(r"^(?P<title>[A-Za-z][A-Za-z ]{0,40}):\s*(?P<rest>.*)$")
_OPTION_PART = re.compile(
    r"^(?P<flag>--?[A-Za-z0-9?][A-Za-z0-9_-]*)"
    r"(?:(?P<sep>[ =])(?P<value>[<\[]?=?[A-Za-z0-9_.:|-]+[>\]]?(?:\.\.\.)?)|(?P<optional>\[=?[<]?[A-Za-z0-9_.:|-]+[>]?\](?:\.\.\.)?))?"
    r"(?P<dots>\.\.\.)?$"
)
_ARGUMENT_LINE = re.compile(r"^(?P<spec>[<\[]?[A-Za-z][A-Za-z0-9_-]*[>\]]?(?:\.\.\.)?)(?:\s{2,}(?P<help>\S.*))?$")
_DEFAULT = re.compile(r"\[default: ([^\]]*)\]")
_CHOICES = re.compile(r"\[possible values: ([^\]]*)\]")
_REPEAT_HINT = re.compile(r"multiple times|may be repeated|can be repeated|repeatable", re.I)


def _section_kind(title: str) -> str:
    lowered = title.lower()
    if "usage" in lowered:
        return "usage"
    if "command" in lowered:
        return "commands"
    if "option" in lowered or "flag" in lowered:
        return "options"
    if "arg" in lowered or "positional" in lowered:
        return "arguments"
    return "other"


def _keyword(name: str, taken: set[str]) -> str:
    ident = re.sub(r"\W", "_", name.strip("-<>[]. ")).strip("_").lower() or "value"
    if ident[0].isdigit():
        ident = "_" + ident
    if keyword.iskeyword(ident) or ident in CALL_KEYWORDS:
        ident += "_"
    while ident in taken:
        ident += "_"
    return ident


def _split_spec(text: str) -> tuple[str, str]:
    """``-n, --length <N>    Only read`` -> (``-n, --length <N>``, ``Only read``)."""
    match = re.search(r"\s{2,}|\t", text)
    if match is None:
        return text.strip(), ""
    return text[: match.start()].strip(), text[match.end():].strip()


def _parse_option(spec: str, help_text: str, taken: set[str]) -> CliOption | None:
    flags: list[str] = []
    value: str | None = None
    optional = False
    repeat = False
    for part in re.split(r",\s*|\s+or\s+", spec):
        part = part.strip()
        if not part:
            continue
        match = _OPTION_PART.match(part)
        if match is None:
            return None
        flags.append(match.group("flag"))
        if match.group("value"):
            raw = match.group("value")
            if raw.startswith("[") or raw.startswith("[="):
                optional = True
            value = raw
        if match.group("optional"):
            value, optional = match.group("optional"), True
        if match.group("dots") or (value or "").endswith("..."):
            repeat = True
    if not flags:
        return None
    if value is not None:
        value = value.strip("[]=<>").removesuffix("...").strip("<>") or "VALUE"
    longs = [f for f in flags if f.startswith("--")]
    name = _keyword(longs[0] if longs else flags[0], taken)
    default = _DEFAULT.search(help_text)
    choices = _CHOICES.search(help_text)
    return CliOption(
        name=name,
        flags=tuple(flags),
        value=value,
        value_optional=optional,
        help=help_text,
        default=default.group(1).strip() if default else None,
        choices=tuple(c.strip() for c in choices.group(1).split(",") if c.strip()) if choices else (),
        repeatable=repeat or bool(_REPEAT_HINT.search(help_text)),
    )


def _parse_argument(spec: str, help_text: str, taken: set[str]) -> CliArgument:
    repeat = spec.endswith("...")
    core = spec.removesuffix("...")
    required = core.startswith("<") or (not core.startswith("[") and not repeat)
    return CliArgument(
        name=_keyword(core, taken), placeholder=core.strip("<>[]"), help=help_text, required=required, repeatable=repeat
    )


def _usage_arguments(usage: str, taken: set[str]) -> list[CliArgument]:
    """Positional arguments named on a usage line: ``tool [OPTIONS] <INPUT> [OUTPUT]...``."""
    words = usage.split()[1:]  # drop the program
    found = []
    for word in words:
        match = re.fullmatch(r"(<[A-Za-z][\w-]*>|\[[A-Z][A-Z0-9_-]*\]|[A-Z][A-Z0-9_-]+)(\.\.\.)?", word)
        if match is None:
            continue
        core = match.group(1).strip("<>[]")
        if core.upper() in ("OPTIONS", "OPTION", "FLAGS", "ARGS", "COMMAND", "SUBCOMMAND"):
            continue
        found.append(_parse_argument(word, "", taken))
        taken.add(found[-1].name)
    return found


def parse_help(text: str) -> CliSpec:
    """Read a ``--help`` text into options, arguments, subcommands and a description."""
    if not text.strip():
        return CliSpec()
    lines = text.expandtabs(8).splitlines()
    options: list[CliOption] = []
    arguments: list[CliArgument] = []
    commands: list[str] = []
    description: list[str] = []
    usage = ""
    section = "top"
    taken: set[str] = {"help_", "version_"}
    # the entry being read: (kind, indent, spec, help lines)
    current: list[Any] | None = None

    def finish() -> None:
        nonlocal current
        if current is None:
            return
        kind, _, spec, help_lines = current
        help_text = " ".join(" ".join(help_lines).split())
        if kind == "option":
            option = _parse_option(spec, help_text, taken)
            if option is not None and not {"--help", "-h", "--version", "-V"} & set(option.flags):
                taken.add(option.name)
                options.append(option)
        elif kind == "argument":
            argument = _parse_argument(spec, help_text, taken)
            taken.add(argument.name)
            arguments.append(argument)
        elif kind == "command":
            commands.append(spec)
        current = None

    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped:
            # clap's long help puts blank lines inside an entry's help; keep reading it
            if current is not None:
                following = next((l for l in lines[index:] if l.strip()), "")
                following_indent = len(following) - len(following.lstrip())
                if not (following and following_indent > current[1] and not following.lstrip().startswith("-")):
                    finish()
            continue
        header = _HEADER.match(line) if indent == 0 else None
        if header is not None and not stripped.startswith("-"):
            finish()
            section = _section_kind(header.group("title"))
            if section == "usage":
                rest = header.group("rest").strip()
                if not rest and index < len(lines):
                    rest = lines[index].strip()
                    index += 1
                usage = usage or rest
                section = "top"
            continue
        if stripped.lower().startswith("usage "):  # "usage args [WORDS]..." without a colon
            usage = usage or stripped[len("usage "):]
            continue
        if current is not None and indent > current[1] and not stripped.startswith("-"):
            current[3].append(stripped)
            continue
        if stripped.startswith("-") and indent > 0 and re.match(r"--?[A-Za-z0-9?]", stripped):
            finish()
            spec, help_text = _split_spec(stripped)
            current = ["option", indent, spec, [help_text] if help_text else []]
            continue
        if section == "arguments" and indent > 0:
            finish()
            spec, help_text = _split_spec(stripped)
            if _ARGUMENT_LINE.match(spec):
                current = ["argument", indent, spec, [help_text] if help_text else []]
            continue
        if section == "commands" and indent > 0:
            finish()
            spec, help_text = _split_spec(stripped)
            if re.fullmatch(r"[a-z][\w-]*", spec) and spec != "help":
                current = ["command", indent, spec, [help_text] if help_text else []]
            continue
        finish()
        if section == "top" and indent == 0 or section == "top" and not options:
            description.append(stripped)
    finish()

    if not arguments and usage:
        arguments = _usage_arguments(usage, taken)
    elif usage:  # clap 2 and 3 list every argument as <NAME>; the usage line says which are optional
        arguments = [
            CliArgument(a.name, a.placeholder, a.help, False, a.repeatable or f"[{a.placeholder}]..." in usage)
            if f"[{a.placeholder}]" in usage else a
            for a in arguments
        ]
    # "name 1.2.3" first lines are not a description
    words = [d for d in description if not re.fullmatch(r"[\w.-]+ v?\d+(\.\d+)*\S*", d)]
    return CliSpec(
        options=tuple(options),
        arguments=tuple(arguments),
        commands=tuple(commands),
        description=" ".join(words).strip(),
        usage=usage,
        parsed=bool(options or arguments or commands),
    )


#: what the ``--help`` probe keeps of a tool's help text
HELP_BYTES = 1024 * 1024
#: what a call keeps of standard output (past it the tool is stopped) and of standard error
OUTPUT_BYTES = 64 * 1024 * 1024
STDERR_BYTES = 1024 * 1024


def _help_of(binary: Path, store_path: Path | None = None, timeout: float = 10.0) -> str:
    """The tool's ``--help`` (else ``-h``) text, run in the sandbox: the probe runs without being asked for.

    The store entry is visible read-only, a scratch dir is the only writable
    place, and the environment is the sandbox's allowlist: the probe sees no
    secret and no file of the user's.
    """
    confinement = Confinement(binary, store_path if store_path is not None else Path(binary).parent)
    try:
        for flag in ("--help", "-h"):
            try:
                proc = subprocess.Popen(
                    confinement.command([str(binary), flag]),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=confinement.scratch,
                    env=confinement.env(),
                    start_new_session=True,
                )
            except OSError:
                continue
            exchange = _Exchange(proc, stdout_cap=HELP_BYTES, stderr_cap=HELP_BYTES, stop_at_cap=False)
            try:
                out, err = exchange.run(b"", timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                exchange.close()
                continue
            except BaseException:
                _kill_group(proc)
                exchange.close()
                raise
            text = (out or err).decode("utf-8", "replace").strip()
            if proc.returncode == 0 and text:
                return text
        return ""
    finally:
        confinement.close()


# -- the callable ------------------------------------------------------------------------

_PathLike = Union[str, "os.PathLike[str]"]


def _option_annotation(option: CliOption) -> Any:
    if not option.takes_value:
        return Union[bool, int] if option.repeatable else bool
    base: Any = Literal[option.choices] if option.choices else Union[str, int, float]
    if option.value_optional:
        base = Union[base, bool]
    return Union[base, Sequence[str]] if option.repeatable else base


def _argument_annotation(argument: CliArgument) -> Any:
    return Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]] if argument.repeatable else Union[str, "os.PathLike[str]"]


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

    def __init__(self, *args: Any, _help: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._help = _help
        self._spec: CliSpec | None = None
        self._sig: inspect.Signature | None = None

    # -- what the help says ----------------------------------------------------

    @property
    def help(self) -> str:
        """The binary's ``--help`` text (run once, then remembered)."""
        if self._help is None:
            self._help = _help_of(self.binary, self.store_path)
        return self._help

    @property
    def spec(self) -> CliSpec:
        """The options and arguments parsed from :attr:`help`."""
        if self._spec is None:
            self._spec = parse_help(self.help)
        return self._spec

    @property
    def reads_stdin(self) -> bool:
        return reads_stdin(self.help)

    def _signature(self) -> inspect.Signature:
        if self._sig is None:
            kw = inspect.Parameter.KEYWORD_ONLY
            parameters = [
                inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL, annotation=Union[str, "os.PathLike[str]", int, float]),
                inspect.Parameter("input", kw, default=None, annotation=Optional[Union[str, bytes]]),
                inspect.Parameter("timeout", kw, default=None, annotation=Optional[float]),
                inspect.Parameter("env", kw, default=None, annotation=Optional[Mapping[str, str]]),
            ]
            for option in self.spec.options:
                annotation = _option_annotation(option)
                default = False if not option.takes_value else None
                parameters.append(
                    inspect.Parameter(option.name, kw, default=default, annotation=annotation if default is False else Optional[annotation])
                )
            for argument in self.spec.arguments:
                parameters.append(inspect.Parameter(argument.name, kw, default=None, annotation=Optional[_argument_annotation(argument)]))
            self._sig = inspect.Signature(parameters, return_annotation=str)
        return self._sig

    __signature__ = _InstanceAttribute("_signature")

    def _docstring(self) -> str:
        spec = self.spec
        lines = [
            f"{self.name}: {self.crate} {self.version}. {spec.description or self.description}".strip(),
            "",
            "Runs the tool and returns its standard output (a str).",
        ]
        if not spec.parsed:
            lines += [
                "",
                "flakebot could not parse this tool's --help into options, so it takes plain",
                f'command-line arguments only: {self.name}("--flag", "value", Path("file")).',
                f"See {self.name}.help for what the tool accepts.",
            ]
        lines += ["", "Parameters", "----------", "*args : str, os.PathLike, int or float", "    Command-line arguments, as they are."]
        if self.reads_stdin:
            lines.append("    This tool reads standard input: a first plain str is sent there (when input= is not given).")
        lines += [
            "input : str or bytes, optional",
            "    Text or bytes for the tool's standard input.",
            "timeout : float, optional",
            f"    Seconds before the tool is stopped (default {self.timeout:g}).",
            "env : mapping, optional",
            "    Variables added to the tool's environment for this call. The tool starts with an",
            "    allowlisted environment (PATH, HOME, LANG, ...; no API keys), plus the tool_env setting.",
        ]
        for option in spec.options:
            kind = "bool" if not option.takes_value else (
                " | ".join(repr(c) for c in option.choices) if option.choices else "str or number"
            )
            if option.repeatable:
                kind += " (repeatable: a list gives it several times)" if option.takes_value else " or int (a count)"
            lines.append(f"{option.name} : {kind}{'' if not option.takes_value else ', optional'}")
            form = ", ".join(option.flags) + (f" <{option.value}>" if option.takes_value else "")
            text = re.sub(r"\s*\[(default|possible values): [^\]]*\]", "", option.help).strip()
            lines.append(f"    {form}: {text}" if text else f"    {form}")
            if option.default is not None:
                lines.append(f"    The tool's default: {option.default}.")
        for argument in spec.arguments:
            lines.append(f"{argument.name} : str or os.PathLike{' (or a list)' if argument.repeatable else ''}, optional")
            lines.append(f"    <{argument.placeholder}>{': ' + argument.help if argument.help else ''} (positional, after the options)")
        if spec.commands:
            lines += ["", f"Subcommands (pass as the first argument): {', '.join(spec.commands)}."]
        lines += [
            "",
            "Returns",
            "-------",
            "str",
            "    The tool's standard output.",
            "",
            "Raises",
            "------",
            "ToolError",
            "    The tool exited non-zero (``returncode``, ``stderr``) or ran past ``timeout``.",
            "",
            "Examples",
            "--------",
            f">>> {self._rich_example()}  # doctest: +SKIP",
        ]
        return "\n".join(lines)

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
                argv += _option_argv(by_name[key], value)
            elif key in positional:
                if value is None:
                    continue
                values = value if isinstance(value, (list, tuple)) else [value]
                tail += [_text(v) for v in values]
            else:
                known = ", ".join(sorted([*by_name, *positional])) or "none: its --help could not be parsed"
                raise TypeError(
                    f"{self.name}() got an unexpected keyword argument {key!r}; its options are: {known}. "
                    f'Plain command-line arguments go as strings: {self.name}("--{key.replace("_", "-")}", ...)'
                )
        argv += [_text(a) for a in args]
        if any(t.startswith("-") for t in tail):
            tail.insert(0, "--")
        return argv + tail

    def __call__(
        self,
        *args: str | os.PathLike[str] | int | float,
        input: str | bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> str:
        """Run the tool; return its standard output (see ``help(tool)`` for its options)."""
        items = list(args)
        if (
            input is None
            and items
            and isinstance(items[0], str)
            and not items[0].startswith("-")
            and self.reads_stdin
        ):
            input = str(items.pop(0))
        argv = self.argv(*items, **options) if options else [_text(a) for a in items]
        data = input.encode() if isinstance(input, str) else input
        limit = self.timeout if timeout is None else timeout
        command = [str(self.binary), *argv]
        confinement = Confinement(self.binary, self.store_path) if self.confined_now else None
        try:
            proc = subprocess.Popen(
                confinement.command(command) if confinement else command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=confinement.scratch if confinement else None,
                # the allowlist, the tool_env setting and this call's env: nothing else of the kernel's
                env=confinement.env(self.env, env) if confinement else self._environment(env),
                start_new_session=True,  # a timeout or an interrupt stops what the tool started, too
            )
            return self._exchange(proc, data or b"", limit)
        finally:
            if confinement is not None:
                confinement.close()

    def _exchange(self, proc: subprocess.Popen[bytes], data: bytes, limit: float) -> str:
        exchange = _Exchange(proc, stdout_cap=OUTPUT_BYTES, stderr_cap=STDERR_BYTES)
        try:
            out, err = exchange.run(data, limit)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            exchange.close()
            raise ToolError(
                f"{self.name} ran past its time limit of {limit:g} s and was stopped. "
                "Pass a larger timeout=... if the input is just big.",
                returncode=None,
                stderr=exchange.stderr.decode("utf-8", "replace"),
            ) from None
        except BaseException:  # KeyboardInterrupt: stop the tool with the call
            _kill_group(proc)
            exchange.close()
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
            raise ToolError(
                f"{self.name} exited with status {proc.returncode}: "
                f"{stderr.strip()[-1500:] or '(no error output)'}",
                returncode=proc.returncode,
                stderr=stderr,
            )
        return stdout

    # -- describing ------------------------------------------------------------

    def example(self) -> str:
        if self.reads_stdin:
            return f'{self.name}("some input text")'
        return f'{self.name}("--help")'

    def _rich_example(self) -> str:
        spec = self.spec
        parts: list[str] = []
        if self.reads_stdin:
            parts.append('"some input text"')
        for argument in spec.arguments[:1]:
            if argument.required or not self.reads_stdin:
                parts.append(f'{argument.name}="{argument.placeholder.lower()}"')
        for option in spec.options:
            if not option.takes_value:
                parts.append(f"{option.name}=True")
                break
        return f"{self.name}({', '.join(parts)})" if parts else self.example()

    def functions(self) -> dict[str, ToolFunction]:
        properties: dict[str, Any] = {}
        spec = self.spec
        for option in spec.options:
            text = re.sub(r"\s*\[(default|possible values): [^\]]*\]", "", option.help).strip()
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
            schema["description"] = f"positional <{argument.placeholder}>" + (f": {argument.help}" if argument.help else "")
            properties[argument.name] = schema
        if self.reads_stdin:
            properties["input"] = {"type": "string", "description": "Text sent to the tool's standard input."}
        properties["args"] = {
            "type": "array",
            "items": {"type": "string"},
            "description": "Extra command-line arguments, as they are (rarely needed).",
        }
        description = (spec.description or self.description or f"Run {self.crate}.").strip()
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
            )
        }

    def _usage_notes(self) -> list[str]:
        notes = []
        if self.reads_stdin:
            notes.append("A first plain `str` argument is sent to standard input; later ones are command-line arguments. Use `pathlib.Path` for files.")
        if not self.spec.parsed:
            notes.append(f"flakebot could not parse the tool's `--help`; pass plain command-line arguments (see `{self.name}.help`).")
        notes.append("A non-zero exit raises `flakebot_magic.ToolError` (`returncode`, `stderr`).")
        return [" ".join(notes), ""] + super()._usage_notes()

    def summary(self) -> str:
        """Plain text: how to call the tool (what ``repr`` shows)."""
        lines = [
            f"{self.name}: {self.crate} {self.version} ({self.description or 'a command-line tool'})",
            f"  call:    {self.example()}",
            f"  args:    {self.name}(*args, input=None, timeout={self.timeout:g}, **options) -> str (standard output)",
        ]
        if self.reads_stdin:
            lines.append("  input:   a first plain-str argument is sent to standard input; later ones are options; use pathlib.Path for files")
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
            lines.append(f"  flake:   flake.lock {self.lock_hash}, nixpkgs {self._nixpkgs()}")
        lines.append(f"  backend: {self.backend}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<flakebot tool {self.name}: {self.crate} {self.version}, {self.backend}, {self.store_path}>\n{self.summary()}"


def _text(value: Any) -> str:
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


def _option_argv(option: CliOption, value: Any) -> list[str]:
    if value is None or value is False:
        return []
    flag = option.flag
    if not option.takes_value:
        count = value if isinstance(value, int) and not isinstance(value, bool) else 1
        return [flag] * max(count, 0)
    if value is True and option.value_optional:
        return [flag]
    values = value if isinstance(value, (list, tuple)) else [value]
    out: list[str] = []
    for item in values:
        text = "true" if item is True else "false" if item is False else _text(item)
        if option.choices and text not in option.choices:
            raise ValueError(f"{option.name} must be one of {', '.join(map(repr, option.choices))}, not {text!r}")
        if option.value_optional or text.startswith("-") and flag.startswith("--"):
            out.append(f"{flag}={text}")
        else:
            out += [flag, text]
    return out


class _Exchange:
    """``Popen.communicate`` with a deadline and bounded output, minus its sleep-polling wait for the exit.

    ``communicate(timeout=...)`` waits for the exit by sleeping in growing
    steps from 0.5 ms; for a tool that runs in a millisecond that doubles the
    call. Here the exit is awaited on a pidfd (Linux), without polling.

    Output is read in chunks and kept up to ``stdout_cap`` / ``stderr_cap``
    bytes. Past the standard output's cap the tool is stopped and
    :attr:`overflow` set (``stop_at_cap``), or the rest is read and dropped;
    what standard error drops is said at its end.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        *,
        stdout_cap: int = OUTPUT_BYTES,
        stderr_cap: int = STDERR_BYTES,
        stop_at_cap: bool = True,
    ) -> None:
        self.proc = proc
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.caps = {"out": stdout_cap, "err": stderr_cap}
        self.sizes = {"out": 0, "err": 0}
        self.dropped = {"out": 0, "err": 0}
        self.stop_at_cap = stop_at_cap
        self.overflow = False

    @property
    def stderr(self) -> bytes:
        return b"".join(self.err) + self._note("err")

    def _note(self, which: str) -> bytes:
        dropped = self.dropped[which]
        return f"\n[flakebot: {dropped} more bytes dropped (truncated at {self.caps[which]} bytes)]\n".encode() if dropped else b""

    def _keep(self, which: str, sink: list[bytes], chunk: bytes) -> None:
        room = self.caps[which] - self.sizes[which]
        if room > 0:
            sink.append(chunk[:room])
            self.sizes[which] += min(room, len(chunk))
        self.dropped[which] += max(len(chunk) - max(room, 0), 0)

    def run(self, data: bytes, limit: float) -> tuple[bytes, bytes]:
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        deadline = time.monotonic() + limit
        sinks = {proc.stdout: ("out", self.out), proc.stderr: ("err", self.err)}
        view = memoryview(data)
        offset = 0
        with selectors.DefaultSelector() as selector:
            for stream in sinks:
                selector.register(stream, selectors.EVENT_READ)
            if view:
                selector.register(proc.stdin, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise subprocess.TimeoutExpired(proc.args, limit)
                for key, _ in selector.select(remaining):
                    if key.fileobj is proc.stdin:
                        try:
                            offset += os.write(key.fd, view[offset : offset + select.PIPE_BUF])
                        except BrokenPipeError:  # the tool stopped reading: fine
                            offset = len(view)
                        if offset >= len(view):
                            selector.unregister(proc.stdin)
                            proc.stdin.close()
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        which, sink = sinks[key.fileobj]  # type: ignore[index]
                        self._keep(which, sink, chunk)
                        if which == "out" and self.dropped["out"] and self.stop_at_cap:
                            self.overflow = True
                            _kill_group(proc)
                            self.close()
                            return b"".join(self.out), self.stderr
                    else:
                        selector.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]
        self._reap(deadline, limit)
        return b"".join(self.out) + self._note("out"), b"".join(self.err) + self._note("err")

    def _reap(self, deadline: float, limit: float) -> None:
        proc = self.proc
        if proc.poll() is not None:
            return
        try:
            fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfds here: let Popen poll
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            return
        try:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0.0))
        finally:
            os.close(fd)
        if not ready:
            raise subprocess.TimeoutExpired(proc.args, limit)
        proc.wait()

    def close(self) -> None:
        """After a kill: reap the tool, close the pipes."""
        proc = self.proc
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()  # not read to the end: something outside the group may hold it open


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
