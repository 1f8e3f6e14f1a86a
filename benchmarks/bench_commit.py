"""A check run's commit three ways, side by side (issue 23): the git CLI, pygit2 (libgit2), dulwich.

    .venv/bin/python benchmarks/bench_commit.py [--rounds 15] [--crate sha2-0.10.5]

Each round edits one file of a copy of a registry crate (a git repository
with the crate committed), then commits the whole source as the edit loop does
(``git add -A -f`` of everything but build outputs, then ``git commit``),
alternating the ways (after a first commit each, and the files given the
time to settle, as between two check runs); prints the p50 wall time and CPU
time (this process and its children) of each. The libraries are measured only if installed.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY  # noqa: E402
from flakebot_magic.host.fsutil import RACY_SECONDS  # noqa: E402
from flakebot_magic.sandbox.layout import SOURCE_PATHSPEC, is_source  # noqa: E402

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "b",
    "GIT_AUTHOR_EMAIL": "b@l",
    "GIT_COMMITTER_NAME": "b",
    "GIT_COMMITTER_EMAIL": "b@l",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def _cli(repo: Path, message: str) -> None:
    subprocess.run(["git", "add", "-A", "-f", "--", *SOURCE_PATHSPEC], cwd=repo, env=ENV, check=True)
    subprocess.run(
        ["git", "commit", "-q", "--no-verify", "--allow-empty", "-m", message], cwd=repo, env=ENV, check=True
    )


def _files(repo: Path) -> list[str]:
    paths = []
    for dirpath, dirnames, filenames in os.walk(repo):
        if Path(dirpath) == repo:
            dirnames[:] = [d for d in dirnames if is_source(d)]
            filenames = [f for f in filenames if is_source(f)]
        paths += [os.path.relpath(os.path.join(dirpath, f), repo) for f in filenames]
    return paths


def _pygit2(repo: Path, message: str) -> None:
    import pygit2

    r = pygit2.Repository(str(repo))
    index = r.index
    paths = _files(repo)
    for path in paths:
        index.add(path)  # one by one: past the crate's .gitignore, as `git add -f`
    for gone in {entry.path for entry in index} - set(paths):
        index.remove(gone)
    index.write()
    tree = index.write_tree()
    who = pygit2.Signature("b", "b@l")
    r.create_commit("HEAD", who, who, message, tree, [r.head.target])


def _dulwich(repo: Path, message: str) -> None:
    from dulwich.repo import Repo

    r = Repo(str(repo))
    paths = _files(repo)
    index = r.open_index()
    gone = [p.decode() for p in index if not os.path.lexists(repo / p.decode())]
    r.get_worktree().stage(paths + gone)
    r.get_worktree().commit(message=message.encode(), committer=b"b <b@l>", author=b"b <b@l>", no_verify=True)


_COMMITTERS: dict[Path, object] = {}


def _flakebot(repo: Path, message: str) -> None:
    """What the edit loop does: Git.commit_in_process (pygit2, only files whose identity changed hashed)."""
    from flakebot_magic.host.git import Git
    from flakebot_magic.host.process import ProcessRunner
    from flakebot_magic.sandbox.layout import not_committed

    git = _COMMITTERS.setdefault(repo, Git(repo, ProcessRunner()))
    assert git.commit_in_process(message, excluded=not_committed) is not None  # type: ignore[attr-defined]


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--crate", default="sha2-0.10.5")
    args = parser.parse_args()
    ways: dict[str, Callable[[Path, str], None]] = {"git CLI (add + commit)": _cli}
    for name, module, way in (
        ("pygit2 (every file added)", "pygit2", _pygit2),
        ("dulwich", "dulwich", _dulwich),
        ("flakebot (commit_in_process)", "pygit2", _flakebot),
    ):
        try:
            __import__(module)
        except ImportError:
            print(f"{name}: not installed, not measured")
            continue
        ways[name] = way
    scratch = Path(tempfile.mkdtemp(prefix="flakebot-bench-commit-"))
    try:
        repos = {}
        for name in ways:
            repo = scratch / name.split()[0].strip("()")
            shutil.copytree(Path(DEBIAN_REGISTRY) / args.crate, repo)
            (repo / "target").mkdir()
            (repo / "target" / "junk").write_text("build output\n")
            subprocess.run(["git", "init", "-q"], cwd=repo, env=ENV, check=True)
            _cli(repo, "published")
            repos[name] = repo
        for name in ways:  # a first commit each (flakebot's hashes every file once), then the files settle
            ways[name](repos[name], "first")
        time.sleep(RACY_SECONDS + 0.2)  # as between two check runs: the files not edited since are settled
        wall: dict[str, list[float]] = {name: [] for name in ways}
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        for round_ in range(args.rounds):
            for name, way in ways.items():
                lib = repos[name] / "src" / "lib.rs"
                lib.write_text(lib.read_text() + f"\n// edit {round_}\n")
                (repos[name] / f"new{round_}.txt").write_text("new\n")
                if round_:
                    os.unlink(repos[name] / f"new{round_ - 1}.txt")
                c0, t0 = _cpu(), time.perf_counter()
                way(repos[name], f"round {round_}")
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(_cpu() - c0)
        trees = {
            name: subprocess.run(
                ["git", "rev-parse", "HEAD^{tree}"], cwd=repo, env=ENV, capture_output=True, text=True
            ).stdout.strip()
            for name, repo in repos.items()
        }
        for name in ways:
            print(
                f"{name:<30} wall p50 {statistics.median(wall[name]) * 1000:6.1f} ms   "
                f"CPU p50 {statistics.median(cpu[name]) * 1000:6.1f} ms   tree {trees[name][:12]}"
            )
        if len(set(trees.values())) != 1:
            print("the ways recorded different trees")
            return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
