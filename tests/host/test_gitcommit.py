"""The in-process commit records exactly the tree ``git add -A -f`` of the source records, change after change."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from tinycrates import crate, write_crate

from flakebot_magic.host.fsutil import RACY_SECONDS
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.sandbox.layout import SOURCE_PATHSPEC, not_committed

pytest.importorskip("pygit2")


@pytest.fixture
def git(tmp_path: Path) -> Git:
    files = {"src/lib.rs": "pub fn f() -> u8 { 1 }\n", ".gitignore": "*.log\n/generated/\n"}
    root = write_crate(tmp_path, crate("w", files=files))
    repo = Git(root, ProcessRunner())
    repo.init("flakebot")
    repo.commit("published", all_files=True, force=True)
    return repo


def _cli_tree(git: Git) -> str:
    """The tree git's CLI records for the work tree as it is (a scratch index: the repository is not touched)."""
    scratch = Path(git.root).parent / "scratch-index"
    shutil.copyfile(Path(git.root) / ".git" / "index", scratch)
    cli = Git(git.root, git.runner)
    cli.env = {**git.env, "GIT_INDEX_FILE": str(scratch)}
    cli("add", "-A", "-f", "--", *SOURCE_PATHSPEC)
    return cli("write-tree")


def _commit_matches_cli(git: Git, message: str) -> str:
    expected = _cli_tree(git)
    commit = git.commit_in_process(message, excluded=not_committed)
    assert commit is not None, "the in-process commit gave way to the CLI"
    assert git("rev-parse", "HEAD") == commit
    assert git.tree(commit) == expected
    git("diff", "--quiet", "--cached")  # git's CLI reads the index it wrote: index == HEAD
    git("diff", "--quiet")  # ... and the work tree == the index (stat data git can use)
    return commit


def test_every_kind_of_change_is_recorded_as_git_records_it(git: Git) -> None:
    root = Path(git.root)
    (root / "src" / "lib.rs").write_text("pub fn f() -> u8 { 2 }\n")
    (root / "tests").mkdir()
    (root / "tests" / "new.rs").write_text("#[test]\nfn t() {}\n")
    (root / "debug.log").write_text("ignored by .gitignore, committed anyway (-f)\n")
    (root / "generated").mkdir()
    (root / "generated" / "x.rs").write_text("// ignored directory\n")
    (root / "target" / "debug").mkdir(parents=True)
    (root / "target" / "debug" / "junk").write_text("build output\n")
    (root / ".flakebot-candidates" / "c1").mkdir(parents=True)
    (root / ".flakebot-candidates" / "c1" / "file").write_text("a candidate's clone\n")
    os.symlink("/nix/store/0000-none", root / "result-bin")
    os.mkfifo(root / "src" / "pipe")  # git adds no FIFO
    first = _commit_matches_cli(git, "Check run 1\n\n- a change   \n\n\n\n")
    assert git("log", "-1", "--format=%B", first) == "Check run 1\n\n- a change"  # as `git commit -m` cleans it
    assert git("log", "-1", "--format=%an <%ae> / %cn <%ce>", first) == (
        "flakebot <flakebot@localhost> / flakebot <flakebot@localhost>"
    )

    (root / "tests" / "new.rs").unlink()
    (root / "Cargo.toml").chmod(0o755)
    os.symlink("lib.rs", root / "src" / "alias.rs")
    second = _commit_matches_cli(git, "Check run 2")
    assert git("rev-parse", f"{second}^") == first

    _commit_matches_cli(git, "Check run 3 (nothing changed: --allow-empty)")


def test_a_rewrite_that_keeps_size_and_mtime_is_still_committed(git: Git) -> None:
    root = Path(git.root)
    lib = root / "src" / "lib.rs"
    _commit_matches_cli(git, "the hashes are remembered")
    time.sleep(RACY_SECONDS + 0.2)
    _commit_matches_cli(git, "... now for settled files")
    before = os.stat(lib)
    lib.write_text("pub fn f() -> u8 { 9 }\n")  # the same size
    os.utime(lib, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(lib).st_mtime_ns == before.st_mtime_ns and os.stat(lib).st_size == before.st_size
    commit = _commit_matches_cli(git, "the rewrite")
    assert "9" in git("show", f"{commit}:src/lib.rs")


def test_after_git_itself_wrote_the_index_every_file_is_read_again(git: Git) -> None:
    root = Path(git.root)
    (root / "src" / "lib.rs").write_text("pub fn f() -> u8 { 3 }\n")
    good = _commit_matches_cli(git, "good")
    time.sleep(RACY_SECONDS + 0.2)
    _commit_matches_cli(git, "remembered")
    (root / "src" / "lib.rs").write_text("pub fn f() -> u8 { 4 }\n")
    _commit_matches_cli(git, "bad")
    git("read-tree", "-u", "--reset", good)  # the revert: git's CLI rewrites the index and the files
    reverted = _commit_matches_cli(git, "revert")
    assert git.tree(reverted) == git.tree(good)


def test_what_git_records_otherwise_is_left_to_git(git: Git) -> None:
    root = Path(git.root)
    (root / "vendored" / ".git").mkdir(parents=True)  # a nested repository: git records a link
    assert git.commit_in_process("nested", excluded=not_committed) is None
    shutil.rmtree(root / "vendored")
    name = os.fsdecode(b"bad-\xff.rs")  # not UTF-8: libgit2 takes text paths
    (root / "src" / name).write_text("// odd name\n")
    assert git.commit_in_process("odd", excluded=not_committed) is None
