"""Stage 2b: the edit loop. A language model edits the workspace; cargo proves each step; code keeps the score.

The model works through seven tools (``list_files``, ``read_file``,
``write_file``, ``replace_in_file``, ``delete_file``, ``run_checks``,
``finish``; see ``docs/edit-protocol.md``). On ``run_checks`` and ``finish``
flakebot runs a *check run*: ``cargo build``, ``cargo test`` and, when
installed, ``cargo clippy`` (information only), all in the sandbox.

What code, not the prompt, decides:

* **Containment**: model paths resolve inside the workspace; ``..``,
  absolute paths, symlinks that leave it, ``.git/``, ``.cargo/``,
  ``rust-toolchain*``, ``target/`` and (unless allowed) ``build.rs`` are
  refused, and so is a Cargo.toml that names a build script or a path outside.
* **Compiler fixes first**: rustc's machine-applicable suggestions for errors
  are applied before a model call is spent on them.
* **History**: every check run is a commit on the workspace branch whose
  message holds the diagnostics summary.
* **Ratchet**: the number of passing tests never goes down, and no protected
  test (one that existed at the best commit) may be deleted, emptied or
  ``#[ignore]``d. A change that does either is reverted to the best commit,
  and the model is told why.
* **Budget**: at most ``max_iterations`` check runs asked for by the model,
  a token budget, and an early stop when two check runs in a row fail the
  same way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import tomlkit

from ..cargo import Cargo
from ..errors import BudgetExhausted, EditError, ModelError, PolicyError, StageTimeout
from ..events import EventBus, IterationResult
from ..fsutil import UnsafePath, atomic_write, check_no_symlinks, load_toml
from ..git import Git
from ..policy import REFUSED_DIRS, TOOLCHAIN_FILES, Baseline, Violation, check_manifest, check_tree
from ..registry.base import CrateCandidate
from .build import TEST_ENV, TestReport, parse_test_output

if TYPE_CHECKING:
    from ..model import ModelConfig

__all__ = [
    "KINDS",
    "TOOLS",
    "TOOL_NAMES",
    "CheckRun",
    "CompilerMessage",
    "EditLoop",
    "EditOutcome",
    "EditState",
    "PathRefused",
    "ToolContract",
    "contain",
    "read_contract",
    "scan_tests",
]

#: the kinds of tool the contract may name (served by the clients)
KINDS = ("cli", "mcp", "http")
TOOL_NAMES = ("list_files", "read_file", "write_file", "replace_in_file", "delete_file", "run_checks", "finish")

#: where the edit sessions of a workspace are recorded
STATE_FILE = "flakebot-edit.json"
#: the loop's check runs share the test stage's target dir, so the final test run is fresh
LOOP_TARGET = ("target", "flakebot-test")
#: never committed: build outputs (cargo's, and nix's result links)
_NOT_SOURCE = ("target", "result", "result-*")

MAX_REPORT = 6000  # characters of one check-run report sent to the model
MAX_ERRORS = 6
MAX_WARNINGS = 6
MAX_FAILURE_LINES = 20
MAX_READ_LINES = 800
MAX_READ_CHARS = 40_000
MAX_WRITE_BYTES = 1_000_000
MAX_LISTED = 400
MAX_STREAM_RETRIES = 3
#: a model reply (streamed or not) is stopped past this many bytes or seconds and counts as unusable
MAX_REPLY_BYTES = 4 * 1024 * 1024
MAX_REPLY_SECONDS = 300.0
#: the most of one file read into the kernel (read_file shows less; the ratchet and prompt read this much)
MAX_FILE_READ = 8 * 1024 * 1024
MAX_TEXT_REPLIES = 3
FIX_ROUNDS = 3

_P = {"type": "string", "description": "a path relative to the crate root, e.g. src/main.rs"}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files under a directory of the crate (recursively), with their line counts.",
            "parameters": {
                "type": "object",
                "properties": {"path": {**_P, "description": "a directory relative to the crate root; '.' for all"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file, or the lines start_line..end_line of it (1-based, inclusive).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": _P,
                    "start_line": {"type": "integer", "minimum": 1},
                    "end_line": {"type": "integer", "minimum": 1},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or overwrite a file with the full content given.",
            "parameters": {
                "type": "object",
                "properties": {"path": _P, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "replace_in_file",
            "description": "Replace the exact text `search` with `replace` in a file. "
            "`search` must occur exactly once; include surrounding lines to make it unique.",
            "parameters": {
                "type": "object",
                "properties": {"path": _P, "search": {"type": "string"}, "replace": {"type": "string"}},
                "required": ["path", "search", "replace"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "delete_file",
            "description": "Delete a file.",
            "parameters": {"type": "object", "properties": {"path": _P}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_checks",
            "description": "Run cargo build, cargo test and cargo clippy on the crate as it is now; "
            "get the compiler's diagnostics and the test results back. Each call uses one iteration.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Run the checks one last time and end the session if they pass and the tool "
            "contract is met. Give a short summary of what the tool does and how to call it.",
            "parameters": {
                "type": "object",
                "properties": {"summary": {"type": "string"}},
                "required": ["summary"],
            },
        },
    },
]


# -- containment --------------------------------------------------------------

class PathRefused(Exception):
    """A model-chosen path or edit that flakebot refuses; the message goes back to the model."""


_REFUSED_DIRS = REFUSED_DIRS  # one rule set: flakebot_magic.policy


def contain(root: Path, path: str, *, write: bool = False, allow_build_scripts: bool = False) -> Path:
    """The absolute path of ``path`` inside ``root``, or :class:`PathRefused` saying why not.

    Examples
    --------
    >>> contain(Path("/ws"), "../etc/passwd")  # doctest: +SKIP
    Traceback (most recent call last):
    PathRefused: '../etc/passwd' leaves the crate: '..' is not allowed
    """
    if not isinstance(path, str) or not path.strip():
        raise PathRefused("the path is empty; give a path relative to the crate root, e.g. src/main.rs")
    if "\0" in path:
        raise PathRefused(f"{path!r} contains a NUL byte")
    if path.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", path):
        raise PathRefused(f"{path!r} is absolute: give a path relative to the crate root, e.g. src/main.rs")
    parts = [p for p in PurePosixPath(path.replace("\\", "/")).parts if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused(f"{path!r} leaves the crate: '..' is not allowed")
    for part in parts:
        if part in _REFUSED_DIRS:
            raise PathRefused(f"{path!r} is inside {part}/, which is off limits: {_REFUSED_DIRS[part]}")
    root = root.resolve()
    target = root.joinpath(*parts) if parts else root
    resolved = target.resolve()
    if resolved != root and root not in resolved.parents:
        raise PathRefused(f"{path!r} resolves to {resolved}, outside the crate (a symlink leaves it)")
    if write:
        if not parts:
            raise PathRefused("give a file path, not the crate root")
        if parts[0] == "target":
            raise PathRefused(f"{path!r} is inside target/, cargo's build output")
        name = parts[-1]
        if name in TOOLCHAIN_FILES:
            raise PathRefused(f"{path!r}: the toolchain is not the model's to choose")
        if name == "build.rs" and not allow_build_scripts:
            raise PathRefused(
                f"{path!r}: build scripts run arbitrary code at build time and are refused "
                "(the user can allow them with --allow-build-scripts)"
            )
        if target.is_symlink():
            raise PathRefused(f"{path!r} is a symlink; write the file it points to instead")
    return target


def _check_manifest(
    root: Path,
    text: str,
    *,
    allow_build_scripts: bool,
    baseline: Baseline | None = None,
    manifest: Path | None = None,
) -> None:
    """Refuse a manifest the build policy refuses (a build script unless allowed, a path outside, ...).

    The rules are :func:`flakebot_magic.policy.check_manifest`'s: the same
    ones checked on disk after every check run.
    """
    try:
        doc = load_toml(text)
    except ValueError as exc:
        raise PathRefused(f"Cargo.toml is not valid TOML: {exc}") from None
    found = check_manifest(
        root, manifest or root / "Cargo.toml", doc, allow_build_scripts=allow_build_scripts, baseline=baseline
    )
    if found:
        raise PathRefused("; ".join(str(v) for v in found))


# -- the tool contract ---------------------------------------------------------

@dataclass(frozen=True)
class ToolContract:
    """``[package.metadata.flakebot]``: what kind of tool the crate is, and which binary to deploy."""

    kind: str
    bin: str

    def __str__(self) -> str:
        return f'kind = "{self.kind}", bin = "{self.bin}"'


def read_contract(manifest: Path) -> tuple[ToolContract | None, str]:
    """The contract in ``manifest``, and "" or what is wrong with it."""
    try:
        doc = _parse_toml(_read_text(manifest, 1 << 20))
    except Exception as exc:  # an unreadable manifest, whatever the reason, is a contract problem
        return None, f"Cargo.toml cannot be read: {exc}"
    meta = ((doc.get("package") or {}).get("metadata") or {}).get("flakebot")
    if not isinstance(meta, dict):
        return None, (
            "Cargo.toml has no [package.metadata.flakebot] table; add one with "
            'kind = "cli" and bin = "<the binary target to deploy>"'
        )
    kind, binary = meta.get("kind"), meta.get("bin")
    if kind not in KINDS:
        return None, f"[package.metadata.flakebot] kind must be one of {', '.join(KINDS)}, not {kind!r}"
    if not isinstance(binary, str) or not binary:
        return None, "[package.metadata.flakebot] needs bin = \"<binary target name>\""
    return ToolContract(kind, binary), ""


def _parse_toml(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):  # tomllib is ten times faster than tomlkit, and this runs every check
        import tomllib

        return tomllib.loads(text)
    data: dict[str, Any] = tomlkit.parse(text).unwrap()
    return data


# -- tests in the source: what the ratchet protects -------------------------------

_BLANKABLE = re.compile(
    r'//[^\n]*|/\*.*?\*/|b?r(#*)".*?"\1|b?"(?:\\.|[^"\\])*"|b?\'(?:\\.|[^\'\\])\'',
    re.S,
)
_TEST_FN = re.compile(
    r"#\[\s*(?:[A-Za-z_][\w]*::)*test\s*(?:\([^)]*\))?\s*\]"  # #[test], #[tokio::test(...)]
    r"((?:\s*#\[[^\]]*\])*)"  # more attributes: #[ignore], #[should_panic]
    r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+([A-Za-z_]\w*)"
)
_EMPTY_BODIES = {"", "()", "return", "Ok(())", "returnOk(())"}


def _blank(text: str) -> str:
    """Comments and string literals replaced by spaces (same length), so braces can be counted."""
    return _BLANKABLE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


@dataclass(frozen=True)
class TestFunction:
    """A ``#[test]`` function found in the source."""

    __test__ = False

    name: str
    file: str
    empty: bool
    ignored: bool


