"""Stage 3: prove the workspace with cargo: ``cargo build --release`` and ``cargo test``.

Both run at once (on separate target directories, so neither waits for the
other's lock): the release build is mostly one long rustc, which leaves the
other core free for the debug test build. Output is ``--message-format=json``;
diagnostics and test results are parsed into objects.

Cargo's JSON is not trusted about paths: a build script or proc macro can
write to cargo's own stdout (``/proc/<cargo pid>/fd/1``) and forge a
``compiler-artifact``. A binary is believed only when its name matches
:data:`BINARY_NAME` and its executable is a regular file whose real path lies
inside the build's target directory (:func:`untrusted_artifact`); anything
else is dropped with a notice.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cargo import Cargo
from ..errors import BuildError, TestError
from ..events import EventBus, StageFinished, StageStarted

__all__ = [
    "BINARY_NAME",
    "BUILD_FLAGS",
    "BuildResult",
    "CheckResult",
    "Diagnostic",
    "TestReport",
    "check",
    "parse_cargo_messages",
    "parse_test_output",
    "untrusted_artifact",
]

#: the flags of the release build; part of the store hash
BUILD_FLAGS = ("build", "--release", "--locked", "--message-format=json")
TEST_FLAGS = ("test", "--locked", "--message-format=json", "--no-fail-fast")
#: tests need no debugger symbols; leaving them out makes the test build markedly faster
TEST_ENV = {"CARGO_PROFILE_DEV_DEBUG": "false", "CARGO_PROFILE_TEST_DEBUG": "false"}
#: how many errors a BuildError carries
FIRST_ERRORS = 5
#: what a binary's name may be: it becomes a file name in the store and a command
BINARY_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message."""

    level: str
    message: str
    code: str | None = None
    file: str | None = None
    line: int | None = None
    column: int | None = None
    rendered: str = ""
    target: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file else ""
        code = f"[{self.code}]" if self.code else ""
        return f"{where}{self.level}{code}: {self.message}"


@dataclass
class TestReport:
    """What ``cargo test`` said: counts over all test binaries and doc tests."""

    __test__ = False

    passed: int = 0
    failed: int = 0
    ignored: int = 0
    failures: list[str] = field(default_factory=list)
    suites: int = 0

    @property
    def ok(self) -> bool:
        return self.failed == 0


@dataclass
class BuildResult:
    binaries: dict[str, Path]
    diagnostics: list[Diagnostic]


@dataclass
class CheckResult:
    build: BuildResult
    tests: TestReport
    test_diagnostics: list[Diagnostic]


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
    lines: list[str], *, target_dir: Path | None = None, refused: list[str] | None = None
) -> tuple[list[Diagnostic], dict[str, Path], list[str]]:
    """Split cargo's stdout into diagnostics, executables by target name, and other lines.

    Every executable passes :func:`untrusted_artifact` (with ``target_dir``,
    its path is checked too); why each refused one was refused is appended
    to ``refused``. A refused message never replaces an accepted one.
    """
    diagnostics: list[Diagnostic] = []
    executables: dict[str, Path] = {}
    other: list[str] = []
    for line in lines:
        if not line.startswith("{"):
            other.append(line)
            continue
        try:
            message: dict[str, Any] = json.loads(line)
        except ValueError:
            other.append(line)
            continue
        reason = message.get("reason") if isinstance(message, dict) else None
        if reason == "compiler-message":
            try:
                diagnostics.append(_diagnostic(message))
            except (AttributeError, TypeError, IndexError):  # not the shape cargo writes: forged
                other.append(line)
        elif reason == "compiler-artifact" and message.get("executable"):
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


def _diagnostic(message: dict[str, Any]) -> Diagnostic:
    inner = message.get("message", {})
    spans = inner.get("spans") or []
    primary = next((s for s in spans if s.get("is_primary")), spans[0] if spans else None)
    code = inner.get("code") or {}
    return Diagnostic(
        level=inner.get("level", "error"),
        message=inner.get("message", ""),
        code=code.get("code") if isinstance(code, dict) else None,
        file=primary.get("file_name") if primary else None,
        line=primary.get("line_start") if primary else None,
        column=primary.get("column_start") if primary else None,
        rendered=inner.get("rendered") or "",
        target=message.get("target", {}).get("name", ""),
    )


