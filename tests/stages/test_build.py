"""The build stage: cargo's JSON messages and libtest's output parsed, and check() on real crates."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from tinycrates import Crate, Recorder, write_crate, write_registry

from flakebot_magic.errors import BuildError, TestError
from flakebot_magic.events import EventBus, StageFinished, StageStarted
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import Completed, ProcessRunner
from flakebot_magic.records.proofs import ProofStore
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import RELEASE, release_source, release_target
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.diagnostics import Diagnostic, parse_cargo_messages, parse_test_output, untrusted_artifact
from flakebot_magic.sandbox.policy import TreePolicy
from flakebot_magic.stages.build import BUILD_FLAGS, CheckResult, check
from flakebot_magic.stages.fork import Workspace, fork

Forked = Callable[[str], Workspace]

# -- parse_cargo_messages --------------------------------------------------------------


def _artifact(name: str, kind: str, executable: str | None, *, test: bool = False) -> str:
    return json.dumps(
        {
            "reason": "compiler-artifact",
            "target": {"kind": [kind], "name": name},
            "profile": {"test": test},
            "filenames": [executable or f"/t/lib{name}.rlib"],
            "executable": executable,
            "fresh": False,
        }
    )


def _message(level: str, text: str, *, code: str | None = None, spans: list[dict[str, object]] | None = None) -> str:
    return json.dumps(
        {
            "reason": "compiler-message",
            "target": {"kind": ["bin"], "name": "tool"},
            "message": {
                "level": level,
                "message": text,
                "rendered": f"{level}: {text}\n",
                "code": {"code": code, "explanation": "..."} if code else None,
                "spans": spans or [],
            },
        }
    )


def _span(line: int, column: int, primary: bool, file: str = "src/main.rs") -> dict[str, object]:
    return {"file_name": file, "line_start": line, "column_start": column, "is_primary": primary}


def test_parse_cargo_messages_sorts_what_cargo_says() -> None:
    lines = [
        "   Compiling tool v0.1.0 (/w)",
        _artifact("dep", "lib", None),
        _artifact("build-script-build", "custom-build", None),
        _message("warning", "unused variable: `x`", spans=[_span(3, 9, True)]),
        _artifact("tool", "bin", "/w/target/release/tool"),
        _artifact("tool", "bin", "/w/target/debug/deps/tool-abc", test=True),  # a test harness
        _artifact("helper", "bin", "/w/target/release/helper"),
        '{"reason":"build-finished","success":true}',
        "{not json",
        "",
    ]
    diagnostics, executables, other = parse_cargo_messages(lines)
    assert executables == {"tool": Path("/w/target/release/tool"), "helper": Path("/w/target/release/helper")}
    assert diagnostics == [
        Diagnostic(
            level="warning",
            message="unused variable: `x`",
            code=None,
            file="src/main.rs",
            line=3,
            column=9,
            rendered="warning: unused variable: `x`\n",
            target="tool",
        )
    ]
    assert other == ["   Compiling tool v0.1.0 (/w)", "{not json", ""]


def test_forged_artifacts_are_refused_and_never_replace_a_real_one(tmp_path: Path) -> None:
    target = tmp_path / "target"
    real = target / "release" / "tool"
    real.parent.mkdir(parents=True)
    real.write_text("binary")
    secret = tmp_path / "id_rsa"
    secret.write_text("private")
    (target / "release" / "link").symlink_to(secret)
    lines = [
        _artifact("tool", "bin", str(real)),
        _artifact("tool", "bin", str(secret)),  # after the real one: must not replace it
        _artifact("../../x", "bin", str(real)),
        _artifact("stolen", "bin", str(secret)),
        _artifact("linked", "bin", str(target / "release" / "link")),
        _artifact("dir", "bin", str(target / "release")),
        _artifact("dotdot", "bin", str(target / "release" / ".." / ".." / "id_rsa")),
        '{"reason": "compiler-artifact", "target": "bin", "executable": "/x"}',
        '{"reason": "compiler-message", "message": "not an object"}',
    ]
    refused: list[str] = []
    _, executables, _ = parse_cargo_messages(lines, target_dir=target, refused=refused)
    assert executables == {"tool": real}
    assert len(refused) == 6
    assert "not a plain name" in refused[1]
    assert all("outside the target directory" in r for r in (refused[0], refused[2], refused[3], refused[5]))
    assert "not a regular file" in refused[4] or "outside" in refused[4]


def test_untrusted_artifact_refuses_a_symlinked_target_dir(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "release").mkdir(parents=True)
    (elsewhere / "release" / "tool").write_text("x")
    (tmp_path / "target").symlink_to(elsewhere)
    why = untrusted_artifact("tool", str(tmp_path / "target" / "release" / "tool"), tmp_path / "target")
    assert "is a symlink" in why
    assert untrusted_artifact("a b", "/x", None) != "" and untrusted_artifact("ok-name_1", "/x", None) == ""


def test_diagnostic_uses_the_primary_span() -> None:
    line = _message("error", "mismatched types", code="E0308", spans=[_span(2, 12, False), _span(2, 18, True)])
    [diagnostic], _, _ = parse_cargo_messages([line])
    assert (diagnostic.file, diagnostic.line, diagnostic.column, diagnostic.code) == ("src/main.rs", 2, 18, "E0308")
    assert str(diagnostic) == "src/main.rs:2: error[E0308]: mismatched types"


def test_diagnostic_without_spans() -> None:
    [diagnostic], _, _ = parse_cargo_messages([_message("error", "aborting due to 1 previous error")])
    assert (diagnostic.file, diagnostic.line, diagnostic.code) == (None, None, None)
    assert str(diagnostic) == "error: aborting due to 1 previous error"


# -- parse_test_output ----------------------------------------------------------------------

LIBTEST = """\
     Running unittests src/main.rs (target/debug/deps/tool-1f2e)