def scan_tests(root: Path) -> list[TestFunction]:
    """Every ``#[test]`` function in the crate's ``.rs`` files (not ``target/``)."""
    found: list[TestFunction] = []
    for path in sorted(_rust_files(root)):
        try:
            text = _blank(_read_text(path))
        except OSError:
            continue
        for match in _TEST_FN.finditer(text):
            attributes, name = match.group(1), match.group(2)
            start = text.find("{", match.end())
            if start < 0:
                continue
            depth, end = 0, start
            for end in range(start, len(text)):
                if text[end] == "{":
                    depth += 1
                elif text[end] == "}":
                    depth -= 1
                    if depth == 0:
                        break
            body = re.sub(r"[\s;]", "", text[start + 1 : end])
            found.append(
                TestFunction(
                    name=name,
                    file=path.relative_to(root).as_posix(),
                    empty=body in _EMPTY_BODIES,
                    ignored="ignore" in attributes,
                )
            )
    return found


def _rust_files(root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", "target")]
        for name in filenames:
            if name.endswith(".rs"):
                yield Path(dirpath) / name


def _ratchet_violations(protected: list[TestFunction], now: list[TestFunction]) -> list[str]:
    """What happened to protected tests: deleted, emptied, or newly ignored."""
    have = Counter(t.name for t in now)
    wanted = Counter(t.name for t in protected)
    problems = [f"deleted test `{name}`" for name, count in sorted(wanted.items()) if have[name] < count]
    live = {t.name: t for t in now}
    for test in protected:
        current = live.get(test.name)
        if current is None:
            continue
        if current.empty and not test.empty:
            problems.append(f"emptied test `{test.name}` ({current.file})")
        if current.ignored and not test.ignored:
            problems.append(f"put #[ignore] on test `{test.name}` ({current.file})")
    return problems


# -- compiler output -------------------------------------------------------------

@dataclass(frozen=True)
class Suggestion:
    file: str
    byte_start: int
    byte_end: int
    replacement: str
    message: str
    line: int


@dataclass(frozen=True)
class CompilerMessage:
    """One rustc diagnostic, with what the model needs to act on it."""

    level: str
    message: str
    code: str | None = None
    file: str | None = None
    line: int | None = None
    column: int | None = None
    label: str = ""
    notes: tuple[str, ...] = ()
    suggestions: tuple[Suggestion, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.code or "", self.message, self.file or "")

    def headline(self) -> str:
        code = f"[{self.code}]" if self.code else ""
        where = f" {self.file}:{self.line}:{self.column}" if self.file else ""
        return f"{self.level}{code}{where}: {self.message}"


_NOISE = re.compile(r"^(aborting due to|could not compile|\d+ warnings? emitted|warning: \d+ warnings?|For more information about)")


def parse_compiler_messages(stdout: str) -> tuple[list[CompilerMessage], dict[str, Path], list[dict[str, Any]]]:
    """rustc diagnostics, executables by name, and compiler-artifact records from cargo's JSON lines."""
    messages: list[CompilerMessage] = []
    executables: dict[str, Path] = {}
    artifacts: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        reason = record.get("reason")
        if reason == "compiler-artifact":
            artifacts.append(record)
            target = record.get("target", {})
            if record.get("executable") and "bin" in target.get("kind", []) and not record.get("profile", {}).get("test"):
                executables[target["name"]] = Path(record["executable"])
            continue
        if reason != "compiler-message":
            continue
        inner = record.get("message") or {}
        text = inner.get("message", "")
        if _NOISE.match(text):
            continue
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
                            span["file_name"], span["byte_start"], span["byte_end"],
                            span["suggested_replacement"], child_text, span.get("line_start", 0),
                        )
                    )
        code = inner.get("code") or {}
        message = CompilerMessage(
            level=inner.get("level", "error"),
            message=text,
            code=code.get("code") if isinstance(code, dict) else None,
            file=primary.get("file_name") if primary else None,
            line=primary.get("line_start") if primary else None,
            column=primary.get("column_start") if primary else None,
            label=(primary.get("label") or "") if primary else "",
            notes=tuple(notes),
            suggestions=tuple(suggestions),
        )
        identity = (message.level, message.code, message.message, message.file, message.line, message.column)
        if identity not in seen:  # build and test both report the same error
            seen.add(identity)
            messages.append(message)
    return messages, executables, artifacts


_PASSED = re.compile(r"^test (.+?) \.\.\. ok$")
_FAILURE_HEAD = re.compile(r"^---- (.+?) stdout ----$")


