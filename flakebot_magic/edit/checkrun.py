"""Check runs: cargo build, test and clippy in the sandbox, rustc's own fixes, a commit per run, the revert.

A :class:`CheckRun` is one run's verdict; a :class:`CheckRunner` runs them on
one workspace, applies rustc's machine-applicable suggestions, checks the
build policy on disk after each run (a test or a build script may have
written what flakebot does not build), commits each run with its diagnostics
summary, and reverts to the best commit when the loop says so.

A run starts with cargo's downloads (an online registry; the fetch profile),
which the build policy must pass first: the tree the network step reads is
never one that sandboxed code changed unchecked. Build, test and clippy then
run offline.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clients.contract import MAX_MANIFEST_BYTES, ToolContract, read_contract
from ..errors import DeployError, PolicyError, StageTimeout
from ..events import EventBus, IterationResult
from ..host.fsutil import UnsafePath, load_toml
from ..host.git import Git
from ..host.trees import Walk, remove_tree
from ..sandbox.cargo import Cargo
from ..sandbox.diagnostics import (
    Diagnostic,
    Suggestion,
    TestReport,
    actionable,
    parse_cargo_messages,
    parse_diagnostic_line,
    parse_test_output,
    readable,
)
from ..sandbox.layout import BUILD_DIR, NOT_SOURCE, SOURCE_PATHSPEC, not_committed, source_dirs
from ..sandbox.policy import TreePolicy, Violation
from ..stages.build import TEST_ENV
from .files import PathRefused, WorkspaceFiles, read_capped, read_text, write_text

__all__ = [
    "FIX_ROUNDS",
    "LOOP_TARGET",
    "MAX_ERRORS",
    "CheckRun",
    "CheckRunner",
    "clippy_available",
    "workspace_contract",
]

#: the loop's check runs share the test stage's target dir, so the final test run is fresh
LOOP_TARGET = (BUILD_DIR, "flakebot-test")
#: rounds of rustc's machine-applicable fixes before the model hears of the errors
FIX_ROUNDS = 3
#: errors listed in a check run's commit message and report
MAX_ERRORS = 6


@dataclass
class CheckRun:
    """One check run: cargo's verdict, what the ratchet did, and the commit that records it."""

    run: int
    iteration: int
    built: bool = False
    errors: list[Diagnostic] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)
    clippy: list[Diagnostic] = field(default_factory=list)
    tests: TestReport | None = None
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
    #: what the build policy refused before cargo could download for this run (then nothing ran)
    refused_before: list[Violation] = field(default_factory=list, repr=False)

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
            what = "tests do not compile" if self.built else "build FAILED"
            return f"{what}: {len(self.errors)} error(s), {len(self.warnings)} warning(s)"
        tests = self.tests
        if tests is None:
            return "build ok; tests did not run"
        state = "green" if self.green else ("tests FAILED" if tests.failed else "contract NOT met")
        counts = f"{tests.passed} passed, {tests.failed} failed, {tests.ignored} ignored"
        return f"{state}: {counts}; {len(self.warnings)} warning(s)"

    def commit_message(self) -> str:
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


def clippy_available(cargo: Cargo) -> bool:
    """Whether ``cargo clippy`` is installed beside this cargo."""
    path = cargo.env().get("PATH")
    return shutil.which("cargo-clippy", path=path) is not None and shutil.which("clippy-driver", path=path) is not None


