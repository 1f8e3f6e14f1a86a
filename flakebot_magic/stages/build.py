"""The build stage: prove the workspace with cargo: ``cargo build --release`` and ``cargo test``.

After one download step on the tree the policy has just passed
(:meth:`~flakebot_magic.sandbox.cargo.Cargo.fetch`), both run offline in the
sandbox, on separate target directories (neither waits for the other's lock):

* the release build, mostly one long rustc, beside the tests' compilation
  (``cargo test --no-run``), which takes the other core;
* the tests themselves, the crate's own code, only once the release build is
  over: no test runs while the release build reads the sources (a test that
  rewrites ``src/main.rs`` would change what is deployed).

The release build's target dir is flakebot's own, beside the workspace
(:func:`~flakebot_magic.sandbox.release_target`), shown to that one command:
no later sandboxed command can replace the binary, whose SHA-256 is taken as
the build ends and checked again by the deploy. Output is
``--message-format=json``; diagnostics and test results are parsed by
:mod:`flakebot_magic.sandbox.diagnostics`.

Why two target directories, and a debug test build beside the release one: it
was measured against the ways to compile the dependencies once for both
(``benchmarks/bench_proof.py``: the tests in the release profile, the crate's
own targets at the test profile's settings inside ``--release``, one target
dir, ``--no-run`` first, ONE cargo building every target in the release
profile, and ``shared``: the tests after the release build in its target dir,
its binaries sealed first, the crate at the test profile's settings and the
test-only packages at opt-level 0) and stayed the fastest that runs every test
``cargo test`` runs. ``shared`` costs less CPU (it compiles the dependencies
once) but more wall time: one target dir is one cargo at a time, so the tests
no longer fill the core the release build's last long rustc leaves idle.
``shared-copy`` (the dependency units copied into the tests' own target dir
once done) lowers both on hexyl but not pulldown-cmark's wall (README). One
cargo has one profile for the crate's own code: its tests then compile at
opt-level 3 without debug assertions or overflow checks (a ``should_panic`` on
an overflow no longer panics), and two cargo commands in one target dir take
turns (cargo's lock), losing the core the long release rustc leaves free; both
cost more than the dependencies built twice (README, "Benchmarks"). The cold
test build is not incremental (:data:`COLD_TEST_ENV`), the one knob of the
test build measured to lower its CPU without changing what it proves
(``bench_proof.py``'s ``knob-*`` variants).

Each build's dependencies come from the dependency cache when it is given
(:mod:`~flakebot_magic.stages.deps`): their units are copied into the build's
target dir before its cargo starts, the missing ones compiled first in a stub
that holds none of the crate's code.

A proof is never made twice on one machine: with a
:class:`~flakebot_magic.records.proofs.ProofStore`, :func:`check` looks up the
:class:`~flakebot_magic.records.proof_key.ProofKey` of the tests it would run
(:func:`proof_key`) and runs only the release build when it was proven before.

Cargo's JSON is not trusted about paths: the release build's binaries are
believed only when their executables lie inside the build's target directory
(:func:`flakebot_magic.sandbox.diagnostics.untrusted_artifact`); anything else is
dropped with a notice.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..commands import typed
from ..errors import BuildError, DiskFull, TestError, UpstreamTestError
from ..events import EventBus, StageFinished, StageStarted
from ..host.fsutil import private_dir, read_regular, real_dir, sha256_regular
from ..host.git import Git
from ..host.process import Completed
from ..host.storage import no_space
from ..records.proof_key import ProofKey
from ..records.proofs import ProofRecord, ProofStore
from ..sandbox.cargo import Cargo
from ..sandbox.command import RELEASE, release_target
from ..sandbox.diagnostics import (
    Diagnostic,
    TestReport,
    parse_cargo_messages,
    parse_diagnostic_line,
    parse_test_output,
    readable,
)
from ..sandbox.policy import TreePolicy
from ..untrusted import safe_text
from .deploy import source_digest
from .deps import DependencyCache, DepsBuild, Plan, Provided
from .proven import ProvenSource, export, settle

__all__ = [
    "BUILD_FLAGS",
    "CAP_LINTS",
    "COLD_TEST_ENV",
    "LINT_CAP",
    "TEST_ENV",
    "BuildResult",
    "CheckResult",
    "check",
    "proof_key",
]

#: lints never fail a build of what the registry holds: a published ``#![deny(warnings)]`` meets
#: today's rustc's new lints (``unexpected cfg condition value``); warnings stay warnings. rustdoc
#: too: it compiles the crate and each doc test for ``cargo test`` (``#![doc(test(attr(deny(warnings))))]``)
LINT_CAP = ("--cap-lints", "warn")
#: :data:`LINT_CAP` for rustc and rustdoc, as cargo ``--config`` arguments (the flake sets the same as
#: ``RUSTFLAGS`` and ``RUSTDOCFLAGS``)
CAP_LINTS = (
    "--config",
    f"build.rustflags={list(LINT_CAP)}".replace("'", '"'),
    "--config",
    f"build.rustdocflags={list(LINT_CAP)}".replace("'", '"'),
)
#: the flags of the release build; part of the store hash (the edit loop never builds for release)
BUILD_FLAGS = ("build", "--release", "--locked", "--message-format=json", *CAP_LINTS)
TEST_FLAGS = ("test", "--locked", "--message-format=json", "--no-fail-fast")
#: the edit loop's state in a workspace's git dir (edit.state.STATE_FILE; not imported: edit imports this module)
EDIT_STATE = "flakebot-edit.json"
#: tests need no debugger symbols; leaving them out makes the test build markedly faster
TEST_ENV = {"CARGO_PROFILE_DEV_DEBUG": "false", "CARGO_PROFILE_TEST_DEBUG": "false"}
#: for a test build the edit loop never worked in: a cold build has nothing to reuse, and writing the incremental
#: cache of the crate's own targets costs CPU (pulldown-cmark's debug test build: 10.9 s of CPU against 13.4 s;
#: benchmarks/bench_proof.py ``split-noinc``). It changes how rustc caches, not what is compiled or tested, so a
#: proof's key leaves it out. The edit loop's check runs keep incremental builds (they rebuild after each edit).
#: The other knobs of the test build (codegen units, dependencies at opt-level 1, the mold linker, strip, the
#: build scripts' units; ``bench_proof.py``'s ``knob-*``) were measured in this sandbox beside the release build
#: and none lowers its CPU on both pulldown-cmark and hexyl: one codegen unit, the best of them outside the
#: sandbox, costs hexyl 5% more CPU in it (README, "Benchmarks").
COLD_TEST_ENV = {"CARGO_INCREMENTAL": "0"}
#: how many errors a BuildError carries
FIRST_ERRORS = 5


@dataclass
class BuildResult:
    binaries: dict[str, Path]
    diagnostics: list[Diagnostic]
    #: each binary's SHA-256 as the build left it, before anything else ran (the deploy checks it)
    digests: dict[str, str] = field(default_factory=dict)


@dataclass
class CheckResult:
    build: BuildResult
    tests: TestReport
    test_diagnostics: list[Diagnostic]
    #: the proof the tests made, or the one found instead of running them (None: no proof store)
    proof: ProofRecord | None = None
    #: what the dependency cache did for each build (``release``, ``test``) it served or tried to
    deps: dict[str, Provided] = field(default_factory=dict)
    #: the commit the release build compiled, its tree, and its exported files
    source: ProvenSource | None = None


#: Cargo.lock is small; of a bigger one, the first this many bytes key a proof (and a mark that there is more)
_MAX_LOCK = 16 << 20


def proof_key(workspace: Path, git: Git, toolchain: str, flags: tuple[str, ...]) -> ProofKey:
    """What a ``cargo test`` with ``flags`` (its arguments and environment) in ``workspace`` proves."""
    try:
        lock, more = read_regular(workspace / "Cargo.lock", _MAX_LOCK)
    except OSError:
        lock, more = b"", False
    lock_hash = hashlib.sha256(lock).hexdigest() + ("+" if more else "")
    return ProofKey(source_digest(git).hexdigest(), lock_hash, toolchain, flags)


def _errors(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.level in ("error", "error: internal compiler error")]


def _describe(errors: list[Diagnostic], stderr: str) -> str:
    if errors:
        return "\n".join(d.rendered.rstrip() or str(d) for d in errors[:FIRST_ERRORS])
    # made safe before it is cut into lines (a crate's \x0b or \u2028 must not push real lines out);
    # rustdoc's JSON diagnostics rendered as rustc prints them, never as raw JSON
    tail = [line for line in readable(safe_text(stderr).strip().splitlines()) if line.strip()][-15:]
    return "\n".join(tail)


def check(
    workspace: Path,
    cargo: Cargo,
    bus: EventBus,
    *,
    policy: TreePolicy,
    build_timeout: float,
    test_timeout: float,
    run_tests: bool = True,
    release: Callable[[Path], BuildResult] | None = None,
    target_dir: Path | None = None,
    cap_lints: bool | None = None,
    proofs: ProofStore | None = None,
    git: Git | None = None,
    deps: DependencyCache | None = None,
) -> CheckResult:
    """Download what the workspace needs, then the release build beside the tests' compilation; the tests run
    once the release build is over; raise on the first failure.

    ``policy`` must pass the tree first (:class:`~flakebot_magic.errors.PolicyError`
    otherwise), whether or not the registry needs a download (an online one
    only); the builds and tests run offline after it.

    Emits the ``build`` and ``test`` stage events itself, since both run at once.
    The release build compiles the proven commit, never the work tree
    (:mod:`~flakebot_magic.stages.proven`): once the policy passed, what
    differs on disk is committed, and that commit is exported from git's
    objects into a directory the release build sees read-only, without the
    workspace. ``release`` replaces ``cargo build --release`` (the nix backend
    passes its ``nix build``), called with that directory; when it fails without compiler diagnostics and the tests
    fail to compile, the test build's diagnostics are raised as a BuildError,
    since they say more. ``target_dir`` is where the release build's
    executables must lie (default: ``workspace/target``).

    The release build always caps lints at warn (:data:`CAP_LINTS`, in
    :data:`BUILD_FLAGS` and so in the store hash). ``cap_lints`` is for the
    tests: None caps them unless the edit loop worked in the workspace
    (its check runs share the test target dir, and its lint rules stand
    for the code it wrote).
    """
    edited = (workspace / ".git" / EDIT_STATE).is_file()
    if cap_lints is None:
        cap_lints = not edited
    test_env = TEST_ENV if edited else TEST_ENV | COLD_TEST_ENV
    proving = _Check(
        workspace, cargo, bus, build_timeout, test_timeout, target_dir, upstream=cap_lints, test_env=test_env
    )
    proving.deps = deps
    git = git or Git(workspace, cargo.runner)
    proving.fetch(policy)
    # the tree the policy just passed, as a commit: what the release build compiles and the tests run on
    source = export(git, workspace, settle(git))
    proving.plan_for(source.path)
    key = known = None
    if proofs is not None and run_tests:
        key = proof_key(workspace, git, cargo.rustc_version(), (*proving.test_flags, *_env_flags(TEST_ENV)))
        known = proofs.find(key)
    if known is not None:  # the tests' stage is the proof found: it runs nothing
        bus.emit(StageStarted("test"))
        bus.emit(StageFinished("test", "cached", _reused(known)))
    proving.run_stages(lambda: (release or proving.release_build)(source.path), tests=run_tests and known is None)
    proving.raise_failure()
    if deps is not None and proving.plan is not None and proving.deferred:
        deps.fill_later(proving.plan, proving.deferred, cargo, timeout=build_timeout)
    return replace(proving.result(known, proofs, key), source=source)


#: why a build script that writes into its crate's directory fails the release build
_READ_ONLY_SOURCE = (
    "The release build compiles the proven commit's files read-only (a file no commit holds can reach no "
    "binary), so a build script may write only under OUT_DIR, as cargo asks of published crates."
)


class _Check:
    """One :func:`check`: its two stages (the release build, the tests) on two threads, and what each left.

    Each method is one step of :func:`check`; the stage threads write
    ``results`` and ``failures``, read once both threads are joined.
    """

    def __init__(
        self,
        workspace: Path,
        cargo: Cargo,
        bus: EventBus,
        build_timeout: float,
        test_timeout: float,
        target_dir: Path | None,
        *,
        upstream: bool,
        test_env: dict[str, str],
    ) -> None:
        self.workspace, self.cargo, self.bus = workspace, cargo, bus
        self.build_timeout, self.test_timeout = build_timeout, test_timeout
        self.release_dir = release_target(workspace)
        self.target_dir = target_dir or self.release_dir
        #: the tests are the published crate's own, unedited: lints capped, a failure is upstream's
        self.upstream = upstream
        #: the test build's environment (a cold one builds without incremental files: COLD_TEST_ENV)
        self.test_env = test_env
        self.test_flags = (*TEST_FLAGS, *CAP_LINTS) if upstream else TEST_FLAGS
        self.results: dict[str, Any] = {}
        self.failures: dict[str, BaseException] = {}
        self.test_seconds = 0.0
        #: set once the release build is over: the crate's code (its tests) may run from then on
        self.released = threading.Event()
        #: the dependency cache, and its plan for this workspace (made once the policy passed it)
        self.deps: DependencyCache | None = None
        self.plan: Plan | None = None
        self.provided: dict[str, Provided] = {}
        #: the builds that compiled their own dependencies (few were sealed): the stub seals them after
        self.deferred: list[DepsBuild] = []

    def log(self, stage_name: str) -> Callable[[str, str], None]:
        """What a cargo command of ``stage_name`` does with each line it prints: the readable ones become logs."""

        def on_line(stream: str, line: str) -> None:
            if stream == "stderr":
                for text in readable([line]):  # rustdoc's JSON diagnostics come on stderr
                    self.bus.log(stage_name, text, "stderr")
            elif not line.startswith("{"):
                self.bus.log(stage_name, line, "stdout")

        return on_line

    def fetch(self, policy: TreePolicy) -> None:
        """The one download step, on the tree ``policy`` passes; then the tests' target dir, before any cargo."""
        workspace = self.workspace
        fetched = self.cargo.fetch(workspace, policy=policy, timeout=self.build_timeout, on_line=self.log("build"))
        if fetched is not None and fetched.returncode != 0:
            self.no_space(fetched, "cargo's download of the dependencies")
            raise BuildError(
                f"cargo could not download the dependencies of {workspace.name}:\n{_describe([], fetched.stderr)}",
                command=fetched.args,
                workspace=workspace,
            )
        # Made before either cargo starts: a cargo that finds no target/ creates it by renaming a
        # fresh temporary directory onto it, which would swallow the other cargo's target/flakebot-test.
        real_dir(workspace, workspace / "target" / "flakebot-test")

    def plan_for(self, source: Path) -> None:
        """The dependency cache's plan for ``source`` (the proven commit's files, which both builds compile)."""
        if self.deps is not None:
            plan = self.deps.plan(source)
            if isinstance(plan, str):
                self.bus.log("build", f"flakebot: the dependency cache is not used for {self.workspace.name}: {plan}")
            else:
                self.plan = plan

    def provide(self, build: DepsBuild, root: Path, target: str, stage_name: str, *, nice: int = 0) -> None:
        """The dependency units of ``build`` into the target dir ``root/target`` from the cache (a stub build
        first for the missing ones); nothing when that target dir holds a profile already (the edit loop's)."""
        if self.deps is None or self.plan is None or (root / target / build.profile_dir).exists():
            return
        if self.deps.cold(self.plan, build):
            self.deferred.append(build)
            self.bus.log(
                stage_name,
                "flakebot: dependency cache: few of these dependencies are compiled yet: cargo compiles them here, "
                "and a stub seals them for later tools once this one is built",
            )
            return
        done = self.deps.provide(
            self.plan,
            build,
            root,
            target,
            self.cargo,
            timeout=self.build_timeout,
            on_line=self.log(stage_name),
            nice=nice,
        )
        self.provided[build.name] = done
        if done.why_not:
            self.bus.log(stage_name, f"flakebot: dependency cache: {done.why_not}; cargo compiles them here")
        else:
            fresh = f", {done.compiled} compiled just now in a stub ({self.deps.mode})" if done.stub_ran else ""
            self.bus.log(
                stage_name, f"flakebot: dependency cache: {done.copied} units copied{fresh} in {done.seconds:.1f} s"
            )

    def run_stages(self, release: Callable[[], BuildResult], *, tests: bool) -> None:
        """The release build (then ``released``) and, when ``tests``, the tests, each on its own thread."""

        def release_then_tests() -> BuildResult:
            try:
                return release()
            finally:
                self.released.set()  # the binary is built and hashed (or the build failed): the crate's code may run

        threads = [threading.Thread(target=self.stage, args=("build", release_then_tests), name="flakebot-build")]
        if tests:
            threads.append(threading.Thread(target=self.stage, args=("test", self.tests), name="flakebot-test"))
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:  # Ctrl-C lands here: stop the other thread's cargo (or nix) too
            self.cargo.runner.cancel.cancel()
            for thread in threads:
                thread.join()
            raise

    def stage(self, name: str, work: Callable[[], Any]) -> None:
        """Run one stage on this thread, between its events; keep its result or its error for the caller's."""
        self.bus.emit(StageStarted(name, units=_locked_packages(self.workspace)))
        t0 = time.monotonic()
        try:
            self.results[name] = work()
        except BaseException as exc:  # re-raised in the caller's thread
            self.failures[name] = exc
            self.bus.emit(StageFinished.stopped_by(name, exc, time.monotonic() - t0))
            return
        if name == "test":
            self.test_seconds = time.monotonic() - t0
        self.bus.emit(StageFinished(name, "done", _summary(name, self.results[name]), time.monotonic() - t0))

    def no_space(self, done: Completed, what: str) -> None:
        """Raise :class:`~flakebot_magic.errors.DiskFull` when the failed command ``done`` said it met no space on
        a disk that is (next to) full: a storage error, never the crate's failure (:func:`~flakebot_magic.host.storage.no_space`)."""
        full = no_space(f"{what} of {self.workspace.name}", self.workspace, done.stdout, done.stderr)
        if full is not None:
            raise full

    def release_build(self, source: Path) -> BuildResult:
        """``cargo build --release`` of ``source`` (the proven commit's files) into flakebot's own target dir; the
        binaries hashed as the build ends."""
        workspace = self.workspace
        self.provide(DepsBuild("release", "release", BUILD_FLAGS), private_dir(self.release_dir), "", "build")
        # the release build's target dir is flakebot's, outside the workspace: the tests running beside it
        # cannot reach the binary (the red team's A07 swapped it), and its digest is taken as the build ends;
        # it compiles the commit read-only, without the workspace: no file of no commit reaches the binary
        done = self.cargo.for_release(workspace, source).run(
            *BUILD_FLAGS,
            cwd=source,
            timeout=self.build_timeout,
            on_line=self.log("build"),
            env={"CARGO_TARGET_DIR": str(self.release_dir)},
            profile=RELEASE,
        )
        refused: list[str] = []
        diagnostics, executables, _ = parse_cargo_messages(
            done.stdout.splitlines(), target_dir=self.target_dir, refused=refused
        )
        for why in refused:
            self.bus.notice(
                "build", f"dropped a forged or unsafe compiler-artifact message from cargo's output: {why}", "warning"
            )
        if done.returncode != 0:
            self.no_space(done, "cargo build")
            errors = _errors(diagnostics)
            # the export is read-only: a build script that writes beside its sources (not in OUT_DIR) fails here
            readonly = "\n" + _READ_ONLY_SOURCE if "Read-only file system" in done.stderr else ""
            raise BuildError(
                f"cargo build failed for {workspace.name}:\n{_describe(errors, done.stderr)}{readonly}",
                diagnostics=errors or diagnostics,
                command=done.args,
                workspace=workspace,
            )
        try:
            digests = {name: sha256_regular(path) for name, path in executables.items()}
        except OSError as exc:
            raise BuildError(
                f"cargo build of {workspace.name} left no readable binary: {exc}", workspace=workspace
            ) from exc
        return BuildResult(binaries=executables, diagnostics=diagnostics, digests=digests)

    def cargo_test(self, *more: str) -> Completed:
        return self.cargo.run(
            *self.test_flags,
            *more,
            cwd=self.workspace,
            timeout=self.test_timeout,
            on_line=self.log("test"),
            env=self.test_env | {"CARGO_TARGET_DIR": str(self.workspace / "target" / "flakebot-test")},
            # the release build is the critical path; the tests take the CPU it leaves
            nice=10,
        )

    def tests(self) -> tuple[TestReport, list[Diagnostic]]:
        """The tests compiled beside the release build, run once it is over."""
        tests = DepsBuild("test", "debug", (*self.test_flags, "--no-run"), self.test_env)
        self.provide(tests, self.workspace, "target/flakebot-test", "test", nice=10)
        # no test of the crate runs while the release build reads the sources (a test rewriting src/main.rs
        # would change what is deployed)
        done = self.cargo_test("--no-run")
        if done.returncode == 0:
            self.released.wait()
            done = self.cargo_test()
        diagnostics, _, other = parse_cargo_messages(done.stdout.splitlines())
        # rustdoc builds the crate and its doc tests with JSON diagnostics on stderr, outside cargo's envelope
        diagnostics += [d for d in map(parse_diagnostic_line, done.stderr.splitlines()) if d is not None]
        report = parse_test_output(other)
        if done.returncode != 0:
            self.no_space(done, "cargo test")  # a compiler's, a linker's or a test's own "No space left on device"
            raise _test_failure(
                self.workspace, done.args, _errors(diagnostics), report, done.stderr, upstream=self.upstream
            )
        return report, diagnostics

    def raise_failure(self) -> None:
        """The first failure, the build's before the tests'; a release build that failed saying nothing gives
        way to the tests' compiler errors, which say why."""
        built, tested = self.failures.get("build"), self.failures.get("test")
        for failure in (built, tested):  # a full disk is the cause whichever stage met it first
            if isinstance(failure, DiskFull):
                raise failure
        if (
            built is not None
            and not getattr(built, "diagnostics", None)
            and isinstance(tested, TestError)
            and tested.diagnostics
        ):
            raise BuildError(
                str(tested).replace("The tests of", "The crate", 1).replace("do not compile", "does not compile", 1),
                diagnostics=tested.diagnostics,
                command=tested.command,
                workspace=self.workspace,
            ) from built
        for name in ("build", "test"):
            if name in self.failures:
                raise self.failures[name]

    def result(self, known: ProofRecord | None, proofs: ProofStore | None, key: ProofKey | None) -> CheckResult:
        """What the check proved: the proof ``known`` before, or the one the tests just made (recorded)."""
        report, test_diagnostics = self.results.get("test", (TestReport(), []))
        proof = known
        if known is not None:
            report = TestReport(passed=known.passed, ignored=known.ignored, suites=known.suites)
        elif proofs is not None and key is not None and "test" in self.results:
            proof = proofs.record(
                key, passed=report.passed, ignored=report.ignored, suites=report.suites, seconds=self.test_seconds
            )
        return CheckResult(
            build=self.results["build"],
            tests=report,
            test_diagnostics=test_diagnostics,
            proof=proof,
            deps=self.provided,
        )


