"""A command-line tool's ``--help``: probed in the sandbox, parsed into options and arguments.

:func:`parse_help` reads the layouts clap prints (2.x ``FLAGS:``/``OPTIONS:``/
``ARGS:``, 3.x, 4.x short and long help), getopts' and GNU/argparse's
``-o, --output FILE`` lines, into :class:`CliSpec`: options (flags and
options with a value, their defaults and possible values) and positional
arguments. :func:`help_of` runs the probe: ``--help`` (else ``-h``), confined.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..commands import typed
from ..errors import ToolError
from ..host.deadline import Deadline
from ..host.exchange import Exchange
from ..host.process import spawn
from ..untrusted import strip_sequences
from .base import Confinement
from .schema import python_name

__all__ = [
    "HELP_BYTES",
    "CliArgument",
    "CliOption",
    "CliSpec",
    "HelpProbe",
    "as_text",
    "help_of",
    "parse_help",
    "probe_help",
    "reads_stdin",
]

#: a help text has words; what has none is a drawing or noise (a tool that took --help as its data)
_LETTERS = re.compile(r"[^\W\d_]{2}")
_STDIN_HINT = re.compile(r"standard input|\bstdin\b|from input|reads? (?:from )?(?:the )?input", re.I)


def as_text(value: Any) -> str:
    """A call's argument as a command-line word (a path as its path)."""
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


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

    def argv(self, value: Any) -> list[str]:
        """The command-line words that give this option ``value`` (a keyword argument of a call)."""
        if value is None or value is False:
            return []
        flag = self.flag
        if not self.takes_value:
            count = value if isinstance(value, int) and not isinstance(value, bool) else 1
            return [flag] * max(count, 0)
        if value is True and self.value_optional:
            return [flag]
        values = value if isinstance(value, (list, tuple)) else [value]
        out: list[str] = []
        for item in values:
            text = "true" if item is True else "false" if item is False else as_text(item)
            if self.choices and text not in self.choices:
                raise ValueError(f"{self.name} must be one of {', '.join(map(repr, self.choices))}, not {text!r}")
            if self.value_optional or (text.startswith("-") and flag.startswith("--")):
                out.append(f"{flag}={text}")
            else:
                out += [flag, text]
        return out


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
#: ``[^\][]``: a value runs to the next bracket, so an unclosed ``[default: `` is scanned once, not once per start
_DEFAULT = re.compile(r"\[default: ([^\][]*)\]")
_CHOICES = re.compile(r"\[possible values: ([^\][]*)\]")
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


def _keyword(name: str, taken: set[str], reserved: frozenset[str]) -> str:
    """An option's or argument's keyword: :func:`~.schema.python_name` of the flag, lower case (``--Dry-Run`` -> ``dry_run``)."""
    return python_name(name.strip("-<>[]. ").lower(), taken, reserved=reserved, empty="value")


def _split_spec(text: str) -> tuple[str, str]:
    """``-n, --length <N>    Only read`` -> (``-n, --length <N>``, ``Only read``)."""
    match = re.search(r"\s{2,}|\t", text)
    if match is None:
        return text.strip(), ""
    return text[: match.start()].strip(), text[match.end() :].strip()


def _parse_option(spec: str, help_text: str, taken: set[str], reserved: frozenset[str]) -> CliOption | None:
    flags: list[str] = []
    value: str | None = None
    optional = False
    repeat = False
    for part in re.split(r",\s*|(?<!\s)\s+or\s+", spec):
        part = part.strip()
        if not part:
            continue
        match = _OPTION_PART.match(part)
        if match is None:
            return None
        flags.append(match.group("flag"))
        if match.group("value"):
            raw = match.group("value")
            if raw.startswith(("[", "[=")):
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
    name = _keyword(longs[0] if longs else flags[0], taken, reserved)
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


def _parse_argument(spec: str, help_text: str, taken: set[str], reserved: frozenset[str]) -> CliArgument:
    repeat = spec.endswith("...")
    core = spec.removesuffix("...")
    required = core.startswith("<") or (not core.startswith("[") and not repeat)
    return CliArgument(
        name=_keyword(core, taken, reserved),
        placeholder=core.strip("<>[]"),
        help=help_text,
        required=required,
        repeatable=repeat,
    )


def _usage_arguments(usage: str, taken: set[str], reserved: frozenset[str]) -> list[CliArgument]:
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
        found.append(_parse_argument(word, "", taken, reserved))
        taken.add(found[-1].name)
    return found


def parse_help(text: str, reserved: frozenset[str] = frozenset()) -> CliSpec:
    """Read a ``--help`` text into options, arguments, subcommands and a description.

    Each option and argument gets a keyword (:func:`~.schema.python_name`):
    distinct, a valid identifier, never a Python keyword nor one of
    ``reserved`` (what the call itself takes; :class:`~.cli_tool.CliTool` passes
    its :data:`~.cli_tool.CALL_KEYWORDS`), the flag kept beside it.
    """
    if not text.strip():
        return CliSpec()
    reader = _HelpReader(text.expandtabs(8).splitlines(), reserved)
    reader.read()
    return reader.spec()


