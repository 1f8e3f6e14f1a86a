"""What cargo says, parsed once: rustc's JSON diagnostics and libtest's text output.

One parser per format, used by the build stage and the edit loop alike:
:func:`parse_cargo_messages` reads ``--message-format=json`` lines into
:class:`Diagnostic` objects, executables and artifact records;
:func:`parse_diagnostic_line` reads the bare diagnostics rustdoc prints on
cargo's standard error when it builds a crate for its doc tests
(``{"$message_type":"diagnostic",...}``, rustc's JSON without cargo's
envelope), and :func:`readable` renders any such line as the text rustc
would print, so that no raw JSON line reaches a message, the log or the
model; :func:`parse_test_output` reads libtest's lines into a
:class:`TestReport`, and :func:`parse_test_list` what ``--list`` prints.

Cargo's JSON is not trusted about paths: a build script or proc macro can
write to cargo's own stdout (``/proc/<cargo pid>/fd/1``) and forge a
``compiler-artifact``. A binary is believed only when its name matches
:data:`BINARY_NAME` and, given the target directory, its executable is a
regular file whose real path lies inside it (:func:`untrusted_artifact`). A
``compiler-message`` not in the shape cargo writes is treated as plain text.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..host.fsutil import load_json

__all__ = [
    "BINARY_NAME",
    "MAX_FAILURE_LINES",
    "Diagnostic",
    "Suggestion",
    "TestReport",
    "actionable",
    "parse_cargo_messages",
    "parse_diagnostic_line",
    "parse_test_list",
    "parse_test_output",
    "readable",
    "untrusted_artifact",
]

#: what a binary's name may be: it becomes a file name in the store and a command
BINARY_NAME = re.compile(r"[A-Za-z0-9_-]+")
#: lines of one failing test's captured output kept in a :class:`TestReport`
MAX_FAILURE_LINES = 20


@dataclass(frozen=True)
class Suggestion:
    """A machine-applicable fix rustc offers: replace bytes ``byte_start..byte_end`` of ``file``."""

    file: str
    byte_start: int
    byte_end: int
    replacement: str
    message: str
    line: int


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message: where, what, rustc's rendering, and what the model needs to act on it.

    ``notes`` are the children (help, note) with their suggested replacements
    shown; ``suggestions`` are the machine-applicable ones among those.
    """

    level: str
    message: str
    code: str | None = None
    file: str | None = None
    line: int | None = None
    column: int | None = None
    rendered: str = ""
    target: str = ""
    label: str = ""
    notes: tuple[str, ...] = ()
    suggestions: tuple[Suggestion, ...] = ()

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file else ""
        code = f"[{self.code}]" if self.code else ""
        return f"{where}{self.level}{code}: {self.message}"

    @property
    def key(self) -> tuple[str, str, str]:
        """What "the same error" means across check runs (line numbers left out)."""
        return (self.code or "", self.message, self.file or "")

    def headline(self) -> str:
        code = f"[{self.code}]" if self.code else ""
        where = f" {self.file}:{self.line}:{self.column}" if self.file else ""
        return f"{self.level}{code}{where}: {self.message}"


@dataclass
class TestReport:
    """What ``cargo test`` said: counts over all test binaries and doc tests.

    ``output`` holds each failing test's captured output (its first
    :data:`MAX_FAILURE_LINES` lines).
    """

    __test__ = False

    passed: int = 0
    failed: int = 0
    ignored: int = 0
    failures: list[str] = field(default_factory=list)
    suites: int = 0
    output: dict[str, list[str]] = field(default_factory=dict)
    #: every test libtest named (passed, failed or ignored), as ``N::name``: N is its test binary's place in the
    #: run (libtest's ``running N tests`` lines; doc tests last), so two runs of one crate compare by name
    ran: list[str] = field(default_factory=list)
    #: each test's result by the full path libtest printed (``dup::can_dup``): ``ok``, ``FAILED`` or ``ignored``;
    #: a name reported twice keeps ``FAILED`` (meant for one test binary's output: names are unique only there)
    outcomes: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failed == 0