running 3 tests
test tests::adds ... ok
test tests::breaks ... FAILED
test tests::slow ... ignored

failures:

---- tests::breaks stdout ----
thread 'tests::breaks' panicked at src/main.rs:20:9:
assertion `left == right` failed

failures:
    tests::breaks

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s

     Running tests/it.rs (target/debug/deps/it-9a8b)

running 2 tests
test it_works ... ok
test nested::name::with spaces ... FAILED

test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s

   Doc-tests tool

running 1 test
test src/lib.rs - f (line 3) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.20s
"""


def test_parse_test_output_sums_every_suite() -> None:
    report = parse_test_output(LIBTEST.splitlines())
    assert (report.suites, report.passed, report.failed, report.ignored) == (3, 3, 2, 1)
    assert report.failures == ["tests::breaks", "nested::name::with spaces"]
    assert not report.ok


def test_parse_test_output_of_nothing() -> None:
    report = parse_test_output([])
    assert (report.suites, report.passed, report.failed, report.failures, report.ok) == (0, 0, 0, [], True)


# -- real cargo ----------------------------------------------------------------------------


def _cargo(registry: DirectoryRegistry) -> Cargo:
    return Cargo(registry, ProcessRunner())


def _check(
    ws: Workspace, registry: DirectoryRegistry, recorder: Recorder | None = None, *, run_tests: bool = True
) -> CheckResult:
    bus = (recorder or Recorder()).bus
    return check(
        ws.path, _cargo(registry), bus, policy=TreePolicy(), build_timeout=300, test_timeout=300, run_tests=run_tests
    )


@pytest.fixture(scope="module")
def tinyecho_checked(forked: Forked, session_registry: DirectoryRegistry) -> tuple[Workspace, CheckResult, Recorder]:
    recorder = Recorder()
    ws = forked("tinyecho")
    return ws, _check(ws, session_registry, recorder), recorder


@pytest.mark.cargo
def test_check_builds_the_release_binary(tinyecho_checked: tuple[Workspace, CheckResult, Recorder]) -> None:
    ws, result, _ = tinyecho_checked
    binary = result.build.binaries["tinyecho"]
    assert list(result.build.binaries) == ["tinyecho"]
    # flakebot's own target dir beside the workspace: no test running beside the build can reach it
    assert binary == release_target(ws.path) / "release" / "tinyecho"
    assert result.build.digests["tinyecho"] == hashlib.sha256(binary.read_bytes()).hexdigest()
    assert os.access(binary, os.X_OK)
    assert [d for d in result.build.diagnostics if d.level == "error"] == []


@pytest.mark.cargo
def test_check_runs_the_tests(tinyecho_checked: tuple[Workspace, CheckResult, Recorder]) -> None:
    _, result, _ = tinyecho_checked
    assert result.tests.ok
    assert result.tests.passed == 1 and result.tests.failed == 0
    assert result.tests.suites >= 1


@pytest.mark.cargo
def test_check_emits_build_and_test_stages(tinyecho_checked: tuple[Workspace, CheckResult, Recorder]) -> None:
    _, _, recorder = tinyecho_checked
    assert sorted(e.stage for e in recorder.of(StageStarted)) == ["build", "test"]
    finished = {e.stage: e for e in recorder.of(StageFinished)}
    assert finished["build"].status == "done" and finished["build"].detail == "tinyecho"
    assert finished["test"].status == "done" and finished["test"].detail == "1 passed, 0 failed, 0 ignored"


@pytest.mark.cargo
def test_real_cargo_messages_parse(
    tinyecho_checked: tuple[Workspace, CheckResult, Recorder], session_registry: DirectoryRegistry
) -> None:
    ws, result, _ = tinyecho_checked
    target = {"CARGO_TARGET_DIR": str(release_target(ws.path))}
    source = release_source(ws.path)  # the proven commit's files, as check() exported them
    cargo = _cargo(session_registry).for_release(ws.path, source)
    done = cargo.run(*BUILD_FLAGS, cwd=source, timeout=300, env=target, profile=RELEASE)  # fresh: cargo replays
    assert done.returncode == 0, done.stderr
    diagnostics, executables, other = parse_cargo_messages(done.stdout.splitlines())
    assert executables == result.build.binaries
    assert diagnostics == []
    assert other == []  # --message-format=json: every stdout line is a message


@pytest.mark.cargo
def test_check_without_tests(forked: Forked, session_registry: DirectoryRegistry) -> None:
    recorder = Recorder()
    result = _check(forked("lockpinned"), session_registry, recorder, run_tests=False)
    assert set(result.build.binaries) == {"lockpinned"}
    assert result.tests.suites == 0
    assert [e.stage for e in recorder.of(StageStarted)] == ["build"]


@pytest.mark.cargo
def test_compile_error_is_a_build_error_with_diagnostics(forked: Forked, session_registry: DirectoryRegistry) -> None:
    ws = forked("brokenbin")
    recorder = Recorder()
    with pytest.raises(BuildError) as caught:
        _check(ws, session_registry, recorder)
    error = caught.value
    assert type(error) is BuildError  # the build's failure wins over the test's
    [diagnostic] = error.diagnostics
    assert diagnostic.level == "error"
    assert diagnostic.code == "E0308"
    assert diagnostic.message == "mismatched types"
    assert (diagnostic.file, diagnostic.line, diagnostic.column) == ("src/main.rs", 2, 18)
    assert diagnostic.rendered.startswith("error[E0308]: mismatched types\n --> src/main.rs:2:18")
    assert diagnostic.target == "brokenbin"
    message = str(error)
    assert message.startswith("cargo build failed for brokenbin:\nerror[E0308]: mismatched types")
    assert f"The workspace is kept at {ws.path}" in message
    assert error.workspace == ws.path
    assert "--release" in error.command
    finished = {e.stage: e.status for e in recorder.of(StageFinished)}
    assert finished == {"build": "failed", "test": "failed"}


@pytest.mark.cargo
def test_failing_test_is_a_test_error_naming_it(forked: Forked, session_registry: DirectoryRegistry) -> None:
    ws = forked("failingtest")
    with pytest.raises(TestError) as caught:
        _check(ws, session_registry)
    error = caught.value
    assert error.failed == ["tests::breaks_on_purpose"]
    message = str(error)
    assert "cargo test: 1 failed, 1 passed in failingtest" in message
    assert "Failing: tests::breaks_on_purpose" in message
    assert "`flakebot cargo failingtest test`" in message  # in the sandbox, never unconfined
    assert error.workspace == ws.path and str(ws.path) in message
    assert "test" in error.command


@pytest.mark.cargo
def test_tests_that_do_not_compile_are_a_test_error(forked: Forked, session_registry: DirectoryRegistry) -> None:
    ws = forked("brokentest")
    with pytest.raises(TestError) as caught:
        _check(ws, session_registry)
    error = caught.value
    assert error.upstream  # unedited: the published crate's own tests
    assert "flakebot caused. The tests of brokentest do not compile:\nerror[E0308]" in str(error)
    assert [(d.code, d.file, d.line) for d in error.diagnostics] == [("E0308", "tests/it.rs", 3)]
    assert error.failed == []


# -- proofs kept by what they prove ---------------------------------------------------


class _Commands(ProcessRunner):
    """A real runner that keeps every command it ran (copies made by Cargo share the list)."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[list[str]] = []

    def run(self, args: Sequence[str | os.PathLike[str]], **kwargs: Any) -> Completed:
        self.commands.append([str(a) for a in args])
        return super().run(args, **kwargs)

    def cargo_tests(self) -> int:
        """How many times the crate's tests ran (``cargo test``; its ``--no-run`` compilation beside the release
        build runs none of them)."""
        return sum(
            1
            for argv in self.commands
            if "test" in argv and "--no-run" not in argv and any(a.endswith("cargo") for a in argv)
        )