def _test_details(lines: list[str]) -> tuple[set[str], dict[str, list[str]]]:
    """Names of passing tests, and each failing test's captured output."""
    passed: set[str] = set()
    output: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        ok = _PASSED.match(line)
        if ok:
            passed.add(ok.group(1))
        head = _FAILURE_HEAD.match(line)
        if head:
            current = output.setdefault(head.group(1), [])
            continue
        if current is not None:
            if line.strip() in ("failures:", "successes:") or line.startswith("test result:"):
                current = None
            elif len(current) < MAX_FAILURE_LINES:
                current.append(line)
    return passed, output


# -- check runs ---------------------------------------------------------------------

@dataclass
class CheckRun:
    """One check run: cargo's verdict, what the ratchet did, and the commit that records it."""

    run: int
    iteration: int
    built: bool = False
    errors: list[CompilerMessage] = field(default_factory=list)
    warnings: list[CompilerMessage] = field(default_factory=list)
    clippy: list[CompilerMessage] = field(default_factory=list)
    tests: TestReport | None = None
    failure_output: dict[str, list[str]] = field(default_factory=dict)
    binaries: dict[str, Path] = field(default_factory=dict)
    contract: ToolContract | None = None
    contract_problem: str = ""
    note: str = ""
    auto_fixed: list[str] = field(default_factory=list)
    reverted: bool = False
    reason: str = ""
    commit: str = ""
    #: the best commit a reverted run went back to
    reverted_to: str = ""
    session: int = 1
    #: seconds spent inside cargo, and in the whole run (cargo + flakebot); for the last
    #: run of an iteration, over the whole iteration (ratchet scan, fixes, commits, report)
    cargo_seconds: float = 0.0
    seconds: float = 0.0
    #: dependency compilation units cargo compiled (not fresh) in this run
    dependency_units: int = 0
    fixable: list[Suggestion] = field(default_factory=list)
    #: what the build policy refused on disk after this run (then it is reverted)
    policy: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return self.tests.passed if self.tests else 0

    @property
    def failed(self) -> int:
        return self.tests.failed if self.tests else 0

    @property
    def tests_ran(self) -> bool:
        return self.tests is not None and not self.errors and not self.note

    @property
    def green(self) -> bool:
        return self.built and self.tests_ran and self.failed == 0 and not self.contract_problem and not self.reverted

    def signature(self) -> tuple[Any, ...]:
        """What "the same errors" means for the stuck check (line numbers left out)."""
        if self.reverted:
            return ("reverted", self.reason)
        return (
            tuple(sorted(e.key for e in self.errors)),
            tuple(sorted(self.tests.failures)) if self.tests else (),
            self.contract_problem,
            self.note,
        )

    def headline(self) -> str:
        if self.reverted:
            return f"REVERTED: {self.reason}"
        if self.note:
            return f"FAILED: {self.note.splitlines()[0]}"
        if self.errors:
            return f"{'tests do not compile' if self.built else 'build FAILED'}: {len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        tests = self.tests
        if tests is None:
            return "build ok; tests did not run"
        state = "green" if self.green else ("tests FAILED" if tests.failed else "contract NOT met")
        return f"{state}: {tests.passed} passed, {tests.failed} failed, {tests.ignored} ignored; {len(self.warnings)} warning(s)"

    def report(self, root: Path, *, best_passed: int, limit: int = MAX_REPORT) -> str:
        """The compact text the model gets back: errors with source, failing tests, clippy, contract."""
        out: list[str] = [f"Check run {self.run}: {self.headline()}"]
        if self.auto_fixed:
            out.append(f"(flakebot first applied {len(self.auto_fixed)} compiler suggestion(s) itself: " + "; ".join(self.auto_fixed[:5]) + ")")
        if self.reverted and self.policy:
            out.append(
                "After this check run the workspace held what flakebot does not build (written while cargo "
                "ran, by a test or a build script?):"
            )
            out += [f"  - {line}" for line in self.policy[:10]]
            out.append(
                f"It was reverted with git: the workspace is back at the best commit {self.reverted_to[:12]} "
                f"({best_passed} tests passing). Tests and build scripts must not write these files. "
                "Re-read the files you changed before editing them again."
            )
            return _cap("\n".join(out), limit)
        if self.reverted:
            out.append(
                "The change was reverted with git: the workspace is back at the best commit "
                f"{self.reverted_to[:12]} ({best_passed} tests passing). Passing tests may not go "
                "down, and existing tests may not be deleted, emptied or ignored. Re-read the files "
                "you changed before editing them again."
            )
            return _cap("\n".join(out), limit)
        if self.note:
            out.append(self.note)
        for message in self.errors[:MAX_ERRORS]:
            out.append("")
            out.extend(_render(message, root))
        if len(self.errors) > MAX_ERRORS:
            out.append(f"... and {len(self.errors) - MAX_ERRORS} more error(s)")
        if self.warnings and not self.errors:
            out.append("")
            out.append("Warnings:")
            out += [f"  {w.headline()}" for w in self.warnings[:MAX_WARNINGS]]
        if self.tests is not None and not self.errors:
            tests = self.tests
            out.append("")
            out.append(f"Tests: {tests.passed} passed, {tests.failed} failed, {tests.ignored} ignored (the best so far: {best_passed} passing).")
            for name in tests.failures[:5]:
                out.append(f"---- {name} ----")
                out += [f"  {line}" for line in self.failure_output.get(name, [])[:MAX_FAILURE_LINES]]
        if self.clippy:
            out.append("")
            out.append("Clippy (information, not required):")
            out += [f"  {c.headline()}" for c in self.clippy[:MAX_WARNINGS]]
        out.append("")
        out.append(f"Contract: {self.contract_problem or f'ok ({self.contract})'}")
        if self.green:
            out.append("All checks pass. Call finish(summary) if the tool does what was asked.")
        return _cap("\n".join(out), limit)

    def commit_message(self, root: Path) -> str:
        if self.iteration == 0:
            head = f"Check run 0 (baseline of edit session {self.session}): {self.headline()}"
        else:
            head = f"Check run {self.run} (session {self.session}, iteration {self.iteration}): {self.headline()}"
        body = [f"- {e.headline()}" for e in self.errors[:MAX_ERRORS]]
        if self.tests is not None and self.tests.failures:
            body += [f"- failing test: {name}" for name in self.tests.failures[:10]]
        if self.auto_fixed:
            body += [f"- applied compiler suggestion: {fix}" for fix in self.auto_fixed[:10]]
        if self.contract_problem and not self.errors:
            body.append(f"- contract: {self.contract_problem}")
        if self.note:
            body.append(f"- {self.note.splitlines()[0]}")
        return head + ("\n\n" + "\n".join(body) if body else "") + "\n"


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 60].rstrip() + f"\n... (cut: the report passed {limit} characters)"


def _render(message: CompilerMessage, root: Path) -> list[str]:
    lines = [message.headline()]
    if message.file and message.line:
        path = root / message.file
        try:
            inside = path.resolve().is_relative_to(root.resolve())
            source = _read_text(path.resolve()).splitlines() if inside else []
        except OSError:
            source = []
        for number in range(max(1, message.line - 2), min(len(source), message.line + 2) + 1):
            mark = ">" if number == message.line else " "
            lines.append(f"{mark}{number:>5} | {source[number - 1][:160]}")
    if message.label:
        lines.append(f"  label: {message.label}")
    lines += [f"  {note[:300]}" for note in message.notes[:3]]
    return lines


# -- the persisted sessions -----------------------------------------------------------

