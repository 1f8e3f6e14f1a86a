"""A cold proof in the release build's target dir (stages/shared_profile.py): what it reuses, what it proves,
and that no test can change what ships.

One real crate, ``sharedroot``, with a normal dependency, a dev-dependency, a
binary and an integration test that rewrites every release binary it can
reach, checked once by :func:`~flakebot_magic.stages.build.check` (module
fixture), then taken apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tinycrates import Crate, write_registry

from flakebot_magic.events import EventBus
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import Completed, ProcessRunner
from flakebot_magic.records.proofs import ProofStore
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import release_target, sealed_binaries
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.diagnostics import parse_test_output
from flakebot_magic.sandbox.policy import TreePolicy
from flakebot_magic.stages.build import CheckResult, check
from flakebot_magic.stages.deploy import deploy
from flakebot_magic.stages.fork import Workspace, fork
from flakebot_magic.stages.shared_profile import PROOF_FLAGS

pytestmark = pytest.mark.cargo


def _lib(name: str, body: str) -> Crate:
    return Crate(
        name, "0.1.0", f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n', {"src/lib.rs": body}
    )


#: the integration test's attack: every path where a release binary might be, from inside the sandbox, rewritten
_TAMPER = """
use std::path::PathBuf;

#[test]
fn rewrites_the_release_binary() {
    let exe = std::env::current_exe().unwrap();
    let release: PathBuf = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let mut candidates = vec![release.join("sharedroot"), PathBuf::from(env!("CARGO_BIN_EXE_sharedroot"))];
    // the sealed copy's place, beside the target dir (not shown to the sandbox: this write must fail)
    candidates.push(release.parent().unwrap().parent().unwrap().join("sealed").join("sharedroot"));
    let mut done = 0;
    for path in candidates {
        let _ = std::fs::remove_file(&path);
        if std::fs::write(&path, b"#!/bin/sh\\necho TAMPERED\\n").is_ok() {
            println!("TAMPERED {}", path.display());
            done += 1;
        }
    }
    assert!(done >= 1, "the test could not reach the release target dir at all");
    // and something a later release build in this target dir might pick up
    std::fs::write(release.join("poison"), b"planted by a test").unwrap();
}
"""

_ROOT = Crate(
    "sharedroot",
    "0.1.0",
    '[package]\nname = "sharedroot"\nversion = "0.1.0"\nedition = "2021"\n\n'
    '[dependencies]\nshareddep = "0.1"\n\n[dev-dependencies]\ndevonly = "0.1"\n',
    {
        "src/lib.rs": (
            "/// Doubles.\n///\n/// ```\n/// assert_eq!(sharedroot::double(2), 4);\n/// ```\n"
            "pub fn double(x: u32) -> u32 {\n    shareddep::times(x, 2)\n}\n\n"
            "pub fn twice(x: u32) -> u32 {\n    x * 2\n}\n\n"
            "#[cfg(test)]\nmod tests {\n"
            "    #[test]\n    fn doubles() {\n        assert_eq!(super::double(3), devonly::six());\n    }\n\n"
            "    #[test]\n    #[should_panic]\n    fn overflows() {\n        let _ = super::twice(u32::MAX);\n    }\n\n"
            "    #[test]\n    #[should_panic]\n    fn asserts() {\n        debug_assert!(super::twice(0) == 1);\n    }\n}\n"
        ),
        "src/main.rs": 'fn main() {\n    println!("{}", sharedroot::double(21));\n}\n',
        "tests/tamper.rs": _TAMPER,
    },
)
_CRATES = [
    _ROOT,
    _lib("shareddep", "pub fn times(x: u32, by: u32) -> u32 {\n    x.wrapping_mul(by)\n}\n"),
    _lib("devonly", "pub fn six() -> u32 {\n    6\n}\n"),
]


class _Outputs(ProcessRunner):
    """A real runner that keeps what every command printed (copies made by Cargo share the list)."""

    def __init__(self) -> None:
        super().__init__()
        self.done: list[Completed] = []

    def run(self, args: Sequence[str | os.PathLike[str]], **kwargs: Any) -> Completed:
        completed = super().run(args, **kwargs)
        self.done.append(completed)
        return completed

    def cargo(self, subcommand: str) -> list[Completed]:
        return [c for c in self.done if subcommand in [str(a) for a in c.args] and "--message-format=json" in c.args]


@dataclass
class _Proven:
    ws: Workspace
    result: CheckResult
    runner: _Outputs
    tmp: Path
    cargo: str


@pytest.fixture(scope="module")
def proven(tmp_path_factory: pytest.TempPathFactory) -> _Proven:
    tmp = tmp_path_factory.mktemp("shared")
    registry = DirectoryRegistry(write_registry(tmp / "registry", _CRATES), tmp / "index")
    runner = _Outputs()
    cargo = Cargo(registry, runner)
    ws = fork(
        registry.get("sharedroot"), registry, tmp / "ws", "sharedroot", runner=runner, bus=EventBus(), cargo=cargo
    )
    result = check(
        ws.path,
        cargo,
        EventBus(),
        policy=TreePolicy(),
        build_timeout=300,
        test_timeout=300,
        proofs=ProofStore(tmp / "proofs"),
        git=Git(ws.path, runner),
    )
    return _Proven(ws, result, runner, tmp, cargo.executable)


def _artifacts(done: Completed) -> list[dict[str, Any]]:
    return [
        m
        for m in (json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))
        if m.get("reason") == "compiler-artifact"
    ]


def test_a_test_cannot_change_the_binary_that_ships(proven: _Proven) -> None:
    """The tests ran in the release build's target dir and rewrote its binary there (cargo itself puts the test
    profile's binary there too); what check() hands the deploy is the copy sealed before any test ran."""
    ws, result, runner, tmp = proven.ws, proven.result, proven.runner, proven.tmp
    assert result.tests.passed == 5 and result.tests.failed == 0  # the attacking test passed: it wrote
    assert b"TAMPERED" in (release_target(ws.path) / "release" / "sharedroot").read_bytes()  # the attack landed
    binary = result.build.binaries["sharedroot"]
    assert binary == sealed_binaries(ws.path) / "sharedroot"
    assert result.build.digests["sharedroot"] == hashlib.sha256(binary.read_bytes()).hexdigest()
    (built,) = runner.cargo("build")
    (made,) = [a["executable"] for a in _artifacts(built) if a.get("executable")]
    assert made == str(release_target(ws.path) / "release" / "sharedroot")
    ran = subprocess.run([binary], capture_output=True, text=True, timeout=30, check=True)
    assert ran.stdout == "42\n"
    stored = deploy(tmp / "store", "k", "sharedroot", "0.1.0", result.build.binaries, {}, digests=result.build.digests)
    shipped = stored.bin("sharedroot")
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == result.build.digests["sharedroot"]


