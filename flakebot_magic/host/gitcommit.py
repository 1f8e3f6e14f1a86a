"""A check run's commit made in-process (libgit2, through pygit2): what ``git add -A -f`` then ``git commit`` record.

The edit loop commits the workspace after every check run. Two git processes
per commit (``add``, then ``commit``) were most of flakebot's own time per
check run (``benchmarks/bench_commit.py`` measures the git CLI, pygit2 and
dulwich side by side). :class:`WorktreeCommitter` records the same tree, in
this process:

* every regular file and symlink under the root but the top-level entries
  the caller excludes (build outputs), whatever a ``.gitignore`` says (``-f``);
  entries of files that are gone are removed; a directory named ``.git`` is
  never entered (git records a nested repository as a link, and the build
  policy refuses it: such a commit goes to the git CLI);
* a file is hashed again only when its
  :func:`~flakebot_magic.host.fsutil.identity` changed since it was added
  here, or it had changed within :data:`~flakebot_magic.host.fsutil.RACY_SECONDS`
  of that; and every file is hashed again after anything else wrote the index
  (a revert's ``git read-tree``): its identity is checked before each commit;
* libgit2 reads the repository's own configuration only (never the user's or
  the system's: their search paths are emptied), which :meth:`Git.clean_config
  <flakebot_magic.host.git.Git.clean_config>` has cut to what ``git init``
  writes; it runs no hook, filter or any other program, and the attributes
  file flakebot writes sets every attribute back to unspecified.

:meth:`WorktreeCommitter.commit` returns None whenever it cannot (pygit2
missing, a path that is not UTF-8, a nested repository, any libgit2 error):
the caller then commits with the git CLI.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .fsutil import identity, settled
from .trees import Walk

__all__ = ["WorktreeCommitter", "clean_message"]

_TRAILING_SPACE = re.compile(r"[ \t]+$", re.M)
_BLANK_RUNS = re.compile(r"\n{3,}")


def clean_message(message: str) -> str:
    """A commit message as ``git commit -m`` records it (``--cleanup=whitespace``).

    >>> clean_message("\\n\\nhead  \\n\\n\\n\\nbody\\t\\n\\n")
    'head\\n\\nbody\\n'
    """
    text = _BLANK_RUNS.sub("\n\n", _TRAILING_SPACE.sub("", message)).strip("\n")
    return text + "\n" if text else ""


def _pygit2() -> Any:
    """pygit2, its user and system configuration search paths emptied; None when it is not installed."""
    try:
        import pygit2
    except ImportError:
        return None
    levels = pygit2.enums.ConfigLevel
    for level in (levels.GLOBAL, levels.XDG, levels.SYSTEM, levels.PROGRAMDATA):
        pygit2.settings.search_path[level] = ""
    return pygit2


class WorktreeCommitter:
    """Commits one work tree in-process; remembers what it hashed, so a commit reads only the changed files.

    ``excluded(name)``: whether the root's entry ``name`` is left out (and
    whatever the index holds under it left as it is, as ``git add`` does with
    an excluding pathspec). ``name`` and ``email``: the author and committer.
    """

    def __init__(self, root: Path, excluded: Callable[[str], bool], *, name: str, email: str) -> None:
        self.root = Path(os.path.abspath(root))
        self.excluded = excluded
        self.name, self.email = name, email
        #: each file's identity when it was last added to the index here (only settled ones)
        self._added: dict[str, tuple[int, ...]] = {}
        #: the index file's identity after this committer last wrote it
        self._index: tuple[int, ...] = ()

    def _files(self) -> dict[str, tuple[int, ...]] | None:
        """Every regular file and symlink to commit, by relative path; None when git would record something
        else (a nested repository) or a path cannot be a git path here."""
        found: dict[str, tuple[int, ...]] = {}
        top = str(self.root)
        walk = Walk(top)  # an explicit stack; a tree deeper than it reads is left to git's CLI
        for dirpath, dirnames, filenames in walk:
            at_root = dirpath == top
            if not at_root and (".git" in dirnames or ".git" in filenames):
                return None  # a nested repository: git records it as a link
            if at_root:
                dirnames[:] = [d for d in dirnames if d != ".git" and not self.excluded(d)]
                filenames = [f for f in filenames if not self.excluded(f)]
            prefix = "" if at_root else os.path.relpath(dirpath, top) + "/"
            for name in [*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    continue  # a FIFO, a socket, a device: git adds none of them
                rel = prefix + name
                try:
                    rel.encode("utf-8")
                except UnicodeEncodeError:
                    return None
                found[rel] = identity(st)
        return None if walk.too_deep or walk.unreadable else found

    def commit(self, message: str) -> str | None:
        """Commit the work tree (as ``git add -A -f`` of all but the excluded entries, then ``git commit
        --allow-empty``); the new commit's id, or None when the git CLI must do it."""
        pygit2 = _pygit2()
        if pygit2 is None:
            return None
        try:
            return self._commit(pygit2, message)
        except (pygit2.GitError, OSError, ValueError, KeyError):
            self._added.clear()
            return None

    def _commit(self, pygit2: Any, message: str) -> str | None:
        files = self._files()
        if files is None:
            return None
        index_path = os.path.join(self.root, ".git", "index")  # git's index file (not the cache's index/)
        with contextlib.suppress(OSError):
            if identity(os.stat(index_path)) != self._index:
                self._added.clear()  # someone else wrote the index: hash every file again
        repo = pygit2.Repository(str(self.root), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
        index = repo.index
        indexed = {entry.path for entry in index}
        for rel, key in files.items():
            if rel in indexed and self._added.get(rel) == key:
                continue
            index.add(rel)
            if settled(key):
                self._added[rel] = key
            else:
                self._added.pop(rel, None)
        for rel in indexed - files.keys():
            if not self.excluded(rel.split("/", 1)[0]):
                index.remove(rel)
                self._added.pop(rel, None)
        index.write()
        tree = index.write_tree()
        who = pygit2.Signature(self.name, self.email)
        parents = [] if repo.head_is_unborn else [repo.head.target]
        commit = repo.create_commit("HEAD", who, who, clean_message(message), tree, parents)
        self._index = identity(os.stat(index_path))
        return str(commit)