@dataclass
class EditState:
    """The edit sessions of one workspace (kept in ``.git/flakebot-edit.json``)."""

    sessions: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, workspace: Path) -> EditState:
        try:
            data = json.loads(_read_text(workspace / ".git" / STATE_FILE))
        except (OSError, ValueError):
            return cls()
        return cls(sessions=list(data.get("sessions", [])))

    @staticmethod
    def exists(workspace: Path) -> bool:
        return (workspace / ".git" / STATE_FILE).is_file()

    def save(self, workspace: Path) -> None:
        atomic_write(workspace / ".git" / STATE_FILE, json.dumps({"sessions": self.sessions}, indent=2), root=workspace)


@dataclass
class EditOutcome:
    """A finished edit session: a green workspace and what it took."""

    summary: str
    contract: ToolContract
    runs: list[CheckRun]
    iterations: int
    model_calls: int
    tokens: int
    head: str


# -- the loop -------------------------------------------------------------------

@dataclass
class _Reply:
    content: str
    tool_calls: list[dict[str, Any]]
    tokens: int


class _BrokenReply(Exception):
    """A reply that cannot be used as is (broken stream, bad JSON, empty); ask again."""


class EditLoop:
    """Runs one edit session on a forked workspace.

    Parameters
    ----------
    workspace
        The workspace (a git repository on the ``flakebot`` branch).
    client
        An ``openai.OpenAI`` (or anything with ``chat.completions.create``).
    model
        The model configuration (its name is sent; ``stream`` is honoured).
    cargo
        Runs cargo; pass a :class:`~flakebot_magic.sandbox.SandboxedCargo`.
    bus
        Receives :class:`~flakebot_magic.events.IterationResult` and log events.
    git
        The workspace's git (flakebot's identity).
    crate
        Where the workspace came from (for the prompt).
    """

    def __init__(
        self,
        workspace: Path,
        client: Any,
        model: ModelConfig,
        *,
        cargo: Cargo,
        bus: EventBus,
        git: Git,
        crate: CrateCandidate | None = None,
        max_iterations: int = 8,
        token_budget: int = 400_000,
        allow_build_scripts: bool = False,
        build_timeout: float = 900.0,
        test_timeout: float = 300.0,
        clippy: bool | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        max_reply_seconds: float = MAX_REPLY_SECONDS,
    ) -> None:
        self.root = workspace.resolve()
        self.client = client
        self.model = model
        self.cargo = cargo
        self.bus = bus
        self.git = git
        self.crate = crate
        self.max_iterations = max_iterations
        self.token_budget = token_budget
        self.allow_build_scripts = allow_build_scripts
        self.build_timeout = build_timeout
        self.test_timeout = test_timeout
        self.clippy = _clippy_available(cargo) if clippy is None else clippy
        self.runs: list[CheckRun] = []
        self.iterations = 0
        self.tokens = 0
        self.model_calls = 0
        self._run_number = 0
        self._best_commit = ""
        self._best_passed = 0
        self._protected: list[TestFunction] = []
        self._finished: str | None = None
        self._cargo_total = 0.0
        self._session = 1
        self.max_reply_bytes = max_reply_bytes
        self.max_reply_seconds = max_reply_seconds
        #: the crate as published (the fork's ``published`` tag): its own build script is allowed
        self._published = Baseline()

    # -- public -------------------------------------------------------------

    def run(self, request: str, *, follow_up: bool = False) -> EditOutcome:
        """Edit until the checks pass and the model finishes; raise :class:`EditError` otherwise."""
        state = EditState.load(self.root)
        self._session = len(state.sessions) + 1
        self._published = Baseline.from_git(self.git)
        found = self._policy()
        if found:  # before any cargo run; nothing good to go back to yet
            listed = "\n".join(f"  - {v}" for v in found[:20])
            raise PolicyError(
                f"The workspace holds what flakebot does not build, before the edit loop started:\n{listed}\n"
                "Fix or remove these files in the workspace, then run again.",
                violations=found, workspace=self.root,
            )
        baseline = self._baseline()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self._system_prompt(request, baseline, state, follow_up)},
            {"role": "user", "content": (f"Follow-up instructions for the existing tool: {request}" if follow_up else request)},
        ]
        text_replies = 0
        while self._finished is None:
            reply = self._complete(messages)
            if not reply.tool_calls:
                text_replies += 1
                if text_replies > MAX_TEXT_REPLIES:
                    raise EditError(
                        f"The model stopped using the tools ({MAX_TEXT_REPLIES + 1} replies in a row without a tool call). "
                        f"Its last words: {reply.content[:300]!r}",
                        diagnostics=self._last_report(), workspace=self.root, reason="no-tools",
                    )
                messages.append({"role": "assistant", "content": reply.content})
                messages.append({
                    "role": "user",
                    "content": "Reply with tool calls: edit the files, then call run_checks, "
                    "and finish(summary) once the checks pass and the contract is met.",
                })
                continue
            text_replies = 0
            messages.append({"role": "assistant", "content": reply.content or None, "tool_calls": reply.tool_calls})
            for call in reply.tool_calls:
                if self._finished is not None:
                    answer = "not run: finish ended the session"
                else:
                    answer = self._call(call)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": answer})
        self._record(state, request)
        last = self.runs[-1]
        assert last.contract is not None
        return EditOutcome(
            summary=self._finished, contract=last.contract, runs=self.runs, iterations=self.iterations,
            model_calls=self.model_calls, tokens=self.tokens, head=self.git.head(),
        )

    # -- the model ----------------------------------------------------------

    def _complete(self, messages: list[dict[str, Any]]) -> _Reply:
        problem = ""
        for attempt in range(MAX_STREAM_RETRIES + 1):
            if self.tokens >= self.token_budget:
                raise BudgetExhausted(
                    f"The token budget ({self.token_budget:,} tokens) is spent after {self.iterations} "
                    f"iteration(s) and the workspace is not green yet.{self._last_words()}",
                    diagnostics=self._last_report(), workspace=self.root, reason="tokens",
                )
            self.model_calls += 1
            try:
                reply = self._request(messages)
            except _BrokenReply as exc:
                problem = str(exc)
                self.bus.notice("edit", f"the model's reply was unusable ({problem}); nothing was applied, asking again", "warning")
                continue
            return reply
        raise ModelError(
            f"The model {self.model.describe()} sent {MAX_STREAM_RETRIES + 1} unusable replies in a row "
            f"(the last: {problem}). Nothing from them was applied. Try again, or another model.",
            workspace=self.root,
        )

    def _request(self, messages: list[dict[str, Any]]) -> _Reply:
        import httpx
        import openai

        prompt_estimate = sum(len(json.dumps(m)) for m in messages) // 4
        kwargs: dict[str, Any] = {"model": self.model.model, "messages": messages, "tools": TOOLS}
        deadline = time.monotonic() + self.max_reply_seconds
        try:
            if self.model.stream:
                stream = self.client.chat.completions.create(
                    **kwargs, stream=True, stream_options={"include_usage": True}
                )
                return self._read_stream(stream, prompt_estimate, deadline)
            raw = getattr(self.client.chat.completions, "with_streaming_response", None)
            if raw is not None:  # read the body in bounded pieces, not whole
                with raw.create(**kwargs) as http:
                    return self._read_body(http.iter_bytes(), prompt_estimate, deadline)
            response = self.client.chat.completions.create(**kwargs)
        except openai.APIStatusError as exc:
            raise ModelError(
                f"The model endpoint {self.model.base_url} answered HTTP {exc.status_code} "
                f"(after the SDK's retries): {str(exc)[:300]}. Check --model, --base-url and the key.",
                status=exc.status_code, workspace=self.root,
            ) from exc
        except openai.APIConnectionError as exc:
            raise ModelError(
                f"Cannot reach the model endpoint {self.model.base_url} (after the SDK's retries): {exc}.",
                workspace=self.root,
            ) from exc
        except ValueError as exc:  # a body that is not JSON
            raise _BrokenReply(f"malformed response: {exc}") from exc
        except httpx.HTTPError as exc:  # the body broke off mid-way (the SDK retries only the request)
            raise _BrokenReply(f"the reply broke mid-way: {type(exc).__name__}: {str(exc)[:200]}") from exc
        if not response.choices:
            raise _BrokenReply("a reply without choices")
        message = response.choices[0].message
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments or ""}}
            for c in message.tool_calls or []
        ]
        usage = response.usage
        tokens = usage.total_tokens if usage else prompt_estimate + len(message.content or "") // 4
        return self._accept(message.content or "", calls, tokens)

    def _read_body(self, pieces: Iterable[bytes], prompt_estimate: int, deadline: float) -> _Reply:
        """A non-streamed reply, read in pieces within the byte and time caps; parsed as plain JSON."""
        body = bytearray()
        for piece in pieces:
            body += piece
            self._within_caps(len(body), deadline)
        try:
            data = json.loads(bytes(body))
            message = data["choices"][0]["message"] if data.get("choices") else None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise _BrokenReply(f"malformed response: {type(exc).__name__}: {str(exc)[:200]}") from exc
        if not isinstance(message, dict):
            raise _BrokenReply("a reply without choices")
        calls: list[dict[str, Any]] = []
        for c in message.get("tool_calls") or []:
            function = c.get("function") if isinstance(c, dict) else None
            if not isinstance(function, dict):
                continue
            calls.append({"id": str(c.get("id") or f"call_{len(calls)}"), "type": "function",
                          "function": {"name": str(function.get("name") or ""),
                                       "arguments": str(function.get("arguments") or "")}})
        text = message.get("content")
        content = text if isinstance(text, str) else ""
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        total = usage.get("total_tokens")
        tokens = total if isinstance(total, int) else prompt_estimate + len(content) // 4
        return self._accept(content, calls, tokens)

    def _within_caps(self, size: int, deadline: float) -> None:
        """Stop a reply past :data:`MAX_REPLY_BYTES` (``max_reply_bytes``) or its time limit."""
        if size > self.max_reply_bytes:
            raise _BrokenReply(
                f"the reply passed {self.max_reply_bytes:,} bytes and was stopped (a runaway or hostile endpoint?)"
            )
        if time.monotonic() > deadline:
            raise _BrokenReply(f"the reply took longer than {self.max_reply_seconds:g} s and was stopped")

    def _read_stream(self, stream: Any, prompt_estimate: int, deadline: float | None = None) -> _Reply:
        import httpx
        import openai

        if deadline is None:
            deadline = time.monotonic() + self.max_reply_seconds
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage_tokens = 0
        finished = False
        size = 0
        try:
            for chunk in stream:
                # bytes received so far (httpx counts them), else what the reply holds (text, tool calls)
                for choice in chunk.choices or []:
                    delta = choice.delta
                    size += len((delta.content or "").encode())
                    for piece in delta.tool_calls or []:
                        if piece.function is not None:
                            size += len((piece.function.name or "") + (piece.function.arguments or ""))
                received = getattr(getattr(stream, "response", None), "num_bytes_downloaded", None)
                self._within_caps(max(size, received if isinstance(received, int) else 0), deadline)
                if getattr(chunk, "usage", None):
                    usage_tokens = chunk.usage.total_tokens
                for choice in chunk.choices or []:
                    delta = choice.delta
                    if delta.content:
                        content.append(delta.content)
                    for piece in delta.tool_calls or []:
                        entry = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": []})
                        if piece.id:
                            entry["id"] = piece.id
                        if piece.function is not None:
                            if piece.function.name:
                                entry["name"] += piece.function.name
                            if piece.function.arguments:
                                entry["arguments"].append(piece.function.arguments)
                    if choice.finish_reason:
                        finished = True
        except (openai.APIError, ValueError, OSError, httpx.HTTPError) as exc:
            raise _BrokenReply(f"the stream broke mid-way: {type(exc).__name__}: {str(exc)[:200]}") from exc
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if not finished:
            raise _BrokenReply("the stream ended before the reply did")
        text = "".join(content)
        tool_calls: list[dict[str, Any]] = [
            {
                "id": entry["id"] or f"call_{index}",
                "type": "function",
                "function": {"name": entry["name"], "arguments": "".join(entry["arguments"])},
            }
            for index, entry in sorted(calls.items())
        ]
        tokens = usage_tokens or prompt_estimate + (len(text) + sum(len(c["function"]["arguments"]) for c in tool_calls)) // 4
        return self._accept(text, tool_calls, tokens)

    def _accept(self, content: str, calls: list[dict[str, Any]], tokens: int) -> _Reply:
        self.tokens += tokens
        if not content.strip() and not calls:
            raise _BrokenReply("an empty reply")
        return _Reply(content, calls, tokens)

    # -- the tools ------------------------------------------------------------

    def _call(self, call: dict[str, Any]) -> str:
        name = call.get("function", {}).get("name", "")
        raw = call.get("function", {}).get("arguments") or "{}"
        if name not in TOOL_NAMES:
            return f"error: there is no tool named {name!r}. The tools are: {', '.join(TOOL_NAMES)}."
        try:
            args = json.loads(raw)
        except ValueError as exc:
            return (
                f"error: the arguments of {name} are not valid JSON ({exc}); nothing was changed. "
                "Send the call again with a complete JSON object."
            )
        if not isinstance(args, dict):
            return f"error: the arguments of {name} must be a JSON object; nothing was changed."
        try:
            if name == "list_files":
                return self._list_files(str(args.get("path") or "."))
            if name == "read_file":
                return self._read_file(_text(args, "path"), args.get("start_line"), args.get("end_line"))
            if name == "write_file":
                return self._write_file(_text(args, "path"), _text(args, "content"))
            if name == "replace_in_file":
                return self._replace_in_file(_text(args, "path"), _text(args, "search"), _text(args, "replace"))
            if name == "delete_file":
                return self._delete_file(_text(args, "path"))
            if name == "run_checks":
                return self._iteration(finish=None)
            return self._iteration(finish=str(args.get("summary") or "").strip() or "(no summary)")
        except PathRefused as exc:
            return f"error: refused: {exc}"
        except UnsafePath as exc:  # a symlink planted on the way; nothing was written
            return f"error: refused: {exc}"
        except _MissingArgument as exc:
            return f"error: {name} needs {exc}; nothing was changed."

    def _list_files(self, path: str) -> str:
        base = contain(self.root, path)
        if not base.is_dir():
            raise PathRefused(f"{path!r} is not a directory")
        lines: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in (".git", "target"))
            for filename in sorted(filenames):
                file = Path(dirpath) / filename
                rel = file.relative_to(self.root).as_posix()
                lines.append(f"{rel} ({_line_count(file)} lines)")
        shown = lines[:MAX_LISTED]
        more = f"\n... and {len(lines) - MAX_LISTED} more" if len(lines) > MAX_LISTED else ""
        return ("\n".join(shown) or "(no files)") + more

    def _read_file(self, path: str, start: Any, end: Any) -> str:
        target = contain(self.root, path)
        if not target.is_file():
            raise PathRefused(f"{path!r} does not exist (list_files shows what does)")
        try:  # contain() checked that the resolved path is inside; it is read without following a link
            data, cut = _read_capped(target.resolve())
        except OSError as exc:
            raise PathRefused(f"{path!r} cannot be read: {exc.strerror or exc}") from None
        text = data.decode("utf-8", errors="replace")
        lines = text.splitlines()
        if cut:
            lines.append(f"... (the file passes {MAX_FILE_READ // (1024 * 1024)} MiB; the rest is not read)")
        first = max(1, int(start)) if isinstance(start, int) else 1
        last = min(len(lines), int(end)) if isinstance(end, int) else len(lines)
        last = min(last, first + MAX_READ_LINES - 1)
        body = "\n".join(lines[first - 1 : last])
        if len(body) > MAX_READ_CHARS:
            body = body[:MAX_READ_CHARS] + "\n... (cut; read fewer lines at a time)"
        header = f"{path} (lines {first}-{last} of {len(lines)}):" if (first, last) != (1, len(lines)) else f"{path} ({len(lines)} lines):"
        return f"{header}\n{body}"

    def _write_file(self, path: str, content: str) -> str:
        target = contain(self.root, path, write=True, allow_build_scripts=self.allow_build_scripts)
        if len(content.encode()) > MAX_WRITE_BYTES:
            raise PathRefused(f"the content passes {MAX_WRITE_BYTES // 1000} kB")
        if target.exists() and not target.is_file():
            raise PathRefused(f"{path!r} is a directory")
        self._refuse_published_build_script(path, target)
        if target.name == "Cargo.toml":
            _check_manifest(
                self.root, content, allow_build_scripts=self.allow_build_scripts, baseline=self._published, manifest=target
            )
        existed = target.exists()
        _atomic_write(self.root, target, content)
        return f"{'overwrote' if existed else 'created'} {path} ({len(content.splitlines())} lines)"

    def _replace_in_file(self, path: str, search: str, replace: str) -> str:
        target = contain(self.root, path, write=True, allow_build_scripts=self.allow_build_scripts)
        if not target.is_file():
            raise PathRefused(f"{path!r} does not exist; use write_file to create it")
        if not search:
            return "error: `search` is empty; give the exact text to replace. Nothing was changed."
        self._refuse_published_build_script(path, target)
        try:
            data, cut = _read_capped(target.resolve())
        except OSError as exc:
            raise PathRefused(f"{path!r} cannot be read: {exc.strerror or exc}") from None
        if cut:
            raise PathRefused(f"{path!r} passes {MAX_FILE_READ // (1024 * 1024)} MiB; it cannot be edited here")
        text = data.decode("utf-8", errors="surrogateescape")
        count = text.count(search)
        if count != 1:
            hint = (
                "it does not occur; read_file the current text and copy it exactly (whitespace included)"
                if count == 0 else f"it occurs {count} times; include more surrounding lines so it matches once"
            )
            return f"error: the search text must match exactly once in {path}, but {hint}. Nothing was changed."
        new = text.replace(search, replace, 1)
        if target.name == "Cargo.toml":
            _check_manifest(
                self.root, new, allow_build_scripts=self.allow_build_scripts, baseline=self._published, manifest=target
            )
        _atomic_write(self.root, target, new)
        line = text[: text.index(search)].count("\n") + 1
        return f"replaced 1 occurrence in {path} at line {line}"

    def _delete_file(self, path: str) -> str:
        target = contain(self.root, path, write=True, allow_build_scripts=self.allow_build_scripts)
        if not target.is_file():
            raise PathRefused(f"{path!r} is not a file")
        self._refuse_published_build_script(path, target)
        check_no_symlinks(self.root, target)
        target.unlink()
        return f"deleted {path}"

    # -- check runs -------------------------------------------------------------

    def _baseline(self) -> CheckRun:
        """Check run 0: the state before any model edit; it sets the ratchet."""
        self._protected = scan_tests(self.root)
        before = self._head()
        run = self._cargo_run(iteration=0, clippy=True)
        self._best_passed = run.passed if run.tests_ran else 0
        refused = self._policy()
        if refused:  # the crate's own tests wrote what the policy refuses: back to the fork
            self._best_commit = before
            self._refuse(run, refused)
            return run
        run.commit = self._commit(run)
        self._best_commit = run.commit
        self._emit(run)
        return run

    def _iteration(self, *, finish: str | None) -> str:
        started, cargo_before = time.monotonic(), self._cargo_total
        self.iterations += 1
        iteration = self.iterations
        violations = _ratchet_violations(self._protected, scan_tests(self.root))
        if violations:
            run = CheckRun(run=self._next_run(), iteration=iteration, session=self._session)
            run.reason = "; ".join(violations)
            self._revert(run)
        else:
            run = self._cargo_run(iteration=iteration, clippy=self.clippy)
            # a test or a build script may have written files while cargo ran: check the tree on disk
            refused = self._policy()
            for _ in range(FIX_ROUNDS):
                if refused or not run.fixable:
                    break
                fixed = self._apply(run.fixable)
                if not fixed:
                    break
                run.commit = self._commit(run)
                self._emit(run)
                run = self._cargo_run(iteration=iteration, clippy=self.clippy)
                run.auto_fixed = fixed
                refused = self._policy()
            if refused:
                self._refuse(run, refused)
            elif run.tests_ran and run.passed < self._best_passed:
                run.reason = f"passing tests went down from {self._best_passed} to {run.passed}"
                self._revert(run)
            else:
                run.commit = self._commit(run)
                if run.tests_ran and run.passed >= self._best_passed:
                    self._best_commit, self._best_passed = run.commit, run.passed
                    self._protected = scan_tests(self.root)
                self._emit(run)
        report = run.report(self.root, best_passed=self._best_passed)
        # the whole iteration: ratchet scan, cargo, fixes, commits, events, the report
        run.seconds, run.cargo_seconds = time.monotonic() - started, self._cargo_total - cargo_before
        previous = next((r for r in reversed(self.runs) if r.iteration == iteration - 1), None)
        if run.green and finish is not None:
            self._finished = finish
            return report + "\nFinished."
        if run.green and iteration >= self.max_iterations:
            self._finished = "(the checks passed at the last iteration; the model did not call finish)"
            return report
        if not run.green and previous is not None and previous.iteration > 0 and not previous.green and previous.signature() == run.signature():
            raise EditError(
                f"The edit loop is stuck: check runs {previous.run} and {run.run} failed the same way. "
                f"Last diagnostics:\n{_cap(report, 1500)}{self._best_hint()}",
                diagnostics=report, workspace=self.root, reason="stuck",
            )
        if iteration >= self.max_iterations:
            raise BudgetExhausted(
                f"The edit loop used all {self.max_iterations} iterations and the workspace is not green. "
                f"Last diagnostics:\n{_cap(report, 1500)}{self._best_hint()}",
                diagnostics=report, workspace=self.root, reason="iterations",
            )
        if finish is not None:
            return report + "\nNot finished: the checks must pass and the contract must be met first."
        return report

    def _next_run(self) -> int:
        self._run_number += 1
        return self._run_number

    def _cargo_run(self, *, iteration: int, clippy: bool) -> CheckRun:
        started = time.monotonic()
        run = CheckRun(run=self._next_run() if iteration else 0, iteration=iteration, session=self._session)
        env = {**TEST_ENV, "CARGO_TARGET_DIR": str(self.root.joinpath(*LOOP_TARGET))}
        cargo_time = 0.0

        def log(stream: str, line: str) -> None:
            if stream == "stderr" or not line.startswith("{"):
                self.bus.log("edit", line, "stderr" if stream == "stderr" else "stdout")

        def cargo(subcommand: str, *args: str, timeout: float) -> Any:
            nonlocal cargo_time
            t0 = time.monotonic()
            try:
                return self.cargo.run(subcommand, *args, cwd=self.root, timeout=timeout, on_line=log, env=env)
            except StageTimeout as exc:
                run.note = f"`cargo {subcommand}` ran past its time limit of {exc.seconds:.0f} s and was stopped (a test that never ends?)"
                return None
            finally:
                cargo_time += time.monotonic() - t0

        build = cargo("build", "--message-format=json", timeout=self.build_timeout)
        artifacts: list[dict[str, Any]] = []
        if build is not None:
            messages, run.binaries, artifacts = parse_compiler_messages(build.stdout)
            run.errors = [m for m in messages if m.level.startswith("error")]
            run.warnings = [m for m in messages if m.level == "warning"]
            run.built = build.returncode == 0
            if build.returncode == -9:
                run.note = build.stderr.strip().splitlines()[-1]
            elif not run.built and not run.errors:
                tail = [l for l in build.stderr.splitlines() if l.strip()][-12:]
                run.note = "cargo build failed:\n" + "\n".join(tail)
            run.fixable = [s for e in run.errors for s in e.suggestions]
        if run.built:
            test = cargo("test", "--no-fail-fast", "--message-format=json", timeout=self.test_timeout)
            if test is not None:
                messages, _, more = parse_compiler_messages(test.stdout)
                artifacts += more
                run.errors += [m for m in messages if m.level.startswith("error")]
                lines = [l for l in test.stdout.splitlines() if not l.startswith("{")]
                run.tests = parse_test_output(lines)
                _, run.failure_output = _test_details(lines)
                if test.returncode == -9:
                    run.note = test.stderr.strip().splitlines()[-1]
                elif test.returncode != 0 and not run.errors and not run.tests.failed:
                    tail = [l for l in test.stderr.splitlines() if l.strip()][-12:]
                    run.note = "cargo test failed:\n" + "\n".join(tail)
                run.fixable += [s for e in run.errors for s in e.suggestions if s not in run.fixable]
        if clippy and (run.built or iteration == 0):
            # the baseline runs clippy even on a broken crate: it checks the dependencies once, up front
            lint = cargo("clippy", "--message-format=json", timeout=self.build_timeout)
            if lint is not None:
                messages, _, more = parse_compiler_messages(lint.stdout)
                artifacts += more
                run.clippy = [m for m in messages if m.level == "warning" and (m.code or "").startswith("clippy::")]
        run.dependency_units = sum(
            1 for a in artifacts if not a.get("fresh", True) and not str(a.get("package_id", "")).startswith("path+")
        )
        run.contract, run.contract_problem = read_contract(self.root / "Cargo.toml")
        if run.contract is not None and run.built and run.contract.bin not in run.binaries:
            built = ", ".join(sorted(run.binaries)) or "none"
            run.contract_problem = (
                f"the contract names bin = \"{run.contract.bin}\", but the build produced no such binary "
                f"(binaries built: {built}); add src/main.rs or a [[bin]] target named {run.contract.bin}"
            )
        run.cargo_seconds = cargo_time
        run.seconds = time.monotonic() - started
        self._cargo_total += cargo_time
        self.runs.append(run)
        return run

    def _apply(self, suggestions: list[Suggestion]) -> list[str]:
        """Apply machine-applicable suggestions inside the workspace; return what was done."""
        by_file: dict[str, list[Suggestion]] = {}
        for s in suggestions:
            by_file.setdefault(s.file, []).append(s)
        done: list[str] = []
        for name, items in by_file.items():
            try:
                target = contain(self.root, name, write=True, allow_build_scripts=self.allow_build_scripts)
            except PathRefused:
                continue
            if not target.is_file():
                continue
            try:
                data, cut = _read_capped(target.resolve())
            except OSError:
                continue
            if cut:
                continue
            last_start = len(data) + 1
            for s in sorted(set(items), key=lambda s: (s.byte_start, s.byte_end), reverse=True):
                if s.byte_end > last_start or s.byte_end > len(data):
                    continue  # overlaps one already applied
                data = data[: s.byte_start] + s.replacement.encode() + data[s.byte_end :]
                last_start = s.byte_start
                done.append(f"{name}:{s.line}: {s.message}")
            try:
                _atomic_write(self.root, target, data.decode("utf-8", errors="surrogateescape"))
            except UnsafePath:
                continue
        return done

    def _stage(self) -> None:
        # everything but build outputs, even what the crate's own .gitignore names (as the fork does)
        self.git("add", "-A", "-f", "--", ".", *(f":(exclude,top){p}" for p in _NOT_SOURCE))

    def _commit(self, run: CheckRun) -> str:
        self._stage()
        self.git("commit", "-q", "--no-verify", "--allow-empty", "-m", run.commit_message(self.root))
        return self._head()

    def _head(self) -> str:
        """HEAD's commit id, read from .git without starting a process when the ref is a loose file."""
        git_dir = self.root / ".git"
        try:
            head = _read_text(git_dir / "HEAD", 4096).strip()
            if head.startswith("ref: ") and ".." not in head:
                return _read_text(git_dir / head[5:], 4096).strip()
        except OSError:
            pass
        return self.git.head()

    def _revert(self, run: CheckRun) -> None:
        """Record the refused state as a commit, then go back to the best commit with a second one."""
        run.reverted = True
        run.reverted_to = self._best_commit
        run.contract, run.contract_problem = read_contract(self.root / "Cargo.toml")
        if run not in self.runs:
            self.runs.append(run)
        run.commit = self._commit(run)
        self.git("read-tree", "-u", "--reset", self._best_commit)
        # what could not be committed (a nested repository, empty directories) goes too; build outputs stay
        self.git("clean", "-ffdqx", *(f"--exclude=/{p}" for p in _NOT_SOURCE))
        why = (
            "(the build policy: flakebot_magic/policy.py)" if run.policy
            else "(the ratchet: passing tests never go down; existing tests stay)"
        )
        self.git(
            "commit", "-q", "--no-verify", "--allow-empty", "-m",
            f"Revert check run {run.run} to {self._best_commit[:12]}\n\n{run.reason}\n{why}\n",
        )
        self.bus.notice("edit", f"check run {run.run} reverted to {self._best_commit[:12]}: {run.reason}", "warning")
        self._emit(run)

    def _policy(self) -> list[Violation]:
        return check_tree(self.root, allow_build_scripts=self.allow_build_scripts, baseline=self._published)

    def _refuse(self, run: CheckRun, refused: list[Violation]) -> None:
        """Revert a check run after which the tree broke the build policy, and say why."""
        run.policy = [str(v) for v in refused]
        run.reason = "the build policy refuses " + "; ".join(f"{v.path} ({v.reason})" for v in refused[:5])
        self._revert(run)

    def _refuse_published_build_script(self, path: str, target: Path) -> None:
        """A published build script under another name than build.rs is as off limits as build.rs."""
        if self.allow_build_scripts:
            return
        if target.relative_to(self.root).as_posix() in self._published.build_scripts:
            raise PathRefused(
                f"{path!r} is the crate's build script: build scripts run arbitrary code at build time and are "
                "refused (the user can allow them with --allow-build-scripts)"
            )

    def _emit(self, run: CheckRun) -> None:
        self.bus.emit(
            IterationResult(
                iteration=run.iteration,
                passed=run.passed,
                failed=run.failed,
                errors=len(run.errors),
                reverted=run.reverted,
                reason=run.reason,
                commit=run.commit,
                run=run.run,
                green=run.green,
                warnings=len(run.warnings),
                auto_fixed=len(run.auto_fixed),
                summary=run.headline(),
            )
        )

    def _last_report(self) -> str:
        return self.runs[-1].report(self.root, best_passed=self._best_passed) if self.runs else ""

    def _last_words(self) -> str:
        return f" Last diagnostics:\n{_cap(self._last_report(), 1500)}{self._best_hint()}" if self.runs else ""

    def _best_hint(self) -> str:
        return (
            f"\nThe best state is commit {self._best_commit[:12]} ({self._best_passed} tests passing): "
            f"`git -C {self.root} log` shows every check run."
        )

    def _record(self, state: EditState, request: str) -> None:
        state.sessions.append({
            "request": request,
            "summary": self._finished,
            "model": self.model.model,
            "base_url": self.model.base_url,
            "iterations": self.iterations,
            "head": self.git.head(),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        })
        state.save(self.root)

    # -- the prompt -------------------------------------------------------------

    def _system_prompt(self, request: str, baseline: CheckRun, state: EditState, follow_up: bool) -> str:
        crate = self.crate
        manifest = _read(self.root / "Cargo.toml", 4000)
        readme = _readme_summary(self.root)
        parts = [
            "You are the edit loop of flakebot. You turn a Rust crate into a tool that does what the user "
            "asks, by editing the crate's files with the tools you have. You cannot run commands: flakebot "
            "runs `cargo build`, `cargo test` and `cargo clippy` when you call run_checks or finish, "
            "and answers with the compiler's diagnostics and the test results.",
            f"The request: {request}",
            "The tool contract (checked by code): Cargo.toml must contain\n"
            "[package.metadata.flakebot]\n"
            'kind = "cli"    # one of "cli", "mcp", "http"; "cli" unless an MCP server or HTTP service is asked for\n'
            'bin = "NAME"    # the binary target to deploy; it must exist and build\n'
            "A cli tool takes its input from arguments or standard input and prints its result to standard "
            "output. Its --help must exit 0 and describe the usage; if it reads standard input, its help "
            "must say \"standard input\".\n"
            "An mcp tool speaks the Model Context Protocol as JSON-RPC 2.0 over stdio, one JSON message per "
            "line: it answers initialize (protocolVersion 2025-06-18), tools/list (each tool with name, "
            "description and an inputSchema) and tools/call (content, structuredContent for data, "
            "isError: true for a failure); it answers unknown methods with error -32601 and exits when "
            "stdin closes.\n"
            "An http tool is a service that listens on 127.0.0.1 only, at the port given as --port PORT and "
            "in the PORT environment variable; it requires `Authorization: Bearer $FLAKEBOT_TOKEN` on every "
            "request except its health path (GET /health unless the table sets health = \"/path\"), and "
            "may describe its operations at GET /openapi.json. See docs/tool-contract.md.",
            "Rules, enforced by code:\n"
            "- The number of passing tests never goes down; existing tests may not be deleted, emptied or "
            "ignored. A change that does either is reverted to the best commit.\n"
            "- Paths are relative to the crate root. '..', absolute paths, .git/, .cargo/, target/, "
            f"rust-toolchain files{'' if self.allow_build_scripts else ' and build.rs (build scripts)'} are refused.\n"
            f"- Dependencies come from the offline registry {crate.registry if crate else ''} only; there is no network.\n"
            "- Add tests for the new behaviour (unit tests next to the code, or tests/*.rs).\n"
            f"- You have {self.max_iterations} check runs (run_checks or finish) for this session.\n"
            "- When the checks pass and the contract is met, call finish(summary).",
        ]
        if crate is not None:
            parts.append(f"The crate: {crate.name} {crate.version}: {crate.description}")
        if readme:
            parts.append(f"README (summary):\n{readme}")
        parts.append(f"Files (public items):\n{_repo_map(self.root)}")
        parts.append(f"Cargo.toml:\n{manifest}")
        if follow_up and state.sessions:
            history = "\n".join(f"- {s.get('request', '')!r}: {s.get('summary', '')}" for s in state.sessions[-5:])
            log = self.git("log", "--format=%h %s", "-n", "15")
            parts.append(f"Earlier sessions on this workspace:\n{history}\nRecent commits:\n{log}")
        parts.append(f"The baseline (check run 0, before your edits):\n{baseline.report(self.root, best_passed=self._best_passed, limit=2500)}")
        return "\n\n".join(parts)