def untrusted_artifact(name: object, executable: object, target_dir: Path | None) -> str:
    """Why a ``compiler-artifact``'s binary is refused, or ``""`` when it may be deployed.

    ``name`` must match :data:`BINARY_NAME`. With ``target_dir``, the
    executable must be a regular file (not a symlink) whose real path is
    inside ``target_dir``, itself no symlink.
    """
    if not isinstance(name, str) or not BINARY_NAME.fullmatch(name):
        return f"the binary name {str(name)[:80]!r} is not a plain name ({BINARY_NAME.pattern})"
    if not isinstance(executable, str) or not executable:
        return f"the executable of {name!r} is not a path"
    if target_dir is None:
        return ""
    root = os.path.abspath(target_dir)
    if os.path.islink(root):
        return f"the target directory {root} is a symlink"
    real_root = os.path.realpath(root)
    path = os.path.abspath(executable)
    real = os.path.realpath(path)
    if os.path.commonpath([real, real_root]) != real_root or real == real_root:
        return f"the executable {executable[:200]!r} of {name!r} is outside the target directory {root}"
    try:
        info = os.lstat(path)
    except OSError:
        return f"the executable {executable[:200]!r} of {name!r} does not exist"
    if not stat.S_ISREG(info.st_mode):
        return f"the executable {executable[:200]!r} of {name!r} is not a regular file"
    return ""


def parse_cargo_messages(
    lines: Iterable[str],
    *,
    target_dir: Path | None = None,
    refused: list[str] | None = None,
    artifacts: list[dict[str, Any]] | None = None,
) -> tuple[list[Diagnostic], dict[str, Path], list[str]]:
    """Split cargo's stdout into diagnostics, executables by target name, and other lines.

    Every executable passes :func:`untrusted_artifact` (with ``target_dir``,
    its path is checked too); why each refused one was refused is appended
    to ``refused``. A refused message never replaces an accepted one. Every
    ``compiler-artifact`` record is appended to ``artifacts`` when given.

    Examples
    --------
    >>> line = '{"reason": "compiler-message", "message": {"level": "warning", "message": "unused"}}'
    >>> [d.headline() for d in parse_cargo_messages([line, "Compiling x"])[0]]
    ['warning: unused']
    """
    diagnostics: list[Diagnostic] = []
    executables: dict[str, Path] = {}
    other: list[str] = []
    for line in lines:
        if not line.startswith("{"):
            other.append(line)
            continue
        try:
            message: Any = load_json(line)
        except ValueError:
            other.append(line)
            continue
        reason = message.get("reason") if isinstance(message, dict) else None
        if reason == "compiler-message":
            try:
                diagnostics.append(_diagnostic(message))
            except (AttributeError, TypeError, IndexError, KeyError):  # not the shape cargo writes: forged
                other.append(line)
        elif reason == "compiler-artifact":
            if artifacts is not None:
                artifacts.append(message)
            if not message.get("executable"):
                continue
            target = message.get("target")
            target = target if isinstance(target, dict) else {}
            profile = message.get("profile")
            kinds = target.get("kind")
            if isinstance(kinds, list) and "bin" in kinds and not (isinstance(profile, dict) and profile.get("test")):
                why = untrusted_artifact(target.get("name"), message["executable"], target_dir)
                if why:
                    if refused is not None:
                        refused.append(why)
                    continue
                executables[target["name"]] = Path(message["executable"])
    return diagnostics, executables, other


def _diagnostic(record: dict[str, Any]) -> Diagnostic:
    inner = record.get("message", {})
    spans = inner.get("spans") or []
    primary = next((s for s in spans if s.get("is_primary")), spans[0] if spans else None)
    notes: list[str] = []
    suggestions: list[Suggestion] = []
    for child in inner.get("children") or []:
        child_text = child.get("message", "")
        replacements = [s for s in child.get("spans") or [] if s.get("suggested_replacement") is not None]
        shown = child_text
        if replacements:
            shown += ": " + " / ".join(f"`{s['suggested_replacement'].strip()}`" for s in replacements[:2])
        notes.append(f"{child.get('level', 'note')}: {shown}")
        for span in replacements:
            if span.get("suggestion_applicability") == "MachineApplicable":
                suggestions.append(
                    Suggestion(
                        span["file_name"],
                        span["byte_start"],
                        span["byte_end"],
                        span["suggested_replacement"],
                        child_text,
                        span.get("line_start", 0),
                    )
                )
    code = inner.get("code") or {}
    return Diagnostic(
        level=inner.get("level", "error"),
        message=inner.get("message", ""),
        code=code.get("code") if isinstance(code, dict) else None,
        file=primary.get("file_name") if primary else None,
        line=primary.get("line_start") if primary else None,
        column=primary.get("column_start") if primary else None,
        rendered=inner.get("rendered") or "",
        target=(record.get("target") or {}).get("name", ""),
        label=(primary.get("label") or "") if primary else "",
        notes=tuple(notes),
        suggestions=tuple(suggestions),
    )