def workspace_contract(
    manifest: Path, binaries: list[str] | None = None, *, built: bool = False
) -> tuple[ToolContract | None, str]:
    """The tool contract of a workspace, and ``""`` or what is wrong with it (in words for the model).

    The contract is read by :func:`flakebot_magic.clients.contract.read_contract`,
    the reader deploy uses, with the table required: a manifest deploy would
    reject is a problem here, and a check run with a problem is not green.
    With ``built``, ``bin`` must be among the ``binaries`` the build produced.
    """
    binaries = binaries or []
    try:  # read here, not by the contract module: never blocked by a FIFO the crate's code left there
        data, cut = read_capped(manifest, MAX_MANIFEST_BYTES)
    except OSError as exc:
        return None, f"Cargo.toml cannot be read: {exc.strerror or exc}"
    if cut:
        return None, f"Cargo.toml is larger than {MAX_MANIFEST_BYTES} bytes; it cannot be a crate's manifest"
    try:
        contract = read_contract(
            load_toml(data.decode("utf-8", errors="replace")), binaries if built else (), required=True
        )
    except ValueError as exc:
        return None, f"Cargo.toml is not valid TOML: {exc}"
    except DeployError as exc:
        return None, str(exc)
    if built and contract.bin not in binaries:
        return contract, (
            f'the contract names bin = "{contract.bin}", but the build produced no such binary '
            f"(binaries built: {', '.join(binaries) or 'none'}); "
            f"add src/main.rs or a [[bin]] target named {contract.bin}"
        )
    return contract, ""


