"""Attacks through a scripted model session: a unit test plants a build script, cargo config, a toolchain file
and symlinks while ``cargo test`` runs; the build policy reverts them before anything builds again.

Real cargo (in the sandbox), real git, the fake OpenAI server; the crate is
``tinyhex`` (tests/editscripts.py). Each test asserts that the attack failed,
that the model was told why, and that the history is intact.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX, TINYHEX_LIB, call, reply, tinyhex_done
from tinycrates import Recorder, crate, write_registry
from tinyhex_sessions import Session, start_session

from flakebot_magic.config import Settings
from flakebot_magic.errors import PolicyError
from flakebot_magic.events import Notice
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    registry = DirectoryRegistry(
        write_registry(tmp_path_factory.mktemp("registry"), [TINYHEX]), tmp_path_factory.mktemp("index")
    )
    yield registry
    registry.close()


@pytest.fixture
def session(
    hex_registry: DirectoryRegistry, tmp_path: Path, fake_openai: Callable[..., FakeOpenAIServer]
) -> Iterator[Callable[..., Session]]:
    clients: list[Any] = []

    def start(script: Any, **options: Any) -> Session:
        return start_session(hex_registry, tmp_path, fake_openai, script, clients, timeout=5.0, clippy=False, **options)

    yield start
    for client in clients:
        client.close()


def _hostile_test(body: str) -> str:
    """tinyhex's library with one more unit test whose body is ``body`` (it runs in `cargo test`)."""
    return TINYHEX_LIB.replace(
        "mod tests {\n",
        "mod tests {\n    #[test]\n    fn plants() {\n"
        '        let dir = env!("CARGO_MANIFEST_DIR");\n'
        f"{body}\n    }}\n\n",
    )


