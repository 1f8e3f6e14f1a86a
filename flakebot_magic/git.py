"""The workspace's git repository: flakebot's commits, with a fixed identity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .errors import ForkError
from .process import ProcessRunner, scrubbed_env

__all__ = ["Git"]

_IDENTITY = {
    "GIT_AUTHOR_NAME": "flakebot",
    "GIT_AUTHOR_EMAIL": "flakebot@localhost",
    "GIT_COMMITTER_NAME": "flakebot",
    "GIT_COMMITTER_EMAIL": "flakebot@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
}
_OPTIONS = ("-c", "commit.gpgsign=false", "-c", "core.autocrlf=false", "-c", "core.fsmonitor=false")


class Git:
    """Runs git in one repository through the process runner."""

    def __init__(self, root: Path, runner: ProcessRunner) -> None:
        self.root = root
        self.runner = runner
        self.env = scrubbed_env(_IDENTITY)

    def __call__(self, *args: str, check: bool = True, timeout: float = 120.0) -> str:
        done = self.runner.run(
            ["git", *_OPTIONS, *args], cwd=self.root, env=self.env, timeout=timeout, workspace=self.root
        )
        if check and done.returncode != 0:
            raise ForkError(
                f"`git {' '.join(args)}` failed in {self.root}: {done.stderr.strip() or done.stdout.strip()}",
                workspace=self.root,
            )
        return done.stdout.strip()

    def init(self, branch: str) -> None:
        self("init", "-q", "-b", branch)
        exclude = self.root / ".git" / "info" / "exclude"
        exclude.parent.mkdir(parents=True, exist_ok=True)
        # build outputs never belong in the history
        exclude.write_text("/target/\n/result\n/result-*\n")

    def commit(
        self, message: str, paths: Sequence[str] = (), *, all_files: bool = False, force: bool = False
    ) -> str | None:
        """Commit ``paths`` (forced past the crate's own .gitignore) or all files.

        ``force`` with ``all_files`` adds even what the crate's .gitignore
        names (the published source is committed whole). Returns the new
        commit id, or None when there was nothing to commit.
        """
        if all_files:
            self("add", "-A", *(["-f"] if force else []), ".")
        if paths:
            present = [p for p in paths if (self.root / p).exists()]
            if present:
                self("add", "-f", "--", *present)
            gone = [p for p in paths if not (self.root / p).exists()]
            if gone:
                self("rm", "-q", "--cached", "--ignore-unmatch", "--", *gone)
        if not self("status", "--porcelain", "--untracked-files=no"):
            return None
        self("commit", "-q", "--no-verify", "-m", message)
        return self.head()

    def head(self) -> str:
        return self("rev-parse", "HEAD")

    def is_dirty(self) -> bool:
        return bool(self("status", "--porcelain"))