class _MissingArgument(Exception):
    pass


def _text(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise _MissingArgument(f"the string argument {key!r}")
    return value


def _atomic_write(root: Path, target: Path, content: str) -> None:
    """Replace ``target`` in one step (:func:`~flakebot_magic.fsutil.atomic_write`: a fresh O_EXCL|O_NOFOLLOW
    temporary file, no symlink between ``root`` and it, a planted symlink replaced, never followed).

    A regular file keeps its permission bits (without set-id or group/other write); a new one is 0644.
    """
    try:
        info = os.lstat(target)
        mode = stat.S_IMODE(info.st_mode) & 0o755 if stat.S_ISREG(info.st_mode) else 0o644
    except FileNotFoundError:
        mode = 0o644
    atomic_write(target, content.encode("utf-8", errors="surrogateescape"), mode=mode, root=root, make_parents=True)


def _read_capped(path: Path, limit: int = MAX_FILE_READ) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the regular file ``path`` (never through a symlink), and whether there was more.

    Raises ``OSError`` for a symlink, a FIFO, a device or a missing file:
    files in the workspace are written by untrusted code, and one named
    ``x.rs`` may be a link to ``/dev/zero`` or ``~/.ssh/id_rsa``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


def _read_text(path: Path, limit: int = MAX_FILE_READ) -> str:
    return _read_capped(path, limit)[0].decode("utf-8", errors="replace")


def _line_count(path: Path) -> int:
    try:
        data, _ = _read_capped(path)
    except OSError:
        return 0
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _read(path: Path, limit: int) -> str:
    try:
        text = _read_text(path, limit * 4 + 1)
    except OSError:
        return "(missing)"
    return text if len(text) <= limit else text[:limit] + "\n... (cut)"


def _readme_summary(root: Path, limit: int = 1500) -> str:
    for name in ("README.md", "README", "readme.md", "README.rst", "README.txt"):
        path = root / name
        if path.is_file():
            try:
                text = _read_text(path, 1 << 20)
            except OSError:
                continue
            # badges, images, HTML comments and link definitions say nothing about the code
            text = re.sub(r"<!--.*?-->|<img[^>]*>", "", text, flags=re.S)
            text = re.sub(r"!?\[!?\[[^\]]*\](?:\([^)]*\)|\[[^\]]*\])\](?:\([^)]*\)|\[[^\]]*\])", "", text)
            text = re.sub(r"!\[[^\]]*\](?:\([^)]*\)|\[[^\]]*\])", "", text)
            text = re.sub(r"(?m)^\[[^\]]+\]:.*$", "", text)
            text = re.sub(r"\n\s*\n(\s*\n)+", "\n\n", text).strip()
            return text if len(text) <= limit else text[:limit].rsplit("\n", 1)[0] + "\n..."
    return ""


_PUB_ITEM = re.compile(
    r"^\s*pub(?:\([^)]*\))?\s+(?:(?:unsafe|async|const|extern\s+\"C\")\s+)*(fn|struct|enum|trait|type|const|static|mod|macro_rules!)\s*([A-Za-z_]\w*)",
    re.M,
)


def _repo_map(root: Path, limit: int = 5000) -> str:
    """Files and their public items: the shape of the crate in a few lines."""
    lines: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", "target"))
        for filename in sorted(filenames):
            file = Path(dirpath) / filename
            rel = file.relative_to(root).as_posix()
            entry = f"{rel} ({_line_count(file)} lines)"
            if filename.endswith(".rs"):
                try:
                    items = _PUB_ITEM.findall(_blank(_read_text(file)))
                except OSError:
                    items = []
                if items:
                    shown = ", ".join(f"{kind} {name}" for kind, name in items[:12])
                    entry += f": {shown}" + (f", ... ({len(items)} items)" if len(items) > 12 else "")
            lines.append(entry)
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit].rsplit("\n", 1)[0] + f"\n... ({len(lines)} files in all)"


def _clippy_available(cargo: Cargo) -> bool:
    path = cargo.env().get("PATH")
    return shutil.which("cargo-clippy", path=path) is not None and shutil.which("clippy-driver", path=path) is not None