def parse_diagnostic_line(line: str) -> Diagnostic | None:
    r"""One of rustdoc's bare JSON diagnostics as a :class:`Diagnostic`; None for any other line.

    Examples
    --------
    >>> line = '{"$message_type":"diagnostic","message":"unused","level":"warning","rendered":"warning: unused\\n"}'
    >>> parse_diagnostic_line(line).rendered
    'warning: unused\n'
    >>> parse_diagnostic_line("test a ... ok") is None
    True
    """
    if not line.startswith('{"$message_type"'):
        return None
    try:
        message = load_json(line)
        if not isinstance(message, dict) or message.get("$message_type") != "diagnostic":
            return None
        return _diagnostic({"message": message})
    except (ValueError, AttributeError, TypeError, IndexError, KeyError):
        return None


def readable(lines: Iterable[str]) -> list[str]:
    r"""``lines`` with each JSON diagnostic (rustdoc's bare ones, cargo's ``compiler-message``) replaced by
    the lines of its rendered text, as rustc prints it; other lines kept.

    Examples
    --------
    >>> readable(['{"$message_type":"diagnostic","message":"m","level":"error","rendered":"error: m\\n  --> a.rs"}', "x"])
    ['error: m', '  --> a.rs', 'x']
    """
    out: list[str] = []
    for line in lines:
        found = parse_diagnostic_line(line)
        if found is None and line.startswith('{"reason":"compiler-message"'):
            parsed, _, _ = parse_cargo_messages([line])
            found = parsed[0] if parsed else None
        if found is None:
            out.append(line)
        else:
            out += (found.rendered.rstrip() or str(found)).splitlines()
    return out


_SUMMARY = re.compile(
    r"^(aborting due to|could not compile|\d+ warnings? emitted|warning: \d+ warnings?|For more information about)"
)


def actionable(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    """The diagnostics worth acting on: rustc's summary lines dropped, each message once.

    Build and test both report the same error; it is kept once (by level,
    code, message and position).
    """
    kept: list[Diagnostic] = []
    seen: set[tuple[Any, ...]] = set()
    for d in diagnostics:
        if _SUMMARY.match(d.message):
            continue
        identity = (d.level, d.code, d.message, d.file, d.line, d.column)
        if identity not in seen:
            seen.add(identity)
            kept.append(d)
    return kept


_RESULT = re.compile(r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored")
_FAILED_TEST = re.compile(r"^test (.+?) \.\.\. FAILED$")
_FAILURE_HEAD = re.compile(r"^---- (.+?) stdout ----$")
_RUNNING = re.compile(r"^running \d+ tests?$")
_TEST_LINE = re.compile(r"^test (.+?) \.\.\. (ok|FAILED|ignored)")
_LISTED = re.compile(r"^(.+): test$")


def parse_test_output(lines: Iterable[str]) -> TestReport:
    """Sum libtest's ``test result:`` lines; collect every test's name, the failing ones' and their captured output.

    Examples
    --------
    >>> report = parse_test_output(["test a ... FAILED", "test result: FAILED. 2 passed; 1 failed; 0 ignored"])
    >>> (report.passed, report.failed, report.failures, report.ran, report.outcomes)
    (2, 1, ['a'], ['0::a'], {'a': 'FAILED'})
    """
    report = TestReport()
    captured: list[str] | None = None
    binary = 0
    for line in lines:
        if _RUNNING.match(line):
            binary += 1
        named = _TEST_LINE.match(line)
        if named:
            report.ran.append(f"{binary}::{named.group(1)}")
            path = named.group(1).removesuffix(" - should panic")  # as --list and the ---- heads name it
            if report.outcomes.get(path) != "FAILED":
                report.outcomes[path] = named.group(2)
        head = _FAILURE_HEAD.match(line)
        if head:
            captured = report.output.setdefault(head.group(1), [])
            continue
        if captured is not None:
            if line.strip() in ("failures:", "successes:") or line.startswith("test result:"):
                captured = None
            elif len(captured) < MAX_FAILURE_LINES:
                captured.append(line)
        result = _RESULT.match(line)
        if result:
            report.suites += 1
            report.passed += int(result.group(2))
            report.failed += int(result.group(3))
            report.ignored += int(result.group(4))
            continue
        failed = _FAILED_TEST.match(line)
        if failed and failed.group(1) not in report.failures:
            report.failures.append(failed.group(1))
    return report


def parse_test_list(lines: Iterable[str]) -> list[str]:
    """The tests a libtest binary's ``--list`` names (``dup::can_dup: test``), in its order; benchmarks left out.

    Examples
    --------
    >>> parse_test_list(["dup::same: test", "other::same: test", "b: bench", "", "2 tests, 1 benchmark"])
    ['dup::same', 'other::same']
    """
    return [match.group(1) for line in lines if (match := _LISTED.match(line))]