def test_a_release_build_never_starts_from_a_target_dir_tests_ran_in(proven: _Proven, tmp_path: Path) -> None:
    """The tests could have rewritten any unit there (a dev-dependency is no writer of a release build): the next
    release build of the workspace empties it first."""
    ws = proven.ws
    poison = release_target(ws.path) / "release" / "poison"
    assert poison.read_bytes() == b"planted by a test"
    again = check(
        ws.path,
        Cargo(DirectoryRegistry(proven.tmp / "registry", tmp_path / "index"), ProcessRunner()),
        EventBus(),
        policy=TreePolicy(),
        build_timeout=300,
        test_timeout=300,
        run_tests=False,
    )
    assert not poison.exists()
    assert again.build.digests == proven.result.build.digests  # the same binary, built from scratch


def test_the_tests_reuse_every_release_unit_and_compile_the_crate_as_cargo_test_does(
    proven: _Proven,
) -> None:
    result, runner = proven.result, proven.runner
    (built,) = runner.cargo("build")
    (tested,) = runner.cargo("test")
    released = {a["package_id"] for a in _artifacts(built)}
    units = _artifacts(tested)
    normal = [a for a in units if "shareddep" in a["package_id"]]
    assert normal and all(a["fresh"] for a in normal)  # compiled once, by the release build
    assert all(a["profile"]["opt_level"] == "3" for a in normal)  # tested as it ships
    dev = [a for a in units if "devonly" in a["package_id"]]
    assert dev and {a["package_id"] for a in dev}.isdisjoint(released)
    assert all(a["profile"]["opt_level"] == "0" and not a["fresh"] for a in dev)
    own = [a for a in units if a["package_id"].startswith("path+")]
    assert own and all(
        (a["profile"]["opt_level"], a["profile"]["debug_assertions"], a["profile"]["overflow_checks"])
        == ("0", True, True)
        for a in own
    )
    # the lint cap reached rustc and rustdoc; the proof's key names the profile
    assert "--release" in tested.args and any("build.rustdocflags" in str(a) for a in tested.args)
    assert result.proof is not None and set(PROOF_FLAGS) <= set(result.proof.key.flags)


def test_the_shared_proof_runs_every_test_of_plain_cargo_test(
    proven: _Proven,
) -> None:
    """The same tests by name as the crate's own ``cargo test`` outside flakebot (which also has debug assertions and
    overflow checks: the two ``should_panic`` tests pass only with them)."""
    ws, result, tmp = proven.ws, proven.result, proven.tmp
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARGO")} | {
        "CARGO_HOME": str(tmp / "home"),
        "CARGO_TARGET_DIR": str(tmp / "plain-target"),
    }
    (tmp / "home").mkdir(exist_ok=True)
    (tmp / "home" / "config.toml").write_text(
        f'[source.crates-io]\nreplace-with = "tiny"\n[source.tiny]\ndirectory = "{tmp / "registry"}"\n'
    )
    done = subprocess.run(
        [proven.cargo, "test", "--offline"],
        cwd=ws.path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    expected = parse_test_output(done.stdout.splitlines())
    # plain cargo test ran the tamper test against its own debug build, outside any sandbox: it passes too
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(expected.ran) == 5 and sorted(result.tests.ran) == sorted(expected.ran)
    assert {"tests::overflows - should panic", "tests::asserts - should panic"} <= {
        name.split("::", 1)[1] for name in result.tests.ran
    }