@dataclass
class _Entry:
    """The entry of a help text being read: an option, an argument or a subcommand, its help lines so far."""

    kind: str
    indent: int
    spec: str
    help: list[str]


class _HelpReader:
    """:func:`parse_help`'s reading, line by line: the section it is in, the entry it is reading, what it found."""

    def __init__(self, lines: list[str], reserved: frozenset[str]) -> None:
        self.lines = lines
        self.index = 0
        self.reserved = reserved
        self.options: list[CliOption] = []
        self.arguments: list[CliArgument] = []
        self.commands: list[str] = []
        self.description: list[str] = []
        self.usage = ""
        self.section = "top"
        self.taken: set[str] = {"help_", "version_"}
        self.current: _Entry | None = None

    def read(self) -> None:
        while self.index < len(self.lines):
            line = self.lines[self.index]
            self.index += 1
            self._line(line)
        self.finish()

    def finish(self) -> None:
        """The entry being read is complete: keep it."""
        current, self.current = self.current, None
        if current is None:
            return
        help_text = " ".join(" ".join(current.help).split())
        if current.kind == "option":
            option = _parse_option(current.spec, help_text, self.taken, self.reserved)
            if option is not None and not {"--help", "-h", "--version", "-V"} & set(option.flags):
                self.taken.add(option.name)
                self.options.append(option)
        elif current.kind == "argument":
            argument = _parse_argument(current.spec, help_text, self.taken, self.reserved)
            self.taken.add(argument.name)
            self.arguments.append(argument)
        elif current.kind == "command":
            self.commands.append(current.spec)

    def _line(self, line: str) -> None:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped:
            self._blank()
            return
        header = _HEADER.match(line) if indent == 0 else None
        if header is not None and not stripped.startswith("-"):
            self._header(header)
            return
        if stripped.lower().startswith("usage "):  # "usage args [WORDS]..." without a colon
            self.usage = self.usage or stripped[len("usage ") :]
            return
        current = self.current
        if current is not None and indent > current.indent and not stripped.startswith("-"):
            current.help.append(stripped)
            return
        if stripped.startswith("-") and indent > 0 and re.match(r"--?[A-Za-z0-9?]", stripped):
            self._start("option", indent, stripped, lambda spec: True)
            return
        if self.section == "arguments" and indent > 0:
            self._start("argument", indent, stripped, lambda spec: bool(_ARGUMENT_LINE.match(spec)))
            return
        if self.section == "commands" and indent > 0:
            self._start(
                "command", indent, stripped, lambda spec: bool(re.fullmatch(r"[a-z][\w-]*", spec)) and spec != "help"
            )
            return
        self.finish()
        if (self.section == "top" and indent == 0) or (self.section == "top" and not self.options):
            self.description.append(stripped)

    def _blank(self) -> None:
        # clap's long help puts blank lines inside an entry's help; keep reading it
        if self.current is None:
            return
        following = next((line for line in self.lines[self.index :] if line.strip()), "")
        following_indent = len(following) - len(following.lstrip())
        if not (following and following_indent > self.current.indent and not following.lstrip().startswith("-")):
            self.finish()

    def _header(self, header: re.Match[str]) -> None:
        self.finish()
        self.section = _section_kind(header.group("title"))
        if self.section == "usage":
            rest = header.group("rest").strip()
            if not rest and self.index < len(self.lines):
                rest = self.lines[self.index].strip()
                self.index += 1
            self.usage = self.usage or rest
            self.section = "top"

    def _start(self, kind: str, indent: int, stripped: str, fits: Callable[[str], bool]) -> None:
        """A new entry of ``kind`` begins (when its spec ``fits``); the one before it is complete."""
        self.finish()
        spec, help_text = _split_spec(stripped)
        if fits(spec):
            self.current = _Entry(kind, indent, spec, [help_text] if help_text else [])

    def spec(self) -> CliSpec:
        """What was read, as a :class:`CliSpec`."""
        arguments, usage = self.arguments, self.usage
        if not arguments and usage:
            arguments = _usage_arguments(usage, self.taken, self.reserved)
        elif usage:  # clap 2 and 3 list every argument as <NAME>; the usage line says which are optional
            arguments = [
                CliArgument(a.name, a.placeholder, a.help, False, a.repeatable or f"[{a.placeholder}]..." in usage)
                if f"[{a.placeholder}]" in usage
                else a
                for a in arguments
            ]
        # "name 1.2.3" first lines are not a description
        words = [d for d in self.description if not re.fullmatch(r"[\w.-]+ v?\d+(\.\d+)*\S*", d)]
        return CliSpec(
            options=tuple(self.options),
            arguments=tuple(arguments),
            commands=tuple(self.commands),
            description=" ".join(words).strip(),
            usage=usage,
            parsed=bool(self.options or arguments or self.commands),
        )