_RESULT = re.compile(r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored")
_FAILED_TEST = re.compile(r"^test (.+?) \.\.\. FAILED$")


def parse_test_output(lines: list[str]) -> TestReport:
    """Sum libtest's ``test result:`` lines; collect the names of failing tests."""
    report = TestReport()
    for line in lines:
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


def _errors(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.level in ("error", "error: internal compiler error")]


def _describe(errors: list[Diagnostic], stderr: str) -> str:
    if errors:
        return "\n".join(d.rendered.rstrip() or str(d) for d in errors[:FIRST_ERRORS])
    tail = [l for l in stderr.strip().splitlines() if l.strip()][-15:]
    return "\n".join(tail)


def check(
    workspace: Path,
    cargo: Cargo,
    bus: EventBus,
    *,
    build_timeout: float,
    test_timeout: float,
    run_tests: bool = True,
    release: Callable[[], BuildResult] | None = None,
    target_dir: Path | None = None,
) -> CheckResult:
    """Run the release build and the tests concurrently; raise on the first failure.

    Emits the ``build`` and ``test`` stage events itself, since both run at once.
    ``release`` replaces ``cargo build --release`` (the nix backend passes its
    ``nix build``); when it fails without compiler diagnostics and the tests
    fail to compile, the test build's diagnostics are raised as a BuildError,
    since they say more. ``target_dir`` is where the release build's
    executables must lie (default: ``workspace/target``).
    """
    results: dict[str, Any] = {}
    failures: dict[str, BaseException] = {}

    def stage(name: str, work: Callable[[], Any]) -> None:
        bus.emit(StageStarted(name))
        t0 = time.monotonic()
        try:
            results[name] = work()
        except BaseException as exc:  # re-raised in the caller's thread
            failures[name] = exc
            bus.emit(StageFinished(name, "failed", (str(exc).splitlines() or [""])[0], time.monotonic() - t0))
            return
        bus.emit(StageFinished(name, "done", _summary(name, results[name]), time.monotonic() - t0))

    def log(stage_name: str) -> Callable[[str, str], None]:
        def on_line(stream: str, line: str) -> None:
            if stream == "stderr" or not line.startswith("{"):
                bus.log(stage_name, line, "stderr" if stream == "stderr" else "stdout")
        return on_line

    def build() -> BuildResult:
        done = cargo.run(*BUILD_FLAGS, cwd=workspace, timeout=build_timeout, on_line=log("build"))
        refused: list[str] = []
        diagnostics, executables, _ = parse_cargo_messages(
            done.stdout.splitlines(), target_dir=target_dir or workspace / "target", refused=refused
        )
        for why in refused:
            bus.notice("build", f"dropped a forged or unsafe compiler-artifact message from cargo's output: {why}", "warning")
        if done.returncode != 0:
            errors = _errors(diagnostics)
            raise BuildError(
                f"cargo build failed for {workspace.name}:\n{_describe(errors, done.stderr)}",
                diagnostics=errors or diagnostics,
                command=done.args,
                workspace=workspace,
            )
        return BuildResult(binaries=executables, diagnostics=diagnostics)

    def test() -> tuple[TestReport, list[Diagnostic]]:
        done = cargo.run(
            *TEST_FLAGS, cwd=workspace, timeout=test_timeout, on_line=log("test"),
            env=TEST_ENV | {"CARGO_TARGET_DIR": str(workspace / "target" / "flakebot-test")},
            # the release build is the critical path; the tests take the CPU it leaves
            nice=10,
        )
        diagnostics, _, other = parse_cargo_messages(done.stdout.splitlines())
        report = parse_test_output(other)
        if done.returncode != 0:
            errors = _errors(diagnostics)
            if errors:
                raise TestError(
                    f"The tests of {workspace.name} do not compile:\n{_describe(errors, done.stderr)}",
                    diagnostics=errors, command=done.args, workspace=workspace,
                )
            if report.failed:
                names = ", ".join(report.failures[:10]) or f"{report.failed} tests"
                raise TestError(
                    f"cargo test: {report.failed} failed, {report.passed} passed in {workspace.name}. "
                    f"Failing: {names}. Run `cargo test` in the workspace to see their output.",
                    failed=report.failures, command=done.args, workspace=workspace,
                )
            raise TestError(
                f"cargo test failed for {workspace.name}:\n{_describe([], done.stderr)}",
                command=done.args, workspace=workspace,
            )
        return report, diagnostics

    # Made before either cargo starts: a cargo that finds no target/ creates it by renaming a
    # fresh temporary directory onto it, which would swallow the other cargo's target/flakebot-test.
    (workspace / "target" / "flakebot-test").mkdir(parents=True, exist_ok=True)
    threads = [threading.Thread(target=stage, args=("build", release or build), name="flakebot-build")]
    if run_tests:
        threads.append(threading.Thread(target=stage, args=("test", test), name="flakebot-test"))
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:  # Ctrl-C lands here: stop the other thread's cargo (or nix) too
        cargo.runner.cancel.cancel()
        for thread in threads:
            thread.join()
        raise
    built, tested = failures.get("build"), failures.get("test")
    if (
        built is not None
        and not getattr(built, "diagnostics", None)
        and isinstance(tested, TestError)
        and tested.diagnostics
    ):
        raise BuildError(
            str(tested).replace("The tests of", "The crate", 1).replace("do not compile", "does not compile", 1),
            diagnostics=tested.diagnostics, command=tested.command, workspace=workspace,
        ) from built
    for name in ("build", "test"):
        if name in failures:
            raise failures[name]
    report, test_diagnostics = results.get("test", (TestReport(), []))
    return CheckResult(build=results["build"], tests=report, test_diagnostics=test_diagnostics)


def _summary(name: str, result: Any) -> str:
    if name == "build":
        warnings = sum(1 for d in result.diagnostics if d.level == "warning")
        bins = ", ".join(sorted(result.binaries)) or "no binaries"
        return f"{bins}" + (f" ({warnings} warnings)" if warnings else "")
    report: TestReport = result[0]
    return f"{report.passed} passed, {report.failed} failed, {report.ignored} ignored"
