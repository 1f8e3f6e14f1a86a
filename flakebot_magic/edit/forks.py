"""Candidate workspaces: a clone of the tool's workspace per candidate, with a warm target dir, and the winner's adoption.

``--candidates N`` runs N engineers at once, each in
``<workspace>/.flakebot-candidates/<index>``: a copy of the sources and of
``.git``, plus a copy of the edit loop's target dir
(:data:`~flakebot_magic.edit.checkrun.LOOP_TARGET`) made so that the clone's
first check run compiles no dependency (its ``dependency_units`` is 0) and no
two candidates share a file cargo may rewrite.

How the target dir is cloned (measured on ext4, 2 shared cores, page cache warm)
---------------------------------------------------------------------------------
``hexyl`` 0.8.0 from Debian's registry (a CLI, 49 dependency units with
clippy's), after its check run 0 (12.5 s): ``target/flakebot-test`` holds
106.6 MB in 703 files (94 MB on disk), most of it in ``debug/deps``. Seconds
to clone it, the best and the median of 11 runs, and the disk each clone adds:

* reflink (``cp --reflink=always``): none on ext4 ("Operation not supported");
* hard links (``cp -al``): 0.011 / 0.014 s, 0 MB, UNSAFE: after an edit, a
  candidate's build of the two-dependency test crate rewrote 17 files of the
  workspace's target dir through the links (fingerprints, ``.rustc_info.json``);
* plain copy (``cp -a``): 0.065 / 0.072 s, 107 MB, safe;
* ``shutil.copytree``: 0.085 / 0.105 s, 107 MB, safe;
* hard links for dependencies' libraries only: 0.040 / 0.049 s, 42 MB, UNSAFE
  too: rustc replaces a library rather than writing through it, but a
  candidate's test is not rustc; it can open a hard-linked ``.rlib`` and
  append to it, and the workspace and every other candidate link against the
  changed bytes (the red team's A15).

So :func:`clone_target` copies every file (its own loop, with modification
times: cargo's freshness is by mtime): no inode of a clone is shared with the
workspace or another candidate, which ``tests/edit/test_forks.py`` checks
after a real candidate's run. The whole :func:`clone_candidate` (sources and
``.git`` too) of ``hexyl``, measured again on a loaded machine (load average
15 on the 2 cores; ``benchmarks/bench_workspace_paths.py clone``):
0.215 / 0.501 s (best / median of 11) with the shared libraries, 0.347 /
0.636 s copying everything, about 0.13 s more per candidate. Every method
leaves the dependencies fresh after the move: a clone's first check run
compiles 0 dependency units.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import Cancelled, ForkError
from ..host.fsutil import atomic_write, is_real_dir, read_regular, real_dir
from ..host.git import Git
from ..host.process import CancelToken, ProcessRunner
from ..host.trees import remove_tree
from ..sandbox.layout import CANDIDATES_DIR, OUTPUT_DIRS
from .checkrun import LOOP_TARGET

__all__ = [
    "CANDIDATES_DIR",
    "CANDIDATE_REFS",
    "CloneStats",
    "adopt",
    "candidate_path",
    "clone_candidate",
    "clone_target",
    "keep_head",
]

#: each candidate's head is kept in the tool's workspace as ``refs/flakebot/candidates/<index>``
CANDIDATE_REFS = "refs/flakebot/candidates"


@dataclass
class CloneStats:
    """What a target dir clone did: the files copied and their bytes."""

    copied: int = 0
    copied_bytes: int = 0


def candidate_path(workspace: Path, index: int) -> Path:
    """``<workspace>/.flakebot-candidates/<index>``."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"a candidate's index is a whole number from 0, not {index!r}")
    return Path(workspace) / CANDIDATES_DIR / str(index)