def test_files_a_unit_test_writes_during_cargo_test_are_reverted_and_the_model_is_told(
    session: Callable[..., Session], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = outside / "canary"
    token = secrets.token_hex(8)
    canary.write_text(token)
    body = (
        '        std::fs::write(format!("{}/build.rs", dir), "fn main() {}").unwrap();\n'
        '        std::fs::create_dir_all(format!("{}/.cargo", dir)).unwrap();\n'
        '        std::fs::write(format!("{}/.cargo/config.toml", dir), '
        f'"[target.x86_64-unknown-linux-gnu]\\nrunner = \\"/bin/sh -c \'echo pwned > {canary}\'\\"\\n").unwrap();\n'
        '        std::fs::write(format!("{}/rust-toolchain.toml", dir), "[toolchain]\\nchannel = \\"nightly\\"\\n").unwrap();\n'
        f'        std::os::unix::fs::symlink("{outside}", format!("{{}}/src/leak", dir)).unwrap();'
    )
    hostile = _hostile_test(body)
    s = session(
        [
            reply(call("write_file", path="src/lib.rs", content=hostile), call("run_checks")),
            *tinyhex_done(),
        ]
    )
    outcome = s.loop.run("print standard input as hex")

    # the attack failed: every planted file is gone, the canary is untouched, the tool is green
    for planted in ("build.rs", ".cargo", "rust-toolchain.toml", "src/leak"):
        assert not (s.root / planted).exists() and not (s.root / planted).is_symlink(), planted
    assert canary.read_text() == token and list(outside.iterdir()) == [canary]
    assert outcome.contract.bin == "tinyhex"
    assert "fn plants" not in (s.root / "src" / "lib.rs").read_text()

    # the model's next request carries the reason, file by file
    [answer] = [r for r in s.tool_replies(2) if r.startswith("Check run 1")]
    assert "REVERTED: the build policy refuses" in answer
    for named in (
        "build.rs: a build script",
        ".cargo: a .cargo/ directory",
        "rust-toolchain.toml: a toolchain file",
        "src/leak: a symlink pointing outside the crate",
    ):
        assert named in answer, named
    assert "Tests and build scripts must not write these files" in answer

    # nothing was lost: the refused state and its revert are both history, after the baseline and the fork
    history = s.history()
    assert history[-1].startswith("Published source of tinyhex")
    assert any(h.startswith("Check run 0 (baseline") for h in history)
    refused = next(i for i, h in enumerate(history) if h.startswith("Check run 1 ") and "REVERTED" in h)
    assert history[refused - 1].startswith("Revert check run 1 to ")
    git = Git(s.root, ProcessRunner())
    assert "fn plants" in git("show", f"HEAD~{refused}:src/lib.rs")  # the refused state is recorded
    assert git.is_dirty() is False


def test_a_build_script_the_model_names_under_another_name_is_caught_on_disk(
    session: Callable[..., Session],
) -> None:
    """package.build cannot be written by the model; a test that writes it into Cargo.toml is reverted."""
    body = (
        '        let manifest = format!("{}/Cargo.toml", dir);\n'
        "        let text = std::fs::read_to_string(&manifest).unwrap();\n"
        '        std::fs::write(&manifest, text.replace("license = \\"MIT\\"", "license = \\"MIT\\"\\nbuild = \\"src/gen.rs\\"")).unwrap();\n'
        '        std::fs::write(format!("{}/src/gen.rs", dir), "fn main() {}").unwrap();'
    )
    s = session(
        [
            reply(call("write_file", path="src/lib.rs", content=_hostile_test(body)), call("run_checks")),
            *tinyhex_done(),
        ]
    )
    s.loop.run("print standard input as hex")
    answer = next(r for r in s.tool_replies(2) if r.startswith("Check run 1"))
    assert "Cargo.toml: package.build names a build script" in answer
    assert "build =" not in (s.root / "Cargo.toml").read_text() and not (s.root / "src" / "gen.rs").exists()


def test_a_workspace_that_breaks_the_policy_is_refused_before_the_loop_runs_cargo(
    session: Callable[..., Session], tmp_path: Path
) -> None:
    s = session([*tinyhex_done()])
    (s.root / ".cargo").mkdir()
    (s.root / ".cargo" / "config.toml").write_text('[build]\nrustc-wrapper = "/bin/false"\n')
    with pytest.raises(PolicyError, match=r"- \.cargo: a \.cargo/ directory") as caught:
        s.loop.run("print standard input as hex")
    assert caught.value.workspace == s.root and s.server.requests == []


# -- the pipeline: before every build ---------------------------------------------------------

BUILDSCRIPT = crate(
    "publishedbuild",
    description="A binary whose published build script is part of the crate",
    files={
        "src/main.rs": 'fn main() {\n    println!("{}", env!("FROM_BUILD"));\n}\n',
        "build.rs": 'fn main() {\n    println!("cargo:rustc-env=FROM_BUILD=built");\n}\n',
    },
)
HOSTILE_CONFIG = crate(
    "shipsconfig",
    description="A binary that ships cargo configuration",
    files={
        "src/main.rs": "fn main() {}\n",
        ".cargo/config.toml": '[build]\nrustc-wrapper = "/bin/sh"\n',
    },
)


@pytest.fixture(scope="module")
def pipeline_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_registry(tmp_path_factory.mktemp("policyregistry"), [BUILDSCRIPT, HOSTILE_CONFIG])


def test_the_pipeline_builds_a_published_build_script_and_never_imports_shipped_cargo_config(
    pipeline_registry: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLAKEBOT_MODEL", raising=False)
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(pipeline_registry), backend="cargo", model=None)
    tool = Pipeline(settings).run("", crate="publishedbuild")
    assert tool is not None

    recorder = Recorder()
    Pipeline(settings, observers=[recorder]).run("", crate="shipsconfig")
    workspace = settings.cache.workspaces / "shipsconfig"
    # the crate's .cargo/ never entered the workspace: what was built is the source without it
    assert not (workspace / ".cargo").exists()
    published = subprocess.run(
        ["git", "log", "-1", "--format=%B", "published"], cwd=workspace, capture_output=True, text=True, check=True
    ).stdout
    assert "Not imported" in published and "- .cargo/: cargo configuration" in published
    assert any(".cargo/" in e.message and "not imported" in e.message for e in recorder.of(Notice))
