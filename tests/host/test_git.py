"""Lock files a killed git left in a workspace are removed; one a live process holds, or a running git's, is not."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot_magic.errors import ForkError
from flakebot_magic.host.git import Git, remove_stale_locks, stale_locks
from flakebot_magic.host.process import ProcessRunner


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    git = Git(path, ProcessRunner())
    git.init("flakebot")
    (path / "a.txt").write_text("a\n")
    git.commit("first", all_files=True)
    return path


def _locks(repo: Path) -> list[Path]:
    """What a git killed mid-commit, mid-update-ref and mid-config leaves behind."""
    made = [repo / ".git" / "index.lock", repo / ".git" / "HEAD.lock", repo / ".git" / "refs" / "heads" / "x.lock"]
    for path in made:
        path.write_text("")
    return made


def test_a_killed_gits_locks_block_git_until_they_are_removed(repo: Path) -> None:
    planted = _locks(repo)
    git = Git(repo, ProcessRunner())
    (repo / "b.txt").write_text("b\n")
    with pytest.raises(ForkError, match=r"index\.lock"):
        git.commit("second", all_files=True)
    assert sorted(remove_stale_locks(repo)) == sorted(planted)
    assert git.commit("second", all_files=True)
    assert stale_locks(repo) == []


@pytest.fixture
def holder(repo: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that keeps ``.git/index.lock`` open, as a git in the middle of writing the index does."""
    lock = repo / ".git" / "index.lock"
    code = f"import sys, time\nf = open({str(lock)!r}, 'w')\nprint('open', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "open\n"
    yield proc
    proc.kill()
    proc.communicate()


def test_a_lock_a_live_process_holds_open_stays(repo: Path, holder: subprocess.Popen[str]) -> None:
    assert stale_locks(repo) == [] and remove_stale_locks(repo) == []
    assert (repo / ".git" / "index.lock").exists()
    holder.kill()
    holder.wait()
    assert remove_stale_locks(repo) == [repo / ".git" / "index.lock"]


def test_no_lock_is_taken_for_stale_while_a_git_runs_in_the_repository(repo: Path) -> None:
    (repo / ".git" / "index.lock").write_text("")
    # a git that stays (reading object names from a pipe nobody writes) with its working dir in the repo
    running = subprocess.Popen(["git", "cat-file", "--batch"], cwd=repo, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert running.stdin is not None and running.stdout is not None
        running.stdin.write(b"HEAD\n")
        running.stdin.flush()
        assert b" commit " in running.stdout.readline()  # it answers: it is up
        assert running.poll() is None
        assert stale_locks(repo) == [] and remove_stale_locks(repo) == []
    finally:
        running.kill()
        running.communicate()
    assert stale_locks(repo) == [repo / ".git" / "index.lock"]


def test_a_symlinked_git_dir_is_left_alone(tmp_path: Path, repo: Path) -> None:
    link = tmp_path / "linked"
    link.mkdir()
    (link / ".git").symlink_to(repo / ".git")
    (repo / ".git" / "index.lock").write_text("")
    assert stale_locks(link) == [] and remove_stale_locks(link) == []


def test_export_commit_writes_the_commit_from_git_objects_never_the_work_tree(tmp_path: Path, repo: Path) -> None:
    git = Git(repo, ProcessRunner())
    (repo / "x").mkdir()
    (repo / "x" / "data.txt").write_text("committed\n")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    commit = git.commit("more", all_files=True)
    assert commit is not None
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "data.txt").write_text("SECRET\n")
    # what sandboxed code does after the commit: a committed directory becomes a link outside, a file is
    # rewritten, an untracked file appears
    (repo / "x" / "data.txt").unlink()
    (repo / "x").rmdir()
    (repo / "x").symlink_to(secret)
    (repo / "a.txt").write_text("rewritten after the commit\n")
    (repo / "new.txt").write_text("untracked\n")
    dest = tmp_path / "export"
    files = git.export_commit(commit, dest)
    assert sorted(files) == ["a.txt", "run.sh", "x/data.txt"]
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == sorted(files)
    assert (dest / "a.txt").read_text() == "a\n" and (dest / "x" / "data.txt").read_text() == "committed\n"
    assert not (dest / "x").is_symlink() and (dest / "run.sh").stat().st_mode & 0o111
    assert git("status", "--porcelain")  # the workspace's own index untouched: still dirty against HEAD
    with pytest.raises(FileExistsError):
        git.export_commit(commit, dest)  # never into something that exists


def test_a_commits_tree_is_read_in_process_as_git_reads_it(repo: Path) -> None:
    """The tree id read from the loose commit object is git's own answer; packed or short ids ask git."""
    git = Git(repo, ProcessRunner())
    (repo / "a.txt").write_text("one\n")
    commit = git.commit("first", all_files=True)
    assert commit is not None
    expected = git("rev-parse", f"{commit}^{{tree}}")
    assert git.tree(commit) == expected
    assert git.tree(commit[:12]) == expected and git.tree("HEAD") == expected  # not full ids: git answers
    git("gc", "-q", "--prune=now")  # now packed: no loose object to read
    assert not (repo / ".git" / "objects" / commit[:2] / commit[2:]).exists()
    assert git.tree(commit) == expected


@pytest.mark.parametrize("length", [100, 150, 200, 251])
def test_the_first_commit_of_a_tree_whose_listing_runs_past_a_line_is_the_files(tmp_path: Path, length: int) -> None:
    """Issue 37, second trial: the catalog's `cargo` crate (1,073 files) failed to fork, "git recorded another tree
    than the files", because `git ls-tree -z` prints every path on one line and the process reader cut it at 64
    KiB with a newline, which renamed the path it fell in. Over path lengths that put the cut in a mode, a hash, a
    path and near an entry's end: the commit succeeds and records exactly the files."""
    root = tmp_path / "ws"
    root.mkdir()
    files = [f"{i:05d}" + "x" * (length - 5) for i in range(100_000 // (length + 54) + 1)]  # > 64 KiB listed
    for name in files:
        (root / name).write_text(name)
    git = Git(root, ProcessRunner())
    git.init("published")
    commit = git.commit_files("the source as published", files)
    listed = git("ls-tree", "-r", "-z", "--name-only", commit).split("\0")
    assert [name for name in listed if name] == sorted(files)