def clone_candidate(workspace: Path, index: int, *, runner: ProcessRunner | None = None) -> Path:
    """Clone ``workspace`` for candidate ``index``; return the clone's path (:func:`candidate_path`).

    The clone has the working tree as it is (uncommitted files too; build
    outputs aside), a copy of ``.git``, and a warm copy of the loop's target
    dir (:func:`clone_target`). A clone left by an earlier session under the
    same index is replaced. The copy is made under a temporary name and renamed
    into place, so an interrupted clone never looks like a candidate.
    ``runner``'s cancel token stops the copy between directories
    (:class:`~flakebot_magic.errors.Cancelled`). The workspace's
    ``.git/info/exclude`` gets ``/.flakebot-candidates/``, so git never sees
    the candidates there (``git status``, ``git add -A``).

    Call it while nothing runs in ``workspace``.
    """
    workspace = Path(workspace).resolve()
    dest = candidate_path(workspace, index)
    cancel = runner.cancel if runner is not None else None
    _exclude_candidates(workspace)
    parent = real_dir(workspace, dest.parent, mode=0o700)
    tmp = parent / f".{index}.tmp-{secrets.token_hex(4)}"
    try:
        _copy_sources(workspace, tmp, cancel)
        source_target = workspace.joinpath(*LOOP_TARGET)
        if is_real_dir(source_target) and is_real_dir(source_target.parent):
            clone_target(source_target, tmp.joinpath(*LOOP_TARGET), cancel=cancel)
        remove_tree(dest)
        os.rename(tmp, dest)
    except BaseException as exc:
        remove_tree(tmp)
        if isinstance(exc, OSError):
            raise ForkError(
                f"Could not clone the workspace {workspace} for candidate #{index}: {exc}", workspace=workspace
            ) from exc
        raise
    return dest


def clone_target(source: Path, dest: Path, *, cancel: CancelToken | None = None) -> CloneStats:
    """Copy the cargo target dir ``source`` to ``dest``: every regular file copied with its mode and times.

    No file is hard-linked: a clone shares no inode with ``source``, so no
    sandboxed code of one candidate writes another's files. Symlinks are copied
    as links, anything but files, directories and links is left out.
    """
    stats = CloneStats()
    dest.parent.mkdir(parents=True, exist_ok=True)
    _clone_dir(str(source), str(dest), stats, cancel)
    return stats


def _clone_dir(source: str, dest: str, stats: CloneStats, cancel: CancelToken | None) -> None:
    if cancel is not None and cancel.cancelled:
        raise Cancelled("The run was cancelled while a candidate's workspace was being cloned.")
    os.mkdir(dest, 0o700)
    with os.scandir(source) as entries:
        for entry in entries:
            src, dst = entry.path, os.path.join(dest, entry.name)
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                _clone_dir(src, dst, stats, cancel)
            elif stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISREG(info.st_mode):
                _copy_file(src, dst, info)
                stats.copied += 1
                stats.copied_bytes += info.st_size
    os.chmod(dest, stat.S_IMODE(os.lstat(source).st_mode))


