"""Candidate workspaces: warm clones that share no file cargo rewrites, and the winner's adoption (real cargo, real git)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tinycrates import crate, write_registry

from flakebot_magic.edit.checkrun import CheckRunner
from flakebot_magic.edit.files import PathRefused, WorkspaceFiles, contain
from flakebot_magic.edit.forks import (
    CANDIDATE_REFS,
    CANDIDATES_DIR,
    adopt,
    candidate_path,
    clone_candidate,
    clone_target,
    keep_head,
)
from flakebot_magic.errors import Cancelled, ForkError
from flakebot_magic.events import EventBus
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import CancelToken, ProcessRunner
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import Sandbox
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.policy import check_tree
from flakebot_magic.stages.fork import fork

TINYCOUNT = crate(
    "tinycount", files={"src/lib.rs": "pub fn count(s: &str) -> usize {\n    s.split_whitespace().count()\n}\n"}
)
FORKME_MAIN = """fn main() {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let text = words.join(" ");
    println!("{} {}", tinylib::shout(&text), tinycount::count(&text));
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts() {
        assert_eq!(tinycount::count("a b"), 2);
    }
}
"""
#: a CLI with two dependencies from the registry
FORKME = crate(
    "forkme",
    manifest=(
        '[package]\nname = "forkme"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\n'
        'description = "Shout and count words"\n\n[dependencies]\ntinylib = "0.1"\ntinycount = "0.1"\n\n'
        '[package.metadata.flakebot]\nkind = "cli"\nbin = "forkme"\n'
    ),
    files={"src/main.rs": FORKME_MAIN},
)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[DirectoryRegistry]:
    registry = DirectoryRegistry(write_registry(tmp_path / "registry", ["tinylib", TINYCOUNT, FORKME]), tmp_path / "ix")
    yield registry
    registry.close()


def _checks(path: Path, registry: DirectoryRegistry) -> CheckRunner:
    runner = ProcessRunner()
    cargo = Cargo(registry, runner, Sandbox(path))
    return CheckRunner(
        WorkspaceFiles(path), cargo=cargo, git=Git(path, runner), bus=EventBus([]), build_timeout=300, test_timeout=300
    )


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``root`` (candidates aside): its sha256 and modification time."""
    found: dict[str, tuple[str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d != CANDIDATES_DIR]
        for name in filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            found[str(path.relative_to(root))] = (hashlib.sha256(data).hexdigest(), info.st_mtime_ns)
    return found


def _run(root: Path, *args: str) -> str:
    binary = root / "target" / "flakebot-test" / "debug" / "forkme"
    return subprocess.run([str(binary), *args], capture_output=True, check=True, text=True).stdout


def _library(root: Path, name: str) -> Path:
    deps = root / "target" / "flakebot-test" / "debug" / "deps"
    (found,) = [p for p in deps.iterdir() if p.name.startswith(f"lib{name}-") and p.suffix == ".rlib"]
    return found


@pytest.mark.cargo
def test_a_clone_starts_warm_and_its_builds_never_touch_another(registry: DirectoryRegistry, tmp_path: Path) -> None:
    runner = ProcessRunner()
    workspace = fork(
        registry.get("forkme"),
        registry,
        tmp_path / "workspaces",
        "forkme",
        runner=runner,
        bus=EventBus([]),
        cargo=Cargo(registry, runner),
    ).path
    baseline = _checks(workspace, registry).cargo_run(0, clippy=False)
    assert baseline.green and baseline.dependency_units == 2  # tinylib and tinycount, compiled once

    started = time.monotonic()
    one, two = clone_candidate(workspace, 1), clone_candidate(workspace, 2)
    assert time.monotonic() - started < 5
    assert (one, two) == (candidate_path(workspace, 1), candidate_path(workspace, 2))
    assert one == workspace / CANDIDATES_DIR / "1" and (one / "src" / "main.rs").read_text() == FORKME_MAIN
    assert Git(one, runner).head() == Git(workspace, runner).head()
    assert not (one / CANDIDATES_DIR).exists()
    # nothing is shared: not the dependencies' libraries, not cargo's bookkeeping, not the crate's own files
    assert _library(one, "tinylib").stat().st_ino != _library(workspace, "tinylib").stat().st_ino
    for rel in ("debug/forkme", "debug/.cargo-lock", ".rustc_info.json"):
        assert (one / "target/flakebot-test" / rel).stat().st_ino != (
            workspace / "target/flakebot-test" / rel
        ).stat().st_ino
    cloned = [p for p in (one / "target/flakebot-test").rglob("*") if p.is_file() and not p.is_symlink()]
    assert cloned and all(p.stat().st_nlink == 1 for p in cloned)

    main_before, two_before = _snapshot(workspace), _snapshot(two)
    source = one / "src" / "main.rs"
    source.write_text(FORKME_MAIN.replace('println!("{} {}"', 'println!("{} = {}"'))
    first = _checks(one, registry).cargo_run(1, clippy=False)
    assert first.green and first.dependency_units == 0  # the clone's first run compiled only the crate
    assert _run(one, "a", "b") == "A B = 2\n"
    assert _snapshot(workspace) == main_before and _snapshot(two) == two_before
    second = _checks(two, registry).cargo_run(1, clippy=False)
    assert second.green and second.dependency_units == 0
    assert _run(two, "a", "b") == "A B 2\n" and _run(workspace, "a", "b") == "A B 2\n"

    # a dependency rebuilt in one candidate changes no other
    main_before, two_before = _snapshot(workspace), _snapshot(two)
    for unit in (one / "target/flakebot-test/debug/.fingerprint").glob("tinylib-*"):
        shutil.rmtree(unit)  # cargo rebuilds what has no fingerprint, under the same file names
    rebuilt = _checks(one, registry).cargo_run(1, clippy=False)
    assert rebuilt.green and rebuilt.dependency_units >= 1
    assert _library(one, "tinylib").stat().st_ino != _library(workspace, "tinylib").stat().st_ino
    assert _snapshot(workspace) == main_before and _snapshot(two) == two_before

    # the tool's workspace never builds, commits, lists or lets the model reach the candidates
    assert check_tree(workspace) == []
    checks = _checks(workspace, registry)
    commit = checks.commit(baseline)
    assert CANDIDATES_DIR not in Git(workspace, runner)("ls-tree", "--name-only", commit).split()
    checks.revert(baseline, commit)  # its `git clean` keeps them
    assert (one / "src" / "main.rs").is_file()
    files = WorkspaceFiles(workspace)
    assert CANDIDATES_DIR not in files.list_files(".")
    for path, write in ((f"{CANDIDATES_DIR}/1/src/main.rs", False), (f"{CANDIDATES_DIR}/2/x.rs", True)):
        with pytest.raises(PathRefused, match="other candidates"):
            contain(workspace, path, write=write)


def _fake_target(root: Path) -> Path:
    debug = root / "debug"
    for unit in ("dep-0123456789abcdef", "me-fedcba9876543210"):
        (debug / ".fingerprint" / unit).mkdir(parents=True)
        (debug / ".fingerprint" / unit / "lib.json").write_text("{}")
    (debug / "deps").mkdir()
    for name in ("libdep-0123456789abcdef.rlib", "libdep-0123456789abcdef.rmeta", "dep-0123456789abcdef.d"):
        (debug / "deps" / name).write_text(name)
    (debug / "deps" / "libme-fedcba9876543210.rlib").write_text("mine")
    (debug / "deps" / "libunknown-1111111111111111.rlib").write_text("no fingerprint")
    os.utime(debug / "deps" / "dep-0123456789abcdef.d", ns=(1, 1_000_000_000))
    (debug / "link").symlink_to("/etc/passwd")
    os.mkfifo(debug / "fifo")  # left out, never read (a read would block)
    return root


def test_clone_target_copies_every_file_and_shares_no_inode(tmp_path: Path) -> None:
    source = _fake_target(tmp_path / "target")
    stats = clone_target(source, tmp_path / "a" / "target")
    ours, theirs = tmp_path / "a" / "target", source
    shared = [
        p.relative_to(ours)
        for p in ours.rglob("*")
        if p.is_file() and not p.is_symlink() and p.stat().st_ino == (theirs / p.relative_to(ours)).stat().st_ino
    ]
    assert shared == []
    assert stats.copied == 7  # 2 fingerprints, a .d, the dependency's rlib and rmeta, the local and the unknown library
    assert (ours / "debug" / "deps" / "dep-0123456789abcdef.d").stat().st_mtime_ns == 1_000_000_000  # mtime kept
    assert os.readlink(ours / "debug" / "link") == "/etc/passwd"
    assert not (ours / "debug" / "fifo").exists()


def _workspace(tmp_path: Path) -> tuple[Path, Git]:
    root = tmp_path / "ws"
    root.mkdir()
    git = Git(root, ProcessRunner())
    git.init("published")
    (root / "src").mkdir()
    (root / "src" / "main.rs").write_text("fn main() {}\n")
    git.commit("published", all_files=True)
    git("checkout", "-q", "-b", "flakebot")
    return root, git


def test_clone_candidate_replaces_a_stale_clone_and_never_follows_a_planted_link(tmp_path: Path) -> None:
    root, _ = _workspace(tmp_path)
    os.mkfifo(root / "pipe")
    (root / "target" / "release").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep")
    (root / CANDIDATES_DIR).symlink_to(outside)  # planted by crate code: replaced, never followed
    clone = clone_candidate(root, 0)
    assert (outside / "keep").read_text() == "keep" and not (root / CANDIDATES_DIR).is_symlink()
    assert sorted(p.name for p in clone.iterdir()) == [".git", "src"]
    assert f"/{CANDIDATES_DIR}/" in (root / ".git" / "info" / "exclude").read_text().splitlines()
    (clone / "stale").write_text("from an earlier session")
    clone = clone_candidate(root, 0)
    assert not (clone / "stale").exists()
    assert sorted(p.name for p in (root / CANDIDATES_DIR).iterdir()) == ["0"]
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(Cancelled):
        clone_candidate(root, 1, runner=ProcessRunner(cancel))
    assert sorted(p.name for p in (root / CANDIDATES_DIR).iterdir()) == ["0"]  # nothing half-made left
    with pytest.raises(ValueError):
        candidate_path(root, -1)


def _plant(clone: Path, marker: Path) -> None:
    """Hooks and configuration that would run a program, or stop git, if git honoured them."""
    hooks = clone / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    script = f"#!/bin/sh\ntouch {marker}\n"
    for hook in ("reference-transaction", "post-checkout", "post-merge", "pre-push", "post-update", "update"):
        (hooks / hook).write_text(script)
        (hooks / hook).chmod(0o755)
    program = clone / "program.sh"
    program.write_text(script)
    program.chmod(0o755)
    extra = clone.parent / "extra.config"
    extra.write_text(f"[core]\n\tfsmonitor = {program}\n")
    with (clone / ".git" / "config").open("a") as config:
        config.write(
            f"[uploadpack]\n\tpackObjectsHook = {program}\n\tallowAnySHA1InWant = false\n"
            f"[core]\n\talternateRefsCommand = {program}\n\tfsmonitor = {program}\n"
            f"[include]\n\tpath = {extra}\n"
            # read as it is, this makes every git command in the candidate fail: an unknown extension
            "[core]\n\trepositoryformatversion = 1\n[extensions]\n\tflakebotPlanted = true\n"
        )


def test_adopt_moves_the_branch_to_the_winner_and_keeps_every_head(tmp_path: Path) -> None:
    root, git = _workspace(tmp_path)
    start = git.head()
    winner, loser = clone_candidate(root, 0), clone_candidate(root, 1)
    for clone, text in ((winner, 'fn main() { println!("won"); }\n'), (loser, "fn main() { todo!() }\n")):
        (clone / "src" / "main.rs").write_text(text)
        (clone / "src" / "new.rs").write_text("// new\n")
        Git(clone, ProcessRunner()).commit("candidate's edit", all_files=True)
    (root / "notes.txt").write_text("left in the workspace, uncommitted")  # in the way of the winner's file
    (winner / "notes.txt").write_text("the winner's notes\n")
    Git(winner, ProcessRunner()).commit("notes", all_files=True)
    marker = tmp_path / "pwned"
    _plant(winner, marker)
    _plant(loser, marker)
    their_head = Git(winner, ProcessRunner()).head()

    head = adopt(root, winner, 0, git, losers={1: loser, 0: winner})
    assert head == their_head == git.head()
    assert (root / "src" / "main.rs").read_text() == 'fn main() { println!("won"); }\n'
    assert (root / "src" / "new.rs").is_file() and git("status", "--porcelain", "--ignored=no") == ""
    assert (root / "notes.txt").read_text() == "the winner's notes\n"
    assert git("rev-parse", f"{CANDIDATE_REFS}/0") == their_head
    assert git("rev-parse", f"{CANDIDATE_REFS}/1") == Git(loser, ProcessRunner()).head()
    assert git("symbolic-ref", "HEAD") == "refs/heads/flakebot"
    assert git("merge-base", start, head) == start
    # nothing planted ran, and the planted configuration was gone before git read it (else git stops)
    assert not marker.exists()
    config = (winner / ".git" / "config").read_text()
    assert "flakebotPlanted" not in config and "fsmonitor" not in config and "include" not in config


def test_adopt_refuses_a_candidate_that_does_not_descend_from_the_workspace(tmp_path: Path) -> None:
    root, git = _workspace(tmp_path)
    clone = clone_candidate(root, 0)
    (clone / "src" / "main.rs").write_text("fn main() { }\n")
    Git(clone, ProcessRunner()).commit("candidate", all_files=True)
    (root / "src" / "main.rs").write_text("fn main() { /* moved on */ }\n")
    moved = git.commit("the workspace moved", all_files=True)
    with pytest.raises(ForkError, match="does not descend"):
        adopt(root, clone, 0, git)
    assert git.head() == moved
    assert git("rev-parse", f"{CANDIDATE_REFS}/0") == Git(clone, ProcessRunner()).head()
    with pytest.raises(ForkError, match="is not candidate #1"):
        keep_head(root, clone, 1, git)
