"""Attacks on flakebot's git: planted hooks, filters, fsmonitor, config includes and environment never run.

Each test plants, in a workspace repository, what sandboxed code could write
there, then runs what flakebot runs (add, commit, status, log -p, diff,
read-tree), and asserts that no canary file appeared outside the workspace
and that the history is intact.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

import pytest

from flakebot_magic.errors import ForkError
from flakebot_magic.host.git import KEPT_CONFIG, Git
from flakebot_magic.host.process import ProcessRunner


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "outside"
    path.mkdir()
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Git:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "lib.rs").write_text("pub fn one() -> u8 { 1 }\n")
    git = Git(root, ProcessRunner())
    git.init("published")
    assert git.commit("Published source", all_files=True, force=True)
    git("checkout", "-q", "-b", "flakebot")
    return git


def _canary_script(outside: Path, name: str) -> str:
    # writes a canary and still behaves like a filter (stdin to stdout) so git has no reason to fail
    return f"#!/bin/sh\necho ran >> '{outside}/{name}'\ncat\nexit 0\n"


def _plant_executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _plant_everything(git: Git, outside: Path) -> None:
    root, dot_git = git.root, git.root / ".git"
    for hook in (
        "pre-commit",
        "prepare-commit-msg",
        "commit-msg",
        "post-commit",
        "post-checkout",
        "reference-transaction",
        "post-index-change",
        "pre-auto-gc",
        "post-rewrite",
    ):
        _plant_executable(dot_git / "hooks" / hook, _canary_script(outside, hook))
    program = outside.parent / "evil.sh"
    _plant_executable(program, _canary_script(outside, "driver"))
    included = outside.parent / "included.config"
    included.write_text(f'[filter "inc"]\n\tclean = {program}\n\tsmudge = {program}\n')
    with (dot_git / "config").open("a") as config:
        config.write(
            f'[filter "evil"]\n\tclean = {program}\n\tsmudge = {program}\n\tprocess = {program}\n\trequired = false\n'
            f'[diff "evil"]\n\ttextconv = {program}\n\tcommand = {program}\n'
            f"[diff]\n\texternal = {program}\n"
            f"[core]\n\tfsmonitor = {program}\n\tpager = {program}\n\teditor = {program}\n"
            f"\tsshCommand = {program}\n\thooksPath = {dot_git / 'hooks'}\n"
            f"[include]\n\tpath = {included}\n"
            f"[alias]\n\tst = !{program}\n"
        )
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n*.rs filter=inc\n")
    (dot_git / "info").mkdir(exist_ok=True)
    (dot_git / "info" / "attributes").write_text("* filter=evil diff=evil\n")


def test_nothing_planted_in_the_repository_runs_on_add_commit_status_or_diff(repo: Git, outside: Path) -> None:
    _plant_everything(repo, outside)
    (repo.root / "src" / "lib.rs").write_text("pub fn one() -> u8 { 1 }\npub fn two() -> u8 { 2 }\n")
    (repo.root / "src" / "new.rs").write_text("pub fn three() -> u8 { 3 }\n")

    first = repo.commit("Check run 1", all_files=True, force=True)
    assert first is not None
    assert repo.is_dirty() is False
    repo("add", "-A", "-f", "--", ".")
    repo("status", "--porcelain")
    log = repo("log", "-p", "--format=%s")
    repo("diff", "HEAD~1", "--", ".")
    repo("show", "HEAD")
    repo("read-tree", "-u", "--reset", "HEAD~1")
    repo("commit", "-q", "--no-verify", "--allow-empty", "-m", "Revert")

    assert list(outside.iterdir()) == [], "a planted hook, filter, fsmonitor or driver ran"
    # the history is intact: both commits, with the content as written (no filter rewrote it)
    assert repo("log", "--format=%s").splitlines() == ["Revert", "Check run 1", "Published source"]
    assert "pub fn two() -> u8 { 2 }" in repo("show", f"{first}:src/lib.rs")
    assert "+pub fn three() -> u8 { 3 }" in log
    assert repo("show", "HEAD:src/lib.rs") == "pub fn one() -> u8 { 1 }"
    assert not (repo.root / "src" / "new.rs").exists()  # read-tree really went back


def test_the_planted_config_is_dropped_and_what_git_init_wrote_is_kept(repo: Git, outside: Path) -> None:
    _plant_everything(repo, outside)
    dropped = repo.clean_config()
    assert any("filter" in line or "clean" in line for line in dropped)
    config = (repo.root / ".git" / "config").read_text()
    for planted in ("filter", "fsmonitor", "include", "alias", "hooksPath", "external", str(outside.parent)):
        assert planted not in config, planted
    assert "repositoryformatversion = 0" in config and "bare = false" in config
    assert repo.clean_config() == []  # clean stays clean, and is not rewritten again
    assert repo.cleaned == dropped
    assert {("core", "bare"), ("core", "repositoryformatversion")} <= KEPT_CONFIG


@pytest.mark.parametrize(
    "planted",
    [
        "[core]\n\tworktree = {outside}\n",
        "[core]\n\tbare = true\n",
        '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "{program}" ; quoted\n',
        "[core]\n\trepositoryformatversion = 0\\\n\tfsmonitor = {program}\n",  # a continuation line
        '[core "x"]\n\tfsmonitor = {program}\n',
        "[core.x]\n\tfsmonitor = {program}\n",
        "[extensions]\n\tworktreeConfig = true\n",
    ],
)
def test_config_the_cleaner_does_not_understand_is_dropped(repo: Git, outside: Path, planted: str) -> None:
    program = outside.parent / "evil.sh"
    _plant_executable(program, _canary_script(outside, "driver"))
    (repo.root / ".git" / "config").write_text(planted.format(outside=outside, program=program))
    (repo.root / "src" / "lib.rs").write_text("pub fn one() -> u8 { 11 }\n")
    assert repo.commit("edited", all_files=True) is not None
    assert list(outside.iterdir()) == []
    text = (repo.root / ".git" / "config").read_text()
    assert str(outside) not in text and str(program) not in text and "bare = true" not in text


def test_a_symlinked_config_or_commondir_is_replaced_not_followed(repo: Git, outside: Path) -> None:
    foreign = outside / "foreign.config"
    foreign.write_text("[core]\n\trepositoryformatversion = 0\n")
    config = repo.root / ".git" / "config"
    config.unlink()
    config.symlink_to(foreign)
    (repo.root / ".git" / "commondir").write_text(str(outside) + "\n")
    repo("status")
    assert not config.is_symlink() and foreign.read_text() == "[core]\n\trepositoryformatversion = 0\n"
    assert not (repo.root / ".git" / "commondir").exists()


def test_a_git_dir_that_is_a_symlink_or_a_gitdir_file_is_refused_with_a_clear_error(repo: Git, tmp_path: Path) -> None:
    moved = tmp_path / "moved.git"
    (repo.root / ".git").rename(moved)
    (repo.root / ".git").symlink_to(moved)
    with pytest.raises(ForkError, match=r"is not a directory.*refusing to run git"):
        repo("status")
    (repo.root / ".git").unlink()
    (repo.root / ".git").write_text(f"gitdir: {moved}\n")
    with pytest.raises(ForkError, match="is not a directory"):
        repo.commit("x", all_files=True)


def test_the_kernel_environment_and_global_config_do_not_reach_git(
    repo: Git, outside: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = outside.parent / "evil.sh"
    _plant_executable(program, _canary_script(outside, "driver"))
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f"[core]\n\tfsmonitor = {program}\n\thooksPath = {home}\n")
    _plant_executable(home / "post-commit", _canary_script(outside, "global-hook"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.hookspath'='{home}'")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(program))
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", str(program))
    git = Git(repo.root, ProcessRunner())  # built after the environment changed, as a new run would
    (repo.root / "src" / "lib.rs").write_text("pub fn one() -> u8 { 7 }\n")
    assert git.commit("edited", all_files=True) is not None
    git("diff", "HEAD~1")
    assert list(outside.iterdir()) == []
    assert not any(
        k.startswith("GIT_CONFIG_") and k not in ("GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL") for k in git.env
    )


def test_without_the_overrides_the_planted_hooks_would_run(repo: Git, outside: Path) -> None:
    """The attack is real: plain git runs the very hooks and filter the tests above plant."""
    _plant_everything(repo, outside)
    (repo.root / "src" / "lib.rs").write_text(f"// {secrets.token_hex(4)}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    runner = ProcessRunner()
    runner.run(["git", "add", "-A"], cwd=repo.root, env=env)
    runner.run(["git", "commit", "-q", "--no-verify", "-m", "plain"], cwd=repo.root, env=env)
    ran = {p.name for p in outside.iterdir()}
    assert {"post-commit", "prepare-commit-msg", "driver"} <= ran
