"""Attacks on the edit tools' writes and reads: planted symlinks (the temp file, the target, a parent directory)
never redirect a write, or a read, outside the workspace.

The first tests drive the tools directly (``EditLoop._call``, the dispatcher
the loop uses for every tool call), with the symlinks in place, because in a
session the build policy already reverts outside symlinks after each check
run; the last one is the whole attack through a scripted session.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from editscripts import TINYHEX, TINYHEX_LIB, call, reply, tinyhex_done
from tinycrates import write_registry

from flakebot_magic.config import Settings
from flakebot_magic.edit import EditLoop, EditState
from flakebot_magic.edit.files import MAX_FILE_READ
from flakebot_magic.edit.session import engineer_channel
from flakebot_magic.events import EventBus
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.llm.budget import Budget
from flakebot_magic.llm.model import ModelConfig
from flakebot_magic.registry.base import Registry
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import Sandbox
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.testing.fake_openai import FakeOpenAIServer


@pytest.fixture
def canary(tmp_path: Path) -> tuple[Path, str]:
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "bashrc"
    token = secrets.token_hex(8)
    path.write_text(token)
    return path, token


@pytest.fixture
def loop(tmp_path: Path) -> EditLoop:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "0.1.0"\n')
    (root / "src" / "lib.rs").write_text("pub fn one() -> u8 { 1 }\n")
    runner = ProcessRunner()
    git = Git(root, runner)
    git.init("published")
    git.commit("Published source", all_files=True, force=True)
    model = ModelConfig.resolve("unused", base_url="http://127.0.0.1:9/v1")
    assert model is not None
    no_registry = cast(Registry, None)  # these tests call the file functions only: cargo never runs
    return _loop(root, model, cargo=Cargo(no_registry, runner), bus=EventBus([]), git=git, clippy=False)


def _loop(root: Path, model: ModelConfig, *, bus: EventBus, **options: Any) -> EditLoop:
    """An edit loop on ``root`` with the default settings' limits and budget (what a build gives it)."""
    settings = Settings()
    channel = engineer_channel(
        model, bus=bus, budget=Budget(settings.token_budget), limits=settings.reply_limits(), workspace=root
    )
    return EditLoop(root, channel, limits=settings.loop_limits(), bus=bus, **options)


def _tool(loop: EditLoop, name: str, **arguments: Any) -> str:
    return loop._call({"id": "c", "function": {"name": name, "arguments": json.dumps(arguments)}})


def test_a_planted_temp_file_symlink_is_never_followed(loop: EditLoop, canary: tuple[Path, str]) -> None:
    path, token = canary
    for name in ("lib.rs", "new.rs"):
        (loop.root / "src" / f".{name}.flakebot-tmp").symlink_to(path)
    assert _tool(loop, "write_file", path="src/lib.rs", content="pub fn two() {}\n").startswith("overwrote")
    assert _tool(loop, "write_file", path="src/new.rs", content="pub fn three() {}\n").startswith("created")
    assert _tool(loop, "replace_in_file", path="src/lib.rs", search="two", replace="four").startswith("replaced")
    assert path.read_text() == token
    assert (loop.root / "src" / "lib.rs").read_text() == "pub fn four() {}\n"
    assert not (loop.root / "src" / "lib.rs").is_symlink()


def test_a_target_that_became_a_symlink_is_refused_and_the_canary_kept(
    loop: EditLoop, canary: tuple[Path, str]
) -> None:
    path, token = canary
    (loop.root / "src" / "lib.rs").unlink()
    (loop.root / "src" / "lib.rs").symlink_to(path)
    for answer in (
        _tool(loop, "write_file", path="src/lib.rs", content="pwned"),
        _tool(loop, "replace_in_file", path="src/lib.rs", search=token, replace="pwned"),
        _tool(loop, "delete_file", path="src/lib.rs"),
        _tool(loop, "read_file", path="src/lib.rs"),
    ):
        assert answer.startswith("error: refused:"), answer
        assert token not in answer
    assert path.read_text() == token


def test_a_parent_directory_symlink_is_refused_inside_or_out(loop: EditLoop, canary: tuple[Path, str]) -> None:
    path, token = canary
    (loop.root / "src" / "bin").symlink_to(path.parent)
    (loop.root / "src" / "alias").symlink_to(loop.root / "src")  # stays inside, but a write never goes through a link
    for target in ("src/bin/bashrc", "src/bin/new.rs", "src/alias/lib.rs"):
        answer = _tool(loop, "write_file", path=target, content="pwned")
        assert answer.startswith("error: refused:"), (target, answer)
    assert path.read_text() == token and sorted(os.listdir(path.parent)) == ["bashrc"]
    assert (loop.root / "src" / "lib.rs").read_text() == "pub fn one() -> u8 { 1 }\n"


