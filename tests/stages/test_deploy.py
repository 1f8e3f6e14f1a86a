"""The deploy stage: store keys from real git trees, atomic store entries, and the pipeline's cache."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
from pathlib import Path

import pytest
from tinycrates import Recorder

from flakebot_magic.clients.cli import CliTool as Tool
from flakebot_magic.config import Settings
from flakebot_magic.errors import BuildError, DeployError
from flakebot_magic.events import StageFinished
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest, RunFlags
from flakebot_magic.stages.build import BUILD_FLAGS, proof_key
from flakebot_magic.stages.deploy import StorePath, deploy, lookup, store_key

RUSTC = "rustc 1.95.0 (59807616e 2026-04-14)\nhost: x86_64-unknown-linux-gnu"
SOURCES = {
    "Cargo.toml": '[package]\nname = "t"\nversion = "0.1.0"\n',
    "src/main.rs": "fn main() {}\n",
    "Cargo.lock": "version = 3\n",
}


def _repo(root: Path, files: dict[str, str] = SOURCES, message: str = "Published source") -> Git:
    root.mkdir(parents=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = Git(root, ProcessRunner())
    git.init("published")
    git.commit(message, all_files=True)
    return git


def _key(git: Git) -> str:
    return store_key(git, RUSTC, BUILD_FLAGS)


# -- store_key ---------------------------------------------------------------------


def test_same_inputs_give_the_same_key(tmp_path: Path) -> None:
    # a different history (message, time) with the same tree: the same key
    one = _repo(tmp_path / "one")
    two = _repo(tmp_path / "two", message="something else entirely")
    assert _key(one) == _key(two)
    assert len(_key(one)) == 32 and int(_key(one), 16) >= 0


def test_a_changed_file_changes_the_key(tmp_path: Path) -> None:
    one = _repo(tmp_path / "one")
    two = _repo(tmp_path / "two", {**SOURCES, "src/main.rs": 'fn main() { println!("hi"); }\n'})
    three = _repo(tmp_path / "three", {**SOURCES, "Cargo.lock": "version = 4\n"})
    assert len({_key(one), _key(two), _key(three)}) == 3


def test_a_dirty_working_tree_changes_the_key(tmp_path: Path) -> None:
    git = _repo(tmp_path / "repo")
    clean = _key(git)
    (git.root / "src" / "main.rs").write_text("fn main() { loop {} }\n")
    edited = _key(git)
    (git.root / "src" / "main.rs").write_text("fn main() { loop { break } }\n")
    edited_again = _key(git)
    assert len({clean, edited, edited_again}) == 3
    git.commit("the edit", all_files=True)
    assert _key(git) not in (clean, edited)  # committed, the tree itself differs
    (git.root / "src" / "extra.rs").write_text("")  # an untracked file can be a module
    assert _key(git) != _key(_repo(tmp_path / "plain"))


@pytest.mark.parametrize("ignored", [False, True])
@pytest.mark.parametrize("where", ["data.txt", "src/extra.rs", "tests/it.rs"])
def test_every_byte_cargo_could_read_is_in_the_key(tmp_path: Path, where: str, ignored: bool) -> None:
    """A file git does not track, ignored or not, keys by its content (the fresh red team's b03: `include_str!`
    of an ignored file, or an untracked module, changed while the proof and store keys stayed)."""
    git = _repo(tmp_path / "repo", {**SOURCES, ".gitignore": f"/{where}\n" if ignored else ""})
    path = git.root / where
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = set()
    for text in ("one", "two", ""):
        path.write_text(text)
        keys.add(_key(git))
        assert proof_key(git.root, git, "rustc", ()).digest() == proof_key(git.root, git, "rustc", ()).digest()
    proofs = set()
    for text in ("one", "two"):
        path.write_text(text)
        proofs.add(proof_key(git.root, git, "rustc", ()).digest())
    assert len(keys) == 3 and len(proofs) == 2


def test_build_outputs_do_not_change_the_key(tmp_path: Path) -> None:
    git = _repo(tmp_path / "repo")
    before = _key(git)
    (git.root / "target" / "release").mkdir(parents=True)
    (git.root / "target" / "release" / "t").write_text("binary")
    (git.root / "result").symlink_to(git.root / "target")
    assert _key(git) == before


def test_flake_files_do_not_change_the_key(tmp_path: Path) -> None:
    git = _repo(tmp_path / "repo")
    before = _key(git)
    (git.root / "flake.nix").write_text("{ outputs = _: { }; }\n")
    (git.root / "flake.lock").write_text("{}\n")
    git.commit("Add flake.nix", ["flake.nix", "flake.lock"])
    assert _key(git) == before
    (git.root / "flake.nix").write_text("{ outputs = _: { x = 1; }; }\n")
    git.commit("Change flake.nix", ["flake.nix"])
    assert _key(git) == before


def test_an_uncommitted_flake_edit_does_not_change_the_key(tmp_path: Path) -> None:
    git = _repo(tmp_path / "repo")
    (git.root / "flake.nix").write_text("{ outputs = _: { }; }\n")
    git.commit("Add flake.nix", ["flake.nix"])
    before = _key(git)
    (git.root / "flake.nix").write_text("{ outputs = _: { edited = true; }; }\n")
    assert _key(git) == before


def test_toolchain_and_flags_change_the_key(tmp_path: Path) -> None:
    git = _repo(tmp_path / "repo")
    keys = {
        store_key(git, RUSTC, BUILD_FLAGS),
        store_key(git, RUSTC.replace("1.95.0", "1.96.0"), BUILD_FLAGS),
        store_key(git, RUSTC, (*BUILD_FLAGS, "--features=x")),
        store_key(git, RUSTC, BUILD_FLAGS, backend="nix"),
    }
    assert len(keys) == 4


# -- deploy and lookup ------------------------------------------------------------------


def _binary(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {text}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def built(tmp_path: Path) -> dict[str, Path]:
    return {
        "tool": _binary(tmp_path / "target" / "tool", "tool"),
        "helper": _binary(tmp_path / "target" / "helper", "helper"),
    }


KEY = "0123456789abcdef0123456789abcdef"


def test_deploy_writes_a_complete_entry(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    entry = deploy(store, KEY, "tool", "1.0.0", built, {"crate": "tool", "commit": "abc"})
    assert entry == StorePath(store / f"{KEY}-tool-1.0.0", KEY)
    assert str(entry) == str(store / f"{KEY}-tool-1.0.0")
    assert sorted(p.name for p in (entry.path / "bin").iterdir()) == ["helper", "tool"]
    assert stat.S_IMODE(entry.bin("tool").stat().st_mode) == 0o555
    assert subprocess.run([entry.bin("tool")], capture_output=True, text=True, check=True).stdout == "tool\n"
    assert entry.manifest == {
        "crate": "tool",
        "commit": "abc",
        "hash": KEY,
        "binaries": ["helper", "tool"],
        # what identifies each deployed binary: a cache hit and the doctor check it
        "digests": {
            name: {
                "size": entry.bin(name).stat().st_size,
                "sha256": hashlib.sha256(entry.bin(name).read_bytes()).hexdigest(),
            }
            for name in ("helper", "tool")
        },
        "format": 1,
        "tools": {},
    }
    assert sorted(p.name for p in store.iterdir()) == [entry.path.name]  # no staging left behind


def test_lookup_finds_only_complete_entries(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    assert lookup(store, KEY, "tool", "1.0.0") is None
    deployed = deploy(store, KEY, "tool", "1.0.0", built, {})
    assert lookup(store, KEY, "tool", "1.0.0") == deployed
    assert lookup(store, KEY, "tool", "1.0.1") is None
    assert lookup(store, "f" * 32, "tool", "1.0.0") is None
    partial = store / f"{'e' * 32}-tool-1.0.0"
    (partial / "bin").mkdir(parents=True)  # a crash before the manifest: not an entry
    assert lookup(store, "e" * 32, "tool", "1.0.0") is None


def test_a_failed_deploy_leaves_nothing_behind(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    with pytest.raises(DeployError, match="Could not write the store entry") as caught:
        deploy(store, KEY, "tool", "1.0.0", {**built, "zzz": tmp_path / "missing"}, {})
    assert isinstance(caught.value.__cause__, OSError)
    assert list(store.iterdir()) == []
    assert lookup(store, KEY, "tool", "1.0.0") is None


def test_a_failed_redeploy_keeps_the_old_entry(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    old = deploy(store, KEY, "tool", "1.0.0", built, {"n": 1})
    with pytest.raises(DeployError):
        deploy(store, KEY, "tool", "1.0.0", {"tool": tmp_path / "missing"}, {"n": 2})
    assert lookup(store, KEY, "tool", "1.0.0") == old
    assert old.manifest["n"] == 1
    assert [p.name for p in store.iterdir()] == [old.path.name]


def test_deploy_refuses_a_symlinked_binary_and_a_path_like_name(tmp_path: Path, built: dict[str, Path]) -> None:
    secret = tmp_path / "id_rsa"
    secret.write_text("private")
    link = tmp_path / "target" / "link"
    link.symlink_to(secret)
    store = tmp_path / "store"
    with pytest.raises(DeployError, match="it is a symlink"):
        deploy(store, KEY, "tool", "1.0.0", {"tool": link}, {})
    with pytest.raises(DeployError, match=r"Refusing to deploy a binary named '\.\./\.\./x'"):
        deploy(store, KEY, "tool", "1.0.0", {"../../x": built["tool"]}, {})
    assert list(store.iterdir()) == []
    assert not (tmp_path / "x").exists()


def test_deploy_without_binaries_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="built no binaries, so there is nothing to deploy"):
        deploy(tmp_path / "store", KEY, "tool", "1.0.0", {}, {})


def test_redeploy_replaces_the_entry(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    first = deploy(store, KEY, "tool", "1.0.0", built, {"n": 1})
    _binary(built["tool"], "rebuilt")
    again = deploy(store, KEY, "tool", "1.0.0", {"tool": built["tool"]}, {"n": 2})
    assert again == first
    assert again.manifest["n"] == 2 and again.manifest["binaries"] == ["tool"]
    assert not again.bin("helper").exists()
    assert subprocess.run([again.bin("tool")], capture_output=True, text=True).stdout == "rebuilt\n"


# -- through the pipeline -----------------------------------------------------------------


def _statuses(recorder: Recorder) -> dict[str, str]:
    return {e.stage: e.status for e in recorder.of(StageFinished)}


@pytest.mark.cargo
def test_a_second_run_is_served_from_the_store(tinyecho_tool: Tool, session_registry: DirectoryRegistry) -> None:
    settings = Settings(cache_dir=tinyecho_tool.store_path.parents[1], registry=str(session_registry.path))
    recorder = Recorder()
    again = Pipeline(settings, observers=[recorder]).run("", crate="tinyecho")
    assert again.store_path == tinyecho_tool.store_path
    assert again.source_hash == tinyecho_tool.source_hash
    assert _statuses(recorder) == {
        "search": "done",
        "fork": "cached",
        "build": "cached",
        "test": "cached",
        "flake": "cached",
        "deploy": "cached",
        "client": "done",
    }


@pytest.mark.cargo
def test_rebuild_replaces_the_store_entry(tmp_path: Path, session_registry: DirectoryRegistry) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(session_registry.path))
    first = Pipeline(settings).run("", crate="tinyecho")
    first_manifest = json.loads((first.store_path / "manifest.json").read_text())
    first_proof, first_tests = first_manifest["proof"], first_manifest["tests"]
    assert first_proof["reused"] is False and first_proof["key"]
    marker = first.store_path / "marker"
    marker.write_text("from the first build")

    recorder = Recorder()
    again = Pipeline(settings, observers=[recorder]).run(
        BuildRequest("", crate="tinyecho", flags=RunFlags(rebuild=True))
    )
    assert again.store_path == first.store_path  # the same inputs: the same path
    assert not marker.exists()  # a new entry, not the old one
    assert _statuses(recorder)["build"] == "done" and _statuses(recorder)["deploy"] == "done"
    assert _statuses(recorder)["test"] == "cached"  # the same source was proven by the first build
    assert again(input="again") == "AGAIN"
    manifest = json.loads((again.store_path / "manifest.json").read_text())
    assert manifest["crate"] == "tinyecho"
    assert manifest["proof"]["reused"] and manifest["proof"]["proven_at"] == first_proof["proven_at"]
    assert manifest["tests"]["passed"] == first_tests["passed"] > 0
    # the first workspace was moved aside, not deleted
    assert len(list((settings.cache.workspaces / ".old").iterdir())) == 1


@pytest.mark.cargo
def test_the_callers_rustflags_never_reach_cargo(
    tinyecho_tool: Tool, session_registry: DirectoryRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flags outside the store hash must not change the binary: cargo runs without them."""
    from flakebot_magic.host.process import ProcessRunner
    from flakebot_magic.sandbox.cargo import Cargo

    monkeypatch.setenv("RUSTFLAGS", "-C debug-assertions=on")
    monkeypatch.setenv("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0")
    env = Cargo(session_registry, ProcessRunner()).env()
    assert "RUSTFLAGS" not in env and "CARGO_PROFILE_RELEASE_OPT_LEVEL" not in env
    settings = Settings(cache_dir=tinyecho_tool.store_path.parents[1], registry=str(session_registry.path))
    again = Pipeline(settings).run("", crate="tinyecho")
    assert again.store_path == tinyecho_tool.store_path