def _proven(ws: Workspace, registry: DirectoryRegistry, store: ProofStore) -> tuple[CheckResult, Recorder, int]:
    runner, recorder = _Commands(), Recorder()
    result = check(
        ws.path,
        Cargo(registry, runner),
        recorder.bus,
        policy=TreePolicy(),
        build_timeout=300,
        test_timeout=300,
        proofs=store,
        git=Git(ws.path, runner),
    )
    return result, recorder, runner.cargo_tests()


@pytest.mark.cargo
def test_the_same_source_is_proven_once_whatever_its_name(
    forked: Forked, session_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    store = ProofStore(tmp_path / "proofs")
    first, _, tests_run = _proven(forked("tinyecho"), session_registry, store)
    assert tests_run == 1 and first.proof is not None and not first.proof.reused
    # the same crate under a new name, in a workspace of its own (as after `clean`: nothing built there)
    runner = ProcessRunner()
    cargo = Cargo(session_registry, runner)
    second = fork(
        session_registry.get("tinyecho"),
        session_registry,
        tmp_path / "ws",
        "echo-two",
        runner=runner,
        bus=EventBus(),
        cargo=cargo,
    )
    again, recorder, tests_run = _proven(second, session_registry, store)
    assert tests_run == 0  # no cargo test ran: the proof was found
    assert again.proof is not None and again.proof.reused and again.proof.proven_at == first.proof.proven_at
    assert (again.tests.passed, again.tests.failed) == (first.tests.passed, 0)
    finished = {e.stage: e for e in recorder.of(StageFinished)}
    assert finished["test"].status == "cached"
    assert f"proof reused: the same source was proven at {first.proof.proven_at}" in finished["test"].detail
    assert finished["build"].status == "done" and os.access(again.build.binaries["tinyecho"], os.X_OK)
    # a changed source is another key: proven again
    (second.path / "src" / "main.rs").write_text((second.path / "src" / "main.rs").read_text() + "\n// edited\n")
    changed, _, tests_run = _proven(second, session_registry, store)
    assert tests_run == 1 and changed.proof is not None and not changed.proof.reused
    assert changed.proof.key.source != first.proof.key.source and changed.proof.key.lock == first.proof.key.lock


#: a crate with a test of every kind ``cargo test`` runs: the library's, an ignored one, the binary's,
#: an integration test, a doc test (and an example, which it compiles); two ``should_panic`` tests pass only
#: with the debug profile's overflow checks and debug assertions on
_EVERY_KIND = Crate(
    "everytest",
    "0.1.0",
    '[package]\nname = "everytest"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\n',
    {
        "src/lib.rs": (
            "/// Doubles.\n///\n/// ```\n/// assert_eq!(everytest::double(2), 4);\n/// ```\n"
            "pub fn double(x: u32) -> u32 {\n    x * 2\n}\n\n"
            "#[cfg(test)]\nmod tests {\n    #[test]\n    fn doubles() {\n        assert_eq!(super::double(3), 6);\n    }\n\n"
            "    #[test]\n    #[ignore]\n    fn slow() {}\n\n    #[test]\n    #[should_panic]\n    fn overflows() {\n"
            "        let _ = super::double(u32::MAX);\n    }\n\n"
            "    #[test]\n    #[should_panic]\n    fn asserts() {\n        debug_assert!(super::double(0) == 1);\n    }\n}\n"
        ),
        "src/main.rs": (
            'fn main() {\n    println!("{}", everytest::double(21));\n}\n\n'
            "#[cfg(test)]\nmod tests {\n    #[test]\n    fn runs() {\n        assert_eq!(everytest::double(1), 2);\n    }\n}\n"
        ),
        "tests/it.rs": "#[test]\nfn from_outside() {\n    assert_eq!(everytest::double(5), 10);\n}\n",
        "examples/demo.rs": 'fn main() {\n    println!("{}", everytest::double(4));\n}\n',
    },
)


@pytest.mark.cargo
def test_the_proof_runs_the_same_tests_by_name_as_plain_cargo_test(tmp_path: Path) -> None:
    """check() runs every test the crate's own ``cargo test`` runs (names, not a count), in the debug profile
    (``should_panic`` on an overflow passes only with overflow checks on, on a ``debug_assert!`` only with debug
    assertions on), without incremental files when cold, whatever :data:`COLD_TEST_ENV` tunes."""
    registry = DirectoryRegistry(write_registry(tmp_path / "registry", [_EVERY_KIND]), tmp_path / "index")
    runner = ProcessRunner()
    cargo = Cargo(registry, runner)
    ws = fork(
        registry.get("everytest"), registry, tmp_path / "ws", "everytest", runner=runner, bus=EventBus(), cargo=cargo
    )
    result = check(ws.path, cargo, EventBus(), policy=TreePolicy(), build_timeout=300, test_timeout=300)
    # the crate as a user has it, tested by plain cargo outside flakebot (no sandbox, no flakebot settings)
    plain = tmp_path / "plain"
    write_crate(plain, _EVERY_KIND)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARGO")} | {"CARGO_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [cargo.executable, "test", "--offline", "--no-fail-fast"],
        cwd=plain / _EVERY_KIND.dirname,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    expected = parse_test_output(done.stdout.splitlines())
    assert len(expected.ran) == 7 and any("src/lib.rs - double" in name for name in expected.ran)  # the doc test
    assert sorted(result.tests.ran) == sorted(expected.ran)
    assert (result.tests.passed, result.tests.ignored) == (expected.passed, expected.ignored) == (6, 1)
    # both passed in the proof, so the crate's overflow checks and debug assertions were on
    panicked = {"tests::overflows - should panic", "tests::asserts - should panic"}
    assert panicked <= {name.split("::", 1)[1] for name in result.tests.ran}
    incremental = ws.path / "target" / "flakebot-test" / "debug" / "incremental"
    assert not incremental.exists() or not any(incremental.iterdir())