def test_reads_are_capped_and_never_follow_a_device_or_fifo(loop: EditLoop) -> None:
    (loop.root / "src" / "zero.rs").symlink_to("/dev/zero")  # resolves outside: refused
    assert _tool(loop, "read_file", path="src/zero.rs").startswith("error: refused:")
    os.mkfifo(loop.root / "src" / "pipe.rs")
    assert _tool(loop, "read_file", path="src/pipe.rs").startswith("error: refused:")  # never opened: it would block
    big = loop.root / "src" / "big.rs"
    with big.open("wb") as handle:
        handle.truncate(MAX_FILE_READ * 2)  # sparse: large on paper, nothing on disk
    answer = _tool(loop, "read_file", path="src/big.rs", start_line=1, end_line=1)
    assert answer.startswith("src/big.rs")
    assert "cannot be edited here" in _tool(loop, "replace_in_file", path="src/big.rs", search="a", replace="b")
    listing = _tool(loop, "list_files", path="src")
    assert "pipe.rs (0 lines)" in listing and "zero.rs (0 lines)" in listing


def test_the_edit_state_is_written_atomically_past_a_planted_symlink(loop: EditLoop, canary: tuple[Path, str]) -> None:
    path, token = canary
    state_file = loop.root / ".git" / "flakebot-edit.json"
    state_file.symlink_to(path)
    assert EditState.load(loop.root).sessions == []  # not read through the link
    EditState(sessions=[{"request": "x"}]).save(loop.root)
    assert path.read_text() == token and not state_file.is_symlink()
    assert EditState.load(loop.root).sessions == [{"request": "x"}]


# -- the whole attack, through a session -------------------------------------------------------


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    registry = DirectoryRegistry(
        write_registry(tmp_path_factory.mktemp("registry"), [TINYHEX]), tmp_path_factory.mktemp("index")
    )
    yield registry
    registry.close()


@pytest.mark.cargo
def test_symlinks_a_test_plants_never_redirect_the_models_next_write(
    hex_registry: DirectoryRegistry,
    tmp_path: Path,
    canary: tuple[Path, str],
    fake_openai: Callable[..., FakeOpenAIServer],
) -> None:
    from flakebot_magic.stages.fork import fork

    path, token = canary
    plant = (
        '        let dir = env!("CARGO_MANIFEST_DIR");\n'
        f'        let canary = "{path}";\n'
        '        std::os::unix::fs::symlink(canary, format!("{}/src/.main.rs.flakebot-tmp", dir)).ok();\n'
        '        std::os::unix::fs::symlink(canary, format!("{}/src/main.rs", dir)).ok();\n'
        f'        std::os::unix::fs::symlink("{path.parent}", format!("{{}}/src/bin", dir)).ok();'
    )
    hostile = TINYHEX_LIB.replace(
        "mod tests {\n", f"mod tests {{\n    #[test]\n    fn plants() {{\n{plant}\n    }}\n\n"
    )
    runner = ProcessRunner()
    bus = EventBus([])
    workspace = fork(
        hex_registry.get("tinyhex"),
        hex_registry,
        tmp_path / "workspaces",
        "tinyhex",
        runner=runner,
        bus=bus,
        cargo=Cargo(hex_registry, runner),
    )
    done = tinyhex_done()
    server = fake_openai(
        [
            reply(call("write_file", path="src/lib.rs", content=hostile), call("run_checks")),
            reply(call("write_file", path="src/bin/extra.rs", content="fn main() {}\n"), *done[0]["tool_calls"]),
            done[1],
        ]
    )
    model = ModelConfig.resolve("scripted", base_url=server.base_url, timeout=5.0)
    assert model is not None
    loop = _loop(
        workspace.path,
        model,
        bus=bus,
        git=Git(workspace.path, runner),
        crate=workspace.crate,
        cargo=Cargo(hex_registry, runner, Sandbox(workspace.path)),
        clippy=False,
    )
    outcome = loop.run("print standard input as hex")
    assert path.read_text() == token and sorted(os.listdir(path.parent)) == ["bashrc"]
    assert outcome.contract.bin == "tinyhex"
    # the test really planted them (the sandbox lets it write the workspace); the policy reverted them
    report = next(
        m["content"] for m in server.requests[1]["messages"] if m["role"] == "tool" and "Check run 1" in m["content"]
    )
    assert "src/main.rs: a symlink pointing outside the crate" in report and "src/bin: a symlink" in report
    main = workspace.path / "src" / "main.rs"
    assert not main.is_symlink() and "tinyhex::to_hex" in main.read_text()
    assert not (workspace.path / "src" / "bin").is_symlink()
    assert Git(workspace.path, runner).is_dirty() is False