@pytest.fixture(scope="module")
def fixed_after_failing(
    session_registry: DirectoryRegistry, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Tool, Path, str]:
    """brokenbin fails to build; the user fixes the kept workspace and runs again."""
    settings = Settings(cache_dir=tmp_path_factory.mktemp("cache"), registry=str(session_registry.path))
    with pytest.raises(BuildError) as caught:
        Pipeline(settings).run("", crate="brokenbin")
    workspace = caught.value.workspace
    assert workspace is not None
    fixed = 'fn main() {\n    println!("fixed");\n}\n'
    (workspace / "src" / "main.rs").write_text(fixed)
    return Pipeline(settings).run("", crate="brokenbin"), workspace, fixed


@pytest.mark.cargo
def test_a_fixed_workspace_builds_on_the_next_run(fixed_after_failing: tuple[Tool, Path, str]) -> None:
    tool, workspace, _ = fixed_after_failing
    assert tool() == "fixed\n"
    assert (
        tool.provenance["commit"]
        == subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=workspace, capture_output=True, text=True, check=True
        ).stdout.strip()
    )


@pytest.mark.cargo
def test_the_recorded_commit_holds_the_built_source(fixed_after_failing: tuple[Tool, Path, str]) -> None:
    tool, workspace, fixed = fixed_after_failing
    shown = subprocess.run(
        ["git", "show", f"{tool.provenance['commit']}:src/main.rs"], cwd=workspace, capture_output=True, text=True
    )
    assert shown.stdout == fixed


def test_deploy_refuses_a_binary_changed_since_its_build(tmp_path: Path, built: dict[str, Path]) -> None:
    store = tmp_path / "store"
    digests = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in built.items()}
    _binary(built["tool"], "swapped by a test")  # what the build hashed is no longer there
    with pytest.raises(DeployError, match="is not the binary its build made"):
        deploy(store, KEY, "tool", "1.0.0", built, {}, digests=digests)
    assert list(store.iterdir()) == []
    digests["tool"] = hashlib.sha256(built["tool"].read_bytes()).hexdigest()
    entry = deploy(store, KEY, "tool", "1.0.0", built, {}, digests=digests)
    assert subprocess.run([entry.bin("tool")], capture_output=True, text=True).stdout == "swapped by a test\n"