class CheckRunner:
    """Runs, fixes, commits and reverts the check runs of one workspace; keeps every run in :attr:`runs`."""

    def __init__(
        self,
        files: WorkspaceFiles,
        *,
        cargo: Cargo,
        git: Git,
        bus: EventBus,
        build_timeout: float,
        test_timeout: float,
    ) -> None:
        self.files = files
        self.root = files.root
        self.cargo = cargo
        self.git = git
        self.bus = bus
        self.build_timeout = build_timeout
        self.test_timeout = test_timeout
        self.runs: list[CheckRun] = []
        #: the edit session the runs belong to (its number in the workspace's history)
        self.session = 1
        #: seconds spent inside cargo over all runs
        self.cargo_seconds = 0.0
        self._run_number = 0

    def new_run(self, iteration: int) -> CheckRun:
        """A check run numbered after the last (run 0 is the baseline)."""
        if iteration:
            self._run_number += 1
        return CheckRun(run=self._run_number if iteration else 0, iteration=iteration, session=self.session)

    def check(self, iteration: int, *, clippy: bool) -> tuple[CheckRun, list[Violation]]:
        """A check run with rustc's fixes applied first (up to :data:`FIX_ROUNDS` rounds, each committed).

        Returns the last run and what the build policy refuses on disk after it.
        """
        run = self.cargo_run(iteration, clippy=clippy)
        # a test or a build script may have written files while cargo ran: check the tree on disk
        refused = self.policy(run)
        for _ in range(FIX_ROUNDS):
            if refused or not run.fixable:
                break
            fixed = self.apply(run.fixable)
            if not fixed:
                break
            run.commit = self.commit(run)
            self.emit(run)
            run = self.cargo_run(iteration, clippy=clippy)
            run.auto_fixed = fixed
            refused = self.policy(run)
        return run, refused

    def cargo_run(self, iteration: int, *, clippy: bool) -> CheckRun:
        """``cargo build``, then ``cargo test`` when it built, then ``cargo clippy``; then the contract."""
        started = time.monotonic()
        run = self.new_run(iteration)
        env = {**TEST_ENV, "CARGO_TARGET_DIR": str(self.root.joinpath(*LOOP_TARGET))}
        cargo_time = 0.0

        def log(stream: str, line: str) -> None:
            if stream == "stderr":
                for text in readable([line]):  # rustdoc's JSON diagnostics come on stderr
                    self.bus.log("edit", text, "stderr")
                return
            if not line.startswith("{"):
                self.bus.log("edit", line, "stdout")
                return
            # cargo's JSON: the log gets a compiler error as rustc renders it (the E-code, the code, the help)
            for error in parse_cargo_messages([line])[0]:
                if error.level.startswith("error") and error.rendered:
                    for rendered in error.rendered.rstrip().splitlines():
                        self.bus.log("edit", rendered, "stdout")

        def cargo(subcommand: str, *args: str, timeout: float) -> Any:
            nonlocal cargo_time
            t0 = time.monotonic()
            try:
                return self.cargo.run(subcommand, *args, cwd=self.root, timeout=timeout, on_line=log, env=env)
            except StageTimeout as exc:
                run.note = (
                    f"`cargo {subcommand}` ran past its time limit of {exc.seconds:.0f} s and was stopped "
                    "(a test that never ends?)"
                )
                return None
            finally:
                cargo_time += time.monotonic() - t0

        artifacts: list[dict[str, Any]] = []
        t0 = time.monotonic()
        try:
            fetched = self.cargo.fetch(self.root, policy=self.tree_policy(), timeout=self.build_timeout, on_line=log)
        except PolicyError as exc:
            run.refused_before = list(exc.violations)
            run.note = "nothing was built: the tree breaks the build policy"
            fetched = None
        except StageTimeout as exc:
            run.note = f"cargo's download ran past its time limit of {exc.seconds:.0f} s and was stopped"
            fetched = None
        finally:
            cargo_time += time.monotonic() - t0
        if fetched is not None and fetched.returncode != 0:
            run.note = "cargo could not download the dependencies:\n" + _tail(fetched.stderr)
        build = None if run.note else cargo("build", "--message-format=json", timeout=self.build_timeout)
        if build is not None:
            found, run.binaries, _ = parse_cargo_messages(build.stdout.splitlines(), artifacts=artifacts)
            messages = actionable(found)
            run.errors = [m for m in messages if m.level.startswith("error")]
            run.warnings = [m for m in messages if m.level == "warning"]
            run.built = build.returncode == 0
            if build.returncode == -9:
                run.note = build.stderr.strip().splitlines()[-1]
            elif not run.built and not run.errors:
                run.note = "cargo build failed:\n" + _tail(build.stderr)
            run.fixable = [s for e in run.errors for s in e.suggestions]
        if run.built:
            test = cargo("test", "--no-fail-fast", "--message-format=json", timeout=self.test_timeout)
            if test is not None:
                found, _, lines = parse_cargo_messages(test.stdout.splitlines(), artifacts=artifacts)
                found += [d for d in map(parse_diagnostic_line, test.stderr.splitlines()) if d is not None]
                run.errors = actionable([*run.errors, *(m for m in found if m.level.startswith("error"))])
                run.tests = parse_test_output(lines)
                if test.returncode == -9:
                    run.note = test.stderr.strip().splitlines()[-1]
                elif test.returncode != 0 and not run.errors and not run.tests.failed:
                    run.note = "cargo test failed:\n" + _tail(test.stderr)
                run.fixable += [s for e in run.errors for s in e.suggestions if s not in run.fixable]
        if clippy and (run.built or (iteration == 0 and not run.note)):
            # the baseline runs clippy even on a broken crate: it checks the dependencies once, up front
            lint = cargo("clippy", "--message-format=json", timeout=self.build_timeout)
            if lint is not None:
                found, _, _ = parse_cargo_messages(lint.stdout.splitlines(), artifacts=artifacts)
                run.clippy = [
                    m for m in actionable(found) if m.level == "warning" and (m.code or "").startswith("clippy::")
                ]
        run.dependency_units = sum(
            1 for a in artifacts if not a.get("fresh", True) and not str(a.get("package_id", "")).startswith("path+")
        )
        run.contract, run.contract_problem = workspace_contract(
            self.root / "Cargo.toml", sorted(run.binaries), built=run.built
        )
        run.cargo_seconds = cargo_time
        run.seconds = time.monotonic() - started
        self.cargo_seconds += cargo_time
        self.runs.append(run)
        return run

    def apply(self, suggestions: list[Suggestion]) -> list[str]:
        """Apply machine-applicable suggestions inside the workspace; return what was done."""
        by_file: dict[str, list[Suggestion]] = {}
        for s in suggestions:
            by_file.setdefault(s.file, []).append(s)
        done: list[str] = []
        for name, items in by_file.items():
            try:
                target = self.files.contain(name, write=True)
            except PathRefused:
                continue
            if not target.is_file():
                continue
            try:
                data, cut = read_capped(target.resolve())
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
                write_text(self.root, target, data.decode("utf-8", errors="surrogateescape"))
            except UnsafePath:
                continue
        return done

    def commit(self, run: CheckRun) -> str:
        """Commit the workspace as it is (build outputs aside) with the run's summary; the new HEAD.

        In-process when it can (:meth:`Git.commit_in_process`: no git started), else with git's CLI.
        """
        message = run.commit_message()
        made = self.git.commit_in_process(message, excluded=not_committed)
        if made is not None:
            return made
        # everything but build outputs, even what the crate's own .gitignore names (as the fork does)
        self.git("add", "-A", "-f", "--", *SOURCE_PATHSPEC)
        return self.git.commit_index(message)

    def head(self) -> str:
        """HEAD's commit id, read from .git without starting a process when the ref is a loose file."""
        git_dir = self.root / ".git"
        try:
            head = read_text(git_dir / "HEAD", 4096).strip()
            if head.startswith("ref: ") and ".." not in head:
                return read_text(git_dir / head[5:], 4096).strip()
        except OSError:
            pass
        return self.git.head()

    def revert(self, run: CheckRun, to: str) -> None:
        """Record the refused state as a commit, then go back to the commit ``to`` with a second one."""
        run.reverted = True
        run.reverted_to = to
        run.contract, run.contract_problem = workspace_contract(self.root / "Cargo.toml")
        if run not in self.runs:
            self.runs.append(run)
        # a tree deeper than flakebot reads, or a directory it cannot read (the policy refused both), goes first: no
        # commit can hold it, and git's own clean fails on paths longer than the kernel takes or on a chmod 000
        # (remove_tree works by descriptors, and makes a directory its owner's again)
        walk = Walk(self.root)
        for dirpath, dirnames, _ in walk:
            if dirpath == str(self.root):
                dirnames[:] = source_dirs(dirnames)
        for refused in [*walk.too_deep, *(path for path, _ in walk.unreadable if path != str(self.root))]:
            remove_tree(refused, ignore_errors=True)
        run.commit = self.commit(run)
        self.git("read-tree", "-u", "--reset", to)
        # what could not be committed (a nested repository, empty directories) goes too; build outputs stay
        self.git("clean", "-ffdqx", *(f"--exclude=/{p}" for p in NOT_SOURCE))
        why = (
            "(the build policy: flakebot_magic/sandbox/policy.py)"
            if run.policy
            else "(the ratchet: passing tests never go down; existing tests stay)"
        )
        self.git.commit_index(f"Revert check run {run.run} to {to[:12]}\n\n{run.reason}\n{why}\n")
        self.bus.notice("edit", f"check run {run.run} reverted to {to[:12]}: {run.reason}", "warning")
        self.emit(run)

    def tree_policy(self) -> TreePolicy:
        """The build policy this workspace is held to."""
        return TreePolicy(self.files.allow_build_scripts, self.files.published)

    def policy(self, run: CheckRun | None = None) -> list[Violation]:
        """What the build policy refuses in the workspace on disk (or refused before ``run`` could start)."""
        if run is not None and run.refused_before:
            return run.refused_before
        return self.tree_policy().check(self.root)

    def refuse(self, run: CheckRun, refused: list[Violation], to: str) -> None:
        """Revert a check run after which the tree broke the build policy, and say why."""
        run.policy = [str(v) for v in refused]
        run.reason = "the build policy refuses " + "; ".join(f"{v.path} ({v.reason})" for v in refused[:5])
        self.revert(run, to)

    def emit(self, run: CheckRun) -> None:
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
                first_error=run.errors[0].headline() if run.errors else "",
                elapsed=run.seconds,
            )
        )


def _tail(stderr: str, lines: int = 12) -> str:
    return "\n".join([line for line in readable(stderr.splitlines()) if line.strip()][-lines:])