def _echoes(text: str, flag: str) -> bool:
    """Whether a tool's "help" is only the flag it was given back (a tool without ``--help`` that prints its input).

    >>> _echoes("--help", "--help"), _echoes("Usage: tool [FILE]", "--help")
    (True, False)
    """
    return text.split() == [flag]


#: what the ``--help`` probe keeps of a tool's help text
HELP_BYTES = 1024 * 1024


@dataclass(frozen=True)
class HelpProbe:
    """What one run of the ``--help`` probe gave: the help text ("" when the tool answered without one), or why it
    gave no answer at all (``failed``: it was killed, ran past its time, or could not be started)."""

    text: str = ""
    failed: str = ""


#: an exit status above this says the program was killed by a signal (a shell's and bubblewrap's ``128 + N``)
_SIGNALLED = 128
#: signals a program's own fault raises (a crash on ``--help`` is its answer, the same every time); any other
#: came from outside (a kill, a time limit) and says nothing of the tool
_OWN = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGTRAP})


def _no_answer(returncode: int, out: bytes, err: bytes) -> str:
    """Why a probe that ended with ``returncode`` gave no answer ("" when it did, help or not)."""
    if returncode < 0 or (_SIGNALLED < returncode <= _SIGNALLED + 64 and not out.strip()):
        number = -returncode if returncode < 0 else returncode - 128
        if number in _OWN:
            return ""
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"was killed ({name})"
    if err.startswith(b"bwrap: "):  # the sandbox's own words: the tool never ran
        return f"could not be started in the sandbox ({err.decode('utf-8', 'replace').strip()[:200]})"
    return ""


def probe_help(binary: Path, store_path: Path | None = None, timeout: float = 10.0) -> HelpProbe:
    """One run of the probe: the tool's ``--help`` (else ``-h``) text, in the sandbox; see :func:`help_of`."""
    confinement = Confinement(binary, store_path if store_path is not None else Path(binary).parent)
    try:
        for flag in ("--help", "-h"):
            try:
                proc = spawn(
                    confinement.command([str(binary), flag], timeout),
                    stdin=True,
                    cwd=confinement.scratch,
                    env=confinement.env(),
                )
            except OSError as exc:
                return HelpProbe(failed=f"could not be started ({exc.strerror or exc})")
            exchange = Exchange(proc, stdout_cap=HELP_BYTES, stderr_cap=HELP_BYTES, stop_at_cap=False)
            try:
                out, err = exchange.run(b"", timeout)
            except subprocess.TimeoutExpired:
                exchange.abandon()
                return HelpProbe(failed=f"ran past its time limit of {timeout:g} s")
            except BaseException:
                exchange.abandon()
                raise
            why = _no_answer(proc.returncode or 0, out, err)
            if why:
                return HelpProbe(failed=why)
            text = (out or err).decode("utf-8", "replace").strip()
            if proc.returncode == 0 and _LETTERS.search(strip_sequences(text)) and not _echoes(text, flag):
                return HelpProbe(text)  # a help says something in words (qrencode draws --help as a QR code: no help)
        return HelpProbe()
    finally:
        confinement.close()


def help_of(
    binary: Path,
    store_path: Path | None = None,
    timeout: float = 10.0,
    *,
    name: str = "",
    deadline: Deadline | None = None,
) -> str:
    """The tool's ``--help`` (else ``-h``) text, run in the sandbox: the probe runs without being asked for.

    The store entry is visible read-only, a scratch dir is the only writable
    place, and the environment is the sandbox's allowlist: the probe sees no
    secret and no file of the user's.

    What the help says decides how a call passes its input (standard input or
    an argument), so a probe that got no answer (killed, past its time, not
    started) is never taken for a tool without help: it is run once more,
    with twice the time, and a second failure is a
    :class:`~flakebot_magic.errors.ToolError` saying so (nothing is kept: the
    next call asks again). ``""``: the tool answered, without help.

    ``deadline``: the first call's, which the probe is part of: each run ends by it too, and a probe cut short
    by it is a :class:`~flakebot_magic.errors.ToolError` that names the call's limit (nothing is kept).
    """
    who = name or Path(binary).name
    probe = HelpProbe(failed="did not run")
    for limit in (timeout, timeout * 2):
        if deadline is not None and deadline.left() <= 0:
            break
        probe = probe_help(binary, store_path, limit if deadline is None else deadline.wait(limit))
        if not probe.failed:
            return probe.text
    if deadline is not None and deadline.expired:
        raise ToolError(
            f"{who} was not run: flakebot asks a tool for its --help first (it says whether the tool reads standard "
            f"input, and so how a call passes its input), and the probe got no answer within {deadline}. Nothing "
            f"was guessed or kept: call it again with a larger timeout=..., or read {who}.help first (its probe has "
            "a limit of its own).",
            returncode=None,
        )
    raise ToolError(
        f"{who} was not run: flakebot asks a tool for its --help first (it says whether the tool reads standard "
        f"input, and so how a call passes its input), and the probe {probe.failed}, twice. Nothing was guessed: "
        f"call it again; if this persists, {typed('doctor')} checks that each tool can be read and run.",
        returncode=None,
    )
