"""The proven commit: what the release build compiles, exported from git's objects, never the work tree.

The work tree of a workspace is where sandboxed code ran: besides the
committed sources it holds what tests and build scripts left (``target/``,
files no commit names). A release build of the work tree could compile such
a file (``include!("../target/hidden.rs")``, rewritten by a test after the
last check run) into a binary that no diff, proof or ``verify`` ever saw. So
the release build compiles the commit, and only the commit:

1. :func:`settle`: the source on disk, when it differs from ``HEAD`` (a rare
   leftover: every check run commits its tree), is committed first, so the
   commit built and the tree tested are one (``target/`` and the other
   :data:`~flakebot_magic.sandbox.layout.NOT_SOURCE` entries are never
   source);
2. :func:`export`: that commit's tree is written from git's objects
   (:meth:`~flakebot_magic.host.git.Git.export_commit`) into a fresh
   directory beside the workspace (:func:`~flakebot_magic.sandbox.release_source`),
   which the release build's sandbox shows read-only, with the workspace not
   shown at all (:meth:`~flakebot_magic.sandbox.cargo.Cargo.for_release`);
   the nix backend builds the same directory as a ``path:`` flake.

:class:`ProvenSource` (the commit, its tree and the directory) travels to the
manifest and the proof, which say what was built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError
from ..host.fsutil import private_dir
from ..host.git import Git
from ..host.trees import remove_tree
from ..sandbox import release_source
from ..sandbox.layout import SOURCE_PATHSPEC

__all__ = ["ProvenSource", "export", "settle"]

#: the message of the commit :func:`settle` makes
SETTLE_MESSAGE = (
    "Record the work tree the build proves\n\n"
    "The release build compiles a commit, never the work tree: what was on disk is committed first."
)


@dataclass(frozen=True)
class ProvenSource:
    """The commit the release build compiled, its tree, and where its files were exported."""

    commit: str
    tree: str
    path: Path


def settle(git: Git) -> str:
    """The commit whose tree is the workspace's source: ``HEAD``, after committing what differs on disk."""
    if git("status", "--porcelain", "--untracked-files=all", "--", *SOURCE_PATHSPEC):
        git("add", "-A", "-f", "--", *SOURCE_PATHSPEC)
        git.commit_index(SETTLE_MESSAGE, allow_empty=False)
    return git.head()


def export(git: Git, workspace: Path, commit: str) -> ProvenSource:
    """``commit``'s files from git's objects into a fresh :func:`~flakebot_magic.sandbox.release_source` dir."""
    dest = release_source(workspace)
    try:
        private_dir(dest.parent)
        remove_tree(dest)  # the last build's export (flakebot's own directory: nothing sandboxed writes it)
        git.export_commit(commit, dest)
    except OSError as exc:
        raise BuildError(f"Could not export commit {commit} of {workspace.name} for the build: {exc}") from exc
    return ProvenSource(commit, git.tree(commit), dest)
