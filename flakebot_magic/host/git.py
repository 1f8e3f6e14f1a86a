"""The workspace's git repository: flakebot's commits, with a fixed identity and no code of anyone else's.

Crate code and model-written code run with the workspace writable, so anything
under it, ``.git/`` included when a sandbox is weaker than it should be, may be
planted. git runs hooks, filters, fsmonitor commands, pagers, editors, external
diff drivers and textconv programs named by its configuration and by
``.gitattributes``: any of them would run as the user, outside the sandbox.
So every git command flakebot runs:

* sees no system or global configuration (``GIT_CONFIG_NOSYSTEM=1``,
  ``GIT_CONFIG_GLOBAL=/dev/null``, ``GIT_ATTR_NOSYSTEM=1``) and none of the
  kernel's ``GIT_*`` variables;
* gets command-line overrides (which win over any config file) for every key
  that names a program: ``core.hooksPath=/dev/null`` (``--no-verify`` skips
  ``pre-commit`` but not ``post-commit`` or ``prepare-commit-msg``; an empty
  hooks path skips them all), ``core.fsmonitor``, ``core.sshCommand``,
  ``core.pager``, ``core.editor``, ``credential.helper``, and more (see
  :data:`OVERRIDES`); ``diff``, ``log`` and ``show`` also get
  ``--no-ext-diff --no-textconv``;
* runs in a repository whose ``.git/config`` holds only the keys ``git init``
  writes (:data:`KEPT_CONFIG`): anything else, such as a
  ``[filter "evil"] clean = ...`` that ``.gitattributes``' ``* filter=evil``
  would run on ``git add``, an ``include.path`` or a ``core.worktree``, is
  dropped before the command runs (:meth:`Git.clean_config`). Filter, diff
  and merge drivers can only be defined in configuration, so with none left
  ``.gitattributes`` can name a driver but never start one;
* reads no attribute from the work tree: ``.git/info/attributes``, which wins
  over every ``.gitattributes``, sets each attribute git acts on back to
  unspecified (:data:`NEUTRAL_ATTRIBUTES`), so no ``.gitattributes`` can make
  a change invisible to the review diff (``-diff``, ``binary``) or make git
  record other bytes than the file holds (``text``, ``eol``, ``ident``,
  ``working-tree-encoding``); diffs are read with ``--text`` besides.

A git killed mid-command (a cancelled or crashed build kills its process
tree) leaves its lock files (``.git/index.lock``, ``HEAD.lock``, a ref's
``.lock``) behind, and every later git command in that repository fails
until they are gone. :func:`remove_stale_locks` removes the ones no process
holds open while no git runs in the repository; the fork (reusing a
workspace) and ``clean`` call it.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import ForkError
from ..untrusted import safe_text
from .fsutil import atomic_write, read_regular
from .gitcommit import WorktreeCommitter
from .process import ProcessRunner, scrubbed_env
from .trees import Walk, remove_tree

__all__ = ["KEPT_CONFIG", "NEUTRAL_ATTRIBUTES", "OVERRIDES", "Git", "remove_stale_locks", "stale_locks"]

_IDENTITY = {
    "GIT_AUTHOR_NAME": "flakebot",
    "GIT_AUTHOR_EMAIL": "flakebot@localhost",
    "GIT_COMMITTER_NAME": "flakebot",
    "GIT_COMMITTER_EMAIL": "flakebot@localhost",
}
_ENVIRONMENT = {
    **_IDENTITY,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_NO_REPLACE_OBJECTS": "1",  # refs/replace/ could make the history read differently
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": "false",
}

#: ``-c`` overrides on every command: they beat any configuration file
OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.sshCommand", "false"),
    ("core.askPass", "false"),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("credential.helper", ""),  # an empty value clears the list of helpers
    ("core.attributesFile", os.devnull),
    ("core.excludesFile", os.devnull),
    ("core.autocrlf", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("gc.auto", "0"),  # no detached `git gc` left running
    ("maintenance.auto", "false"),
    ("submodule.recurse", "false"),
    ("diff.ignoreSubmodules", "all"),  # never run git inside a planted nested repository
    ("safe.bareRepository", "explicit"),
    ("protocol.allow", "never"),  # the workspace has no remote; nothing is fetched
)
_OPTIONS = tuple(arg for key, value in OVERRIDES for arg in ("-c", f"{key}={value}"))
_NO_DRIVERS = {
    "diff": ("--no-ext-diff", "--no-textconv", "--text"),
    "log": ("--no-ext-diff", "--no-textconv"),
    "show": ("--no-ext-diff", "--no-textconv", "--text"),
}
#: ``.git/info/attributes``: every attribute git acts on, for every path, back to unspecified (this file wins
#: over any ``.gitattributes`` in the tree, which flakebot never imports and the policy refuses)
NEUTRAL_ATTRIBUTES = (
    "# Written by flakebot: no .gitattributes changes what git records or shows.\n"
    "* !text !eol !crlf !ident !filter !working-tree-encoding !diff !merge !whitespace "
    "!conflict-marker-size !export-ignore !export-subst !delta !encoding\n"
)

#: the only ``.git/config`` entries kept (section, key): what ``git init`` writes
KEPT_CONFIG = frozenset(
    {
        ("core", "repositoryformatversion"),
        ("core", "filemode"),
        ("core", "bare"),
        ("core", "logallrefupdates"),
        ("core", "ignorecase"),
        ("core", "precomposeunicode"),
        ("core", "symlinks"),
        ("extensions", "objectformat"),
        ("extensions", "refstorage"),
    }
)
_MAX_CONFIG = 64 * 1024
_SECTION = re.compile(r"^\s*\[([A-Za-z0-9.-]+)\]\s*(?:[#;].*)?$")
_ENTRY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*=\s*([A-Za-z0-9_.-]+)\s*(?:[#;].*)?$")
_COMMENT = re.compile(r"^\s*(?:[#;].*)?$")


class Git:
    """Runs git in one repository through the process runner, with nothing of the repository's run.

    Attributes
    ----------
    cleaned
        The ``.git/config`` lines :meth:`clean_config` dropped (planted by
        something that was not flakebot), for callers that report it.
    """

    def __init__(self, root: Path, runner: ProcessRunner) -> None:
        self.root = root
        self.runner = runner
        env = {k: v for k, v in scrubbed_env().items() if not k.startswith("GIT_")}
        env.update(_ENVIRONMENT)
        # git never looks for a repository above the workspace (a missing .git is an error, not the user's repo)
        env["GIT_CEILING_DIRECTORIES"] = os.path.abspath(os.path.dirname(os.path.abspath(root)))
        self.env = env
        self.cleaned: list[str] = []
        #: git found on PATH once: each command starts with one exec, not one per PATH entry
        self.program = shutil.which("git", path=env.get("PATH")) or "git"
        self._committer: WorktreeCommitter | None = None

    def __call__(self, *args: str, check: bool = True, timeout: float = 120.0, input: bytes | None = None) -> str:
        if args and args[0] != "init":
            self.clean_config()
        extra = _NO_DRIVERS.get(args[0], ()) if args else ()
        argv = [self.program, *_OPTIONS, *args[:1], *extra, *args[1:]]
        done = self.runner.run(argv, cwd=self.root, env=self.env, timeout=timeout, workspace=self.root, input=input)
        if check and done.returncode != 0:
            raise ForkError(
                f"`git {' '.join(args)}` failed in {self.root}: {done.stderr.strip() or done.stdout.strip()}",
                workspace=self.root,
            )
        return done.stdout.strip()

    def clean_config(self) -> list[str]:
        """Keep only :data:`KEPT_CONFIG` in ``.git/config``; return the lines dropped.

        Raises :class:`~flakebot_magic.errors.ForkError` when ``.git`` is not a
        real directory (a symlink or a ``gitdir:`` file would point git at
        another repository). A ``commondir`` file (which would make git read
        another repository's configuration) is removed: flakebot never makes
        linked worktrees.
        """
        git_dir = Path(self.root) / ".git"
        try:
            info = os.lstat(git_dir)
        except FileNotFoundError:
            return []  # git itself says there is no repository
        if not stat.S_ISDIR(info.st_mode):
            raise ForkError(
                f"{git_dir} is not a directory (a symlink or a gitdir file, planted by code that ran in the "
                "workspace?); refusing to run git there. Fork the crate again (--rebuild).",
                workspace=self.root,
            )
        dropped: list[str] = []
        attributes = git_dir / "info" / "attributes"
        if _read_small(attributes) != NEUTRAL_ATTRIBUTES:
            atomic_write(attributes, NEUTRAL_ATTRIBUTES, mode=0o644, root=self.root, make_parents=True)
        commondir = git_dir / "commondir"
        if os.path.lexists(commondir):
            os.unlink(commondir)
            dropped.append("(a commondir file)")
        config = git_dir / "config"
        text = _read_small(config)
        if text is not None:
            kept: list[tuple[str, str, str]] = []
            planted: list[str] = []
            section = ""
            for line in text.splitlines():
                header = _SECTION.match(line)
                entry = _ENTRY.match(line) if header is None else None
                if header is not None:
                    section = header.group(1).lower()
                elif entry is not None and _kept(section, entry.group(1).lower(), entry.group(2)):
                    kept.append((section, entry.group(1).lower(), entry.group(2)))
                elif not _COMMENT.match(line):
                    planted.append(line.strip()[:200])
            if planted:
                atomic_write(config, _render_config(kept), mode=0o644, root=self.root)
                dropped += planted
        self.cleaned += dropped
        return dropped

    def init(self, branch: str) -> None:
        """A new repository in the workspace, which must hold no ``.git`` yet (git would reuse it)."""
        if os.path.lexists(self.root / ".git"):
            raise ForkError(
                f"{self.root} already holds a .git; flakebot makes its repositories only in new workspaces.",
                workspace=self.root,
            )
        self("init", "-q", "-b", branch)
        info = self.root / ".git" / "info"
        info.mkdir(parents=True, exist_ok=True)
        # build outputs never belong in the history
        atomic_write(info / "exclude", "/target/\n/result\n/result-*\n", mode=0o644, root=self.root)
        atomic_write(info / "attributes", NEUTRAL_ATTRIBUTES, mode=0o644, root=self.root)

    def commit_files(self, message: str, files: Sequence[str]) -> str:
        """The first commit, of exactly ``files`` (relative paths) as they are on disk; returns its id.

        The index is built afresh from the files' bytes (``hash-object
        --no-filters``; a symlink's target text), never from what git would
        find or skip in the work tree, and the tree is checked against the
        files before the commit is made: the recorded tree is the tree on disk.
        """
        root = self.root
        links = [f for f in files if os.path.islink(root / f)]
        regular = [f for f in files if f not in set(links)]
        ids = self(
            "hash-object", "-w", "--no-filters", "--stdin-paths", input="".join(f + "\n" for f in regular).encode()
        )
        blob_ids = dict(zip(regular, ids.split(), strict=True)) if regular else {}
        for link in links:
            blob_ids[link] = self("hash-object", "-w", "--stdin", input=os.readlink(os.fsencode(root / link)))
        entries = []
        for name in files:
            mode = "120000" if name in links else ("100755" if os.stat(root / name).st_mode & 0o111 else "100644")
            entries.append(f"{mode} {blob_ids[name]}\t{name}\0")
        self("update-index", "--add", "-z", "--index-info", input="".join(entries).encode())
        tree = self("write-tree")
        recorded = {}
        for entry in self("ls-tree", "-r", "-z", "--full-tree", tree).split("\0"):
            meta, _, path = entry.partition("\t")
            if path:
                recorded[path] = meta.split()[2]
        if recorded != blob_ids:
            raise ForkError(
                f"git recorded another tree than the files in {root} ({len(recorded)} entries for "
                f"{len(blob_ids)} files); nothing was committed.",
                workspace=root,
            )
        commit = self("commit-tree", tree, "-m", safe_text(message))
        self("update-ref", "HEAD", commit)
        self("update-index", "-q", "--refresh", check=False)  # stat data for the fresh entries: `status` is clean
        return commit

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
            present = [p for p in paths if os.path.lexists(self.root / p)]
            if present:
                self("add", "-f", "--", *present)
            gone = [p for p in paths if not os.path.lexists(self.root / p)]
            if gone:
                self("rm", "-q", "--cached", "--ignore-unmatch", "--", *gone)
        if not self("status", "--porcelain", "--untracked-files=no"):
            return None
        return self.commit_index(message, allow_empty=False)

    def commit_index(self, message: str, *, allow_empty: bool = True) -> str:
        """Commit what the index holds (no hook runs); the new HEAD.

        Every commit message flakebot writes passes :func:`~flakebot_magic.untrusted.safe_text` here, in
        :meth:`commit_files` and in :meth:`commit_in_process`: a check run's message quotes the compiler
        (a ``compile_error!`` of the code's choosing), test names and the policy's verdict, and ``git log``
        prints a message raw to the user's terminal.
        """
        self("commit", "-q", "--no-verify", *(["--allow-empty"] if allow_empty else []), "-m", safe_text(message))
        return self.head()

    def commit_in_process(self, message: str, *, excluded: Callable[[str], bool]) -> str | None:
        """Commit every file of the work tree but the root's ``excluded`` entries, as ``git add -A -f`` and
        ``git commit --allow-empty`` would, without starting git (:mod:`.gitcommit`); the new commit's id, or
        None when the git CLI must do it."""
        self.clean_config()
        if self._committer is None or self._committer.excluded is not excluded:
            self._committer = WorktreeCommitter(
                Path(self.root), excluded, name=_IDENTITY["GIT_COMMITTER_NAME"], email=_IDENTITY["GIT_COMMITTER_EMAIL"]
            )
        return self._committer.commit(safe_text(message))

    def export_commit(self, commit: str, dest: Path) -> list[str]:
        """Write the files of ``commit`` into the new directory ``dest`` from git's objects; return their paths.

        Never reads the work tree: whatever sandboxed code changed or planted
        there since the commit (a file rewritten after the build, a directory
        replaced by a symlink to ``/root``) is not exported. git writes the
        files through a temporary index of its own (``checkout-index
        --prefix``), into a directory made here, so no path in it can have been
        planted. ``dest`` must not exist.
        """
        dest = Path(os.path.abspath(dest))
        os.mkdir(dest, 0o755)
        scratch = tempfile.mkdtemp(prefix="flakebot-export-")
        try:
            export = Git(self.root, self.runner)
            export.env = {**self.env, "GIT_INDEX_FILE": os.path.join(scratch, "index")}
            tree = self("rev-parse", "--verify", f"{commit}^{{tree}}")
            export("read-tree", tree)
            export("checkout-index", "-a", "-f", f"--prefix={dest}/")
            listed = export("ls-files", "-z")
        finally:
            remove_tree(scratch, ignore_errors=True)
        return [f for f in listed.split("\0") if f]

    def head(self) -> str:
        return self("rev-parse", "HEAD")

    def tree(self, commit: str = "HEAD") -> str:
        """The tree id of ``commit``: two commits with the same files have the same tree.

        A full commit id stored as a loose object (every commit flakebot makes: it never packs) is read
        in-process, its first line names the tree; anything else asks ``git rev-parse``.
        """
        return _loose_commit_tree(Path(self.root) / ".git", commit) or self("rev-parse", f"{commit}^{{tree}}")

    def is_dirty(self) -> bool:
        return bool(self("status", "--porcelain"))


_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _loose_commit_tree(git_dir: Path, commit: str) -> str:
    """The tree id on the first line of the loose commit object ``commit`` (a full id), or "" when it is not one.

    The object is git's own (``.git`` is read-only to everything sandboxed), read without following a
    symlink and inflated no further than its header and first line.
    """
    if not _OBJECT_ID.fullmatch(commit):
        return ""
    try:
        data, _ = read_regular(git_dir / "objects" / commit[:2] / commit[2:], 4096)
        head = zlib.decompressobj().decompress(data, 256)
    except (OSError, zlib.error):
        return ""
    kind, _, rest = head.partition(b"\0")
    line = rest.split(b"\n", 1)[0].decode("ascii", "replace")
    if not kind.startswith(b"commit ") or not line.startswith("tree "):
        return ""
    tree = line[5:]
    return tree if _OBJECT_ID.fullmatch(tree) and len(tree) == len(commit) else ""


def _read_small(path: Path) -> str | None:
    """The text of a small regular file, never read through a symlink; None when there is none.

    Anything else (a symlink, a FIFO, an oversized file) reads as a line no
    parser accepts, so the caller replaces it.
    """
    try:
        data, more = read_regular(path, _MAX_CONFIG)
    except FileNotFoundError:
        return None
    except OSError:  # a symlink, a FIFO, a device (UnsafePath), or unreadable
        return "<not a regular file>"
    if more:
        return f"<over {_MAX_CONFIG} bytes>"
    return data.decode("utf-8", "replace")


def _kept(section: str, key: str, value: str) -> bool:
    if (section, key) not in KEPT_CONFIG:
        return False
    return value.lower() == "false" if key == "bare" else True


def _render_config(entries: list[tuple[str, str, str]]) -> str:
    sections: dict[str, list[tuple[str, str]]] = {}
    for section, key, value in entries:
        sections.setdefault(section, []).append((key, value))
    if "core" not in sections:  # git needs at least the format version
        sections["core"] = [("repositoryformatversion", "0")]
    lines: list[str] = []
    for section, items in sections.items():
        lines.append(f"[{section}]")
        lines += [f"\t{key} = {value}" for key, value in items]
    return "\n".join(lines) + "\n"


# -- lock files a killed git left behind ------------------------------------------------------


def stale_locks(root: Path) -> list[Path]:
    """The lock files in ``root``'s ``.git`` that no process holds, while no git process runs there.

    A lock is held while some process has it open (git keeps its lock file
    open until it renames it into place); and while any git process works
    in the repository, none is taken for stale (it may be between writing a
    lock and opening the next).
    """
    git_dir = Path(root) / ".git"
    try:
        if not stat.S_ISDIR(os.lstat(git_dir).st_mode):
            return []
    except OSError:
        return []
    refs = [Path(d) / f for d, _, files in Walk(git_dir / "refs") for f in files if f.endswith(".lock")]
    found = [p for p in [*git_dir.glob("*.lock"), *refs] if _regular(p)]
    if not found:
        return []
    open_files, git_dirs = _open_files_and_git_dirs()
    if any(_inside(directory, Path(root)) for directory in git_dirs):
        return []
    return [path for path in found if os.path.abspath(path) not in open_files]


def remove_stale_locks(root: Path) -> list[Path]:
    """Remove :func:`stale_locks` of ``root``; return what was removed."""
    removed = []
    for path in stale_locks(root):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(os.path.abspath(root))
    except ValueError:
        return False
    return True


def _open_files_and_git_dirs() -> tuple[set[str], list[Path]]:
    """Every file some process has open (that this user may see), and the working dirs of running git processes."""
    files: set[str] = set()
    git_dirs: list[Path] = []
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return files, git_dirs
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip().startswith("git"):
                    git_dirs.append(Path(os.readlink(f"/proc/{pid}/cwd")))
        except OSError:
            pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                files.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
    return files, git_dirs