def _copy_file(source: str, dest: str, info: os.stat_result) -> None:
    """Copy a regular file with its mode and times; never follows a link, never blocks on a FIFO."""
    fd_in = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd_in).st_mode):
            return  # replaced since it was listed
        fd_out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _copy_bytes(fd_in, fd_out)
            os.fchmod(fd_out, stat.S_IMODE(info.st_mode))
            # cargo's freshness is by modification time: a copy keeps it
            os.utime(fd_out, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def keep_head(workspace: Path, candidate: Path, index: int, git: Git) -> str:
    """Fetch ``candidate``'s HEAD into ``workspace`` as ``refs/flakebot/candidates/<index>``; return the commit.

    The candidate's repository is hardened first, as flakebot hardens every
    repository it runs git in (:class:`~flakebot_magic.host.git.Git`): its
    ``.git/config`` is cut to what ``git init`` writes before any git command
    reads it, an ``objects/info/alternates`` file is removed, and its hooks
    never run (the fetch runs only ``git upload-pack`` there, which runs none).
    Fetched objects are checked (``fetch.fsckObjects``). Call it once the
    candidate's processes have stopped.
    """
    workspace = Path(workspace).resolve()
    candidate = Path(candidate).resolve()
    expected = candidate_path(workspace, index)
    if candidate != expected.resolve() or not is_real_dir(candidate) or not is_real_dir(candidate.parent):
        raise ForkError(f"{candidate} is not candidate #{index}'s workspace ({expected}).", workspace=workspace)
    theirs = Git(candidate, git.runner)
    theirs.clean_config()  # raises when .git is not a real directory
    info = candidate / ".git" / "objects" / "info"
    if is_real_dir(info.parent) and is_real_dir(info):
        for name in ("alternates", "http-alternates"):  # objects from anywhere on the machine
            if os.path.lexists(info / name):
                os.unlink(info / name)
    head = theirs("rev-parse", "--verify", "HEAD^{commit}")
    ref = f"{CANDIDATE_REFS}/{index}"
    # by commit id, not by ref name: what was read above is what is fetched
    git(
        "-c",
        "protocol.file.allow=always",
        "-c",
        "fetch.fsckObjects=true",
        "fetch",
        "--quiet",
        "--no-tags",
        "--no-write-fetch-head",
        "--no-recurse-submodules",
        str(candidate),
        f"+{head}:{ref}",
    )
    return head


def adopt(workspace: Path, candidate: Path, index: int, git: Git, *, losers: Mapping[int, Path] | None = None) -> str:
    """Bring the winning ``candidate``'s commits into ``workspace``; return the workspace's new head.

    Every candidate's head is kept (:func:`keep_head`): the winner's, and the
    ``losers``' (index -> path; one that cannot be read is left out). The
    workspace's branch then moves to the winner's head, and its working tree
    and index follow (build outputs and candidates stay): the candidate was
    cloned from the workspace's head, so its history descends from it. Raises
    :class:`~flakebot_magic.errors.ForkError` when it does not (the workspace
    moved since the clone).
    """
    head = keep_head(workspace, candidate, index, git)
    for other, path in sorted((losers or {}).items()):
        if other != index:
            try:
                keep_head(workspace, path, other, git)
            except (ForkError, OSError):
                pass  # a loser is kept for inspection only; its workspace stays on disk
    old = git.head()
    if git("merge-base", old, head, check=False) != old:
        raise ForkError(
            f"Candidate #{index}'s history ({head[:12]}) does not descend from the workspace's head "
            f"({old[:12]}): the workspace changed after the candidates were cloned. The candidate's commits "
            f"are kept as {CANDIDATE_REFS}/{index}; its workspace stays at {candidate}.",
            workspace=Path(workspace),
        )
    # the clone had the working tree as it was, uncommitted files too, and the edit loop commits
    # everything: the winner's head holds all of it, so nothing of the workspace's is lost
    git("reset", "-q", "--hard", head)
    return git.head()


def _copy_bytes(fd_in: int, fd_out: int) -> None:
    try:
        while os.copy_file_range(fd_in, fd_out, 1 << 30):
            pass
    except OSError as exc:  # no copy_file_range between these file systems: read and write
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
        while chunk := os.read(fd_in, 1 << 20):
            os.write(fd_out, chunk)


def _exclude_candidates(workspace: Path) -> None:
    """Name the candidates in ``.git/info/exclude``: ``git status`` and ``git add -A`` then never see them."""
    exclude = workspace / ".git" / "info" / "exclude"
    line = f"/{CANDIDATES_DIR}/"
    try:
        data, _ = read_regular(exclude, 1024 * 1024)
        text = data.decode("utf-8", "replace")
    except OSError:  # none yet, or a symlink or a FIFO planted there: replaced, never followed
        text = ""
    if line not in text.splitlines():
        text = text + ("" if not text or text.endswith("\n") else "\n") + line + "\n"
        atomic_write(exclude, text, mode=0o644, root=workspace, make_parents=True)


def _copy_sources(workspace: Path, dest: Path, cancel: CancelToken | None) -> None:
    """The working tree and ``.git``, without build outputs or candidates; regular files, dirs and links only."""
    os.mkdir(dest, 0o700)
    stats = CloneStats()
    with os.scandir(workspace) as entries:
        for entry in entries:
            if entry.name in OUTPUT_DIRS:
                continue
            info = entry.stat(follow_symlinks=False)
            target = os.path.join(dest, entry.name)
            if stat.S_ISDIR(info.st_mode):
                _clone_dir(entry.path, target, stats, cancel)
            elif stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(entry.path), target)
            elif stat.S_ISREG(info.st_mode):  # a FIFO planted by crate code would block a read
                _copy_file(entry.path, target, info)
    os.chmod(dest, stat.S_IMODE(os.lstat(workspace).st_mode))