def _env_flags(env: dict[str, str]) -> tuple[str, ...]:
    return tuple(f"{name}={value}" for name, value in sorted(env.items()))


def _reused(proof: ProofRecord) -> str:
    return (
        f"{proof.passed} passed, 0 failed, {proof.ignored} ignored "
        f"(proof reused: the same source was proven at {proof.proven_at})"
    )


def _test_failure(
    workspace: Path, command: list[str], errors: list[Diagnostic], report: TestReport, stderr: str, *, upstream: bool
) -> TestError:
    """The error for a failed ``cargo test``: :class:`UpstreamTestError` when nothing of the crate was edited.

    A published crate's own tests that fail unedited, with lints capped, fail
    on this toolchain: the crate's doing, not flakebot's, and the message
    says so and names them.
    """
    kind = UpstreamTestError if upstream else TestError
    whose = (
        f"The published tests of {workspace.name} (unedited, lints capped at warn) fail on this toolchain: "
        "this is the crate's own failure, not one flakebot caused. "
        if upstream
        else ""
    )
    if errors:
        return kind(
            f"{whose}The tests of {workspace.name} do not compile:\n{_describe(errors, stderr)}",
            diagnostics=errors,
            command=command,
            workspace=workspace,
        )
    if report.failed:
        names = ", ".join(report.failures[:10]) or f"{report.failed} tests"
        return kind(
            f"{whose}cargo test: {report.failed} failed, {report.passed} passed in {workspace.name}. "
            f"Failing: {names}. To see their output, run them in the sandbox: "
            f"{typed(f'cargo {workspace.name} test')}.",
            failed=report.failures,
            command=command,
            workspace=workspace,
        )
    return kind(
        f"{whose}cargo test failed for {workspace.name}:\n{_describe([], stderr)}", command=command, workspace=workspace
    )


def _summary(name: str, result: Any) -> str:
    if name == "build":
        warnings = sum(1 for d in result.diagnostics if d.level == "warning")
        bins = ", ".join(sorted(result.binaries)) or "no binaries"
        return f"{bins}" + (f" ({warnings} warnings)" if warnings else "")
    report: TestReport = result[0]
    return f"{report.passed} passed, {report.failed} failed, {report.ignored} ignored"


def _locked_packages(workspace: Path) -> int:
    """How many packages the workspace's Cargo.lock holds (0 without one): the most units one cargo compiles."""
    try:
        text = read_regular(workspace / "Cargo.lock", 16 * 1024 * 1024)[0].decode("utf-8", "replace")
    except (OSError, ValueError):
        return 0
    return text.count("\n[[package]]") + text.startswith("[[package]]")
