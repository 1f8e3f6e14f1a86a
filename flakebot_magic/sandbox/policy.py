"""The build policy: what a workspace may contain before cargo or nix builds it, checked on disk.

Model-written code and a crate's own tests run with the workspace writable, so
whatever they leave behind is checked again before anything builds it: after
every check run of the edit loop, and before every build of the pipeline, on
both backends. The model's tool calls are checked against the same rules
(:func:`check_manifest`, :data:`REFUSED_DIRS`, :data:`TOOLCHAIN_FILES`).

Refused, with a :class:`Violation` naming the file, why, and what to do:

* a build script (``build.rs`` next to a manifest, or one named by
  ``package.build``) unless build scripts are allowed, or it is the crate's
  own, byte for byte as published;
* a ``.cargo/`` directory anywhere (cargo configuration can replace sources,
  set a ``runner`` or a ``rustc-wrapper``, and applies to flakebot's own
  cargo commands), and a git repository nested in the tree;
* ``rust-toolchain`` / ``rust-toolchain.toml``, unless unchanged as published
  (it picks the compiler, even one at a ``path``);
* a proc-macro crate that was not one as published, however it says so
  (``[lib] proc-macro = true``, ``proc_macro``, ``crate-type = ["proc-macro"]``),
  in the root manifest or any member (a proc macro runs code at compile time,
  like a build script);
* ``.gitattributes`` and ``.gitmodules`` anywhere (the fork drops a crate's
  own, so any there was written since): attributes can hide a change from the
  review diff or make git record other bytes than the file holds;
* ``[patch]`` and ``[replace]``; ``git`` and ``registry-index``
  dependencies; any ``path`` (dependency, target, workspace member) that
  leaves the workspace or points into ``.git/`` or ``target/``;
* a symlink that points outside the workspace or into ``.git/``.

**The published crate is trusted as published.** What the registry served is
the fork's first commit (the ``published`` tag): its build script, its
proc-macro declaration and its toolchain file are part of the crate the user
chose, and are allowed while they are unchanged (:class:`Baseline`). A build
script that is new or changed (written by the model, or by a test) is refused
unless the user allowed build scripts. A published build script that
``include!``s a file the model changed is not detected: the sandbox, not this
policy, confines what build scripts do.

Only manifests cargo reads are checked: the root ``Cargo.toml``, its workspace
members and its path dependencies, transitively; a fixture crate under
``tests/`` that nothing depends on is not built, so not checked.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from ..errors import PolicyError
from ..host.fsutil import UnsafePath, load_toml, read_regular
from ..host.trees import MAX_DEPTH, Walk
from ..untrusted import safe_line, safe_text
from . import manifest as schema
from .layout import OUTPUT_DIRS, is_source, source_dirs
from .manifest import package_table

if TYPE_CHECKING:
    from ..host.git import Git

__all__ = [
    "GIT_FILES",
    "PUBLISHED_REF",
    "REFUSED_DIRS",
    "TOOLCHAIN_FILES",
    "Baseline",
    "TreePolicy",
    "Violation",
    "check_manifest",
    "check_tree",
    "enforce",
]

#: the tag the fork puts on the published source
PUBLISHED_REF = "published"
#: directories no model, test or crate may write, and why
REFUSED_DIRS = {
    ".git": "the git history is flakebot's",
    ".cargo": "cargo configuration could change how the code is built",
}
#: files that choose the compiler
TOOLCHAIN_FILES = ("rust-toolchain", "rust-toolchain.toml")
#: files git reads from the work tree as configuration: attributes (diff, text, filters, encodings), submodules
GIT_FILES = (".gitattributes", ".gitmodules")

_MAX_MANIFEST = 1024 * 1024
_MAX_HASHED = 16 * 1024 * 1024
_MAX_MANIFESTS = 500
_ALLOW_HINT = "or let the user allow build scripts (--allow-build-scripts)"


@dataclass(frozen=True)
class Violation:
    """One thing the policy refuses: the file (relative to the workspace), why, and what to do.

    Text, never a name to act on: sandboxed code chose the file's name and a link's target, so each is kept
    as one safe line (:func:`~flakebot_magic.untrusted.safe_line`: no escape sequence, no newline that fakes
    another violation, a name that is not UTF-8 shown with ``\ufffd``), the why and the remedy as safe text.
    It reaches the model, the check run's commit message, a notice and a :class:`PolicyError`.
    """

    path: str
    reason: str
    remedy: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", safe_line(self.path))
        object.__setattr__(self, "reason", safe_text(self.reason))
        object.__setattr__(self, "remedy", safe_text(self.remedy))

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" + (f"; {self.remedy}" if self.remedy else "")


@dataclass(frozen=True)
class Baseline:
    """The crate as published: git blob ids of its files, its build scripts, its proc-macro manifests.

    Examples
    --------
    >>> Baseline().unchanged(Path("/ws"), "build.rs")
    False
    """

    #: path (relative, posix) -> git blob id, for every published file
    blobs: Mapping[str, str] = field(default_factory=dict)
    #: the build scripts the published manifests declare (relative paths)
    build_scripts: frozenset[str] = frozenset()
    #: the manifests (relative paths) that declared a proc-macro library as published
    proc_macros: frozenset[str] = frozenset()

    @classmethod
    def from_git(cls, git: Git, ref: str = PUBLISHED_REF) -> Baseline:
        """Read the baseline from ``ref`` (default: the fork's ``published`` tag, else the first commit)."""
        commit = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        if not commit:
            roots = git("rev-list", "--max-parents=0", "HEAD", check=False).split()
            if not roots:
                return cls()
            commit = roots[-1]
        blobs: dict[str, str] = {}
        for entry in git("ls-tree", "-r", "-z", "--full-tree", commit).split("\0"):
            meta, _, path = entry.partition("\t")
            parts = meta.split()
            if len(parts) == 3 and parts[1] == "blob":
                blobs[path] = parts[2]
        manifests: dict[str, dict[str, Any]] = {}
        for path in sorted(p for p in blobs if PurePosixPath(p).name == "Cargo.toml")[:_MAX_MANIFESTS]:
            try:
                manifests[path] = load_toml(git("cat-file", "blob", blobs[path]))
            except ValueError:
                continue
        scripts: set[str] = set()
        macros: set[str] = set()
        for path, doc in manifests.items():
            base = os.path.dirname(path)

            def published(rel: str, base: str = base) -> bool:
                return os.path.normpath(os.path.join(base, rel)) in blobs

            scripts.update(os.path.normpath(os.path.join(base, s)) for s in _declared_build_scripts(doc, published))
            if _is_proc_macro(doc):
                macros.add(path)
        return cls(blobs=blobs, build_scripts=frozenset(scripts), proc_macros=frozenset(macros))

    def unchanged(self, root: Path, relative: str) -> bool:
        """Whether ``root/relative`` is a regular file with the same content as published."""
        published = self.blobs.get(relative)
        if published is None:
            return False
        return _blob_id(root / relative, sha256=len(published) == 64) == published


def _blob_id(path: Path, *, sha256: bool) -> str | None:
    """git's object id of a regular file's content (never read through a symlink), or None."""
    try:
        data, more = read_regular(path, _MAX_HASHED)
    except OSError:
        return None
    if more:
        return None
    digest = hashlib.sha256() if sha256 else hashlib.sha1()
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


# -- manifests -----------------------------------------------------------------------


def _declared_build_scripts(doc: Mapping[str, Any], exists: Any) -> list[str]:
    """The build scripts a manifest declares, relative to its directory (``exists(rel)`` for build.rs)."""
    package = package_table(doc)
    build = package.get("build")
    if build is False:
        return []
    if isinstance(build, str):
        return [build]
    if isinstance(build, list):
        return [b for b in build if isinstance(b, str)]
    if build is True or (package.get("autobuild", True) is not False and exists("build.rs")):
        return ["build.rs"]
    return []


def _is_proc_macro(doc: Mapping[str, Any]) -> bool:
    """Whether a manifest's library is a proc macro, in any of the ways cargo accepts."""
    lib = doc.get("lib")
    if not isinstance(lib, Mapping):
        return False
    if lib.get("proc-macro") is True or lib.get("proc_macro") is True:
        return True
    kinds = [lib.get(key) for key in ("crate-type", "crate_type")]
    return any(isinstance(k, list) and any(str(t).replace("_", "-") == "proc-macro" for t in k) for k in kinds)


def _outside(root: Path, base: Path, value: str) -> str:
    """Why the manifest path ``value`` (relative to ``base``) is refused, or ""."""
    if not value.strip():
        return "is empty"
    if "\0" in value:
        return "contains a NUL byte"
    if value.startswith(("/", "\\", "~")) or (len(value) > 1 and value[1] == ":"):
        return "is absolute: give a path inside the crate"
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, value))
    if target != real_root and not target.startswith(real_root + os.sep):
        return "leaves the crate: paths must stay inside it"
    first = os.path.relpath(target, real_root).split(os.sep)[0]
    if not is_source(first):
        return f"points into {first}/, which is not source"
    return ""


def check_manifest(
    root: Path,
    manifest: Path,
    doc: Mapping[str, Any],
    *,
    allow_build_scripts: bool = False,
    baseline: Baseline | None = None,
) -> list[Violation]:
    """What the parsed manifest ``doc`` (to be, or now, at ``manifest``) does that the policy refuses.

    Checks the keys only (``[patch]``, ``[replace]``, ``git`` and outside
    ``path`` entries, new proc-macro libraries, ``package.build``); the files
    a manifest implies (``build.rs``) are :func:`check_tree`'s.

    Examples
    --------
    >>> doc = {"package": {"name": "x"}, "patch": {"crates-io": {}}}
    >>> [v.reason for v in check_manifest(Path("/ws"), Path("/ws/Cargo.toml"), doc)]
    ['[patch] replaces dependencies with other sources']
    """
    baseline = baseline or Baseline()
    root = Path(os.path.abspath(root))
    base = Path(os.path.abspath(manifest)).parent
    rel = os.path.relpath(os.path.abspath(manifest), root).replace(os.sep, "/")
    found: list[Violation] = []
    for table in ("patch", "replace"):
        if table in doc:
            found.append(
                Violation(
                    rel,
                    f"[{table}] replaces dependencies with other sources",
                    f"remove the [{table}] table; dependencies come from the registry",
                )
            )
    if _is_proc_macro(doc) and rel not in baseline.proc_macros:
        found.append(
            Violation(
                rel,
                "[lib] is a proc macro (proc-macro = true, or the proc-macro crate-type): "
                "a proc macro runs its code inside the compiler",
                "remove it; write ordinary functions instead",
            )
        )
    package = package_table(doc)
    if not allow_build_scripts:
        build = package.get("build")
        if build not in (None, False):
            declared = _declared_build_scripts(doc, lambda _rel: True)
            new = [
                s
                for s in declared
                if os.path.relpath(os.path.normpath(base / s), root).replace(os.sep, "/") not in baseline.build_scripts
            ]
            if new:
                found.append(
                    Violation(
                        rel,
                        f"package.build names a build script ({', '.join(map(str, new))}): build scripts run "
                        "arbitrary code at build time and are refused",
                        f"remove the build key, {_ALLOW_HINT}",
                    )
                )
    # a path outside the crate is refused even where build scripts are allowed
    for where, value in schema.paths(doc):
        why = _outside(root, base, value)
        if why:
            found.append(Violation(rel, f"{where}: {value!r} {why}", "use a path inside the crate"))
    for dependency in schema.dependencies(doc):
        for problem in schema.dependency_problems(dependency.spec):
            found.append(
                Violation(
                    rel,
                    f"{dependency.where}.{dependency.name}: {problem}",
                    "depend on a crate from the registry by version instead",
                )
            )
    for key in schema.unknown_keys(doc):
        found.append(
            Violation(
                rel,
                f"{key}: a key cargo does not define (flakebot refuses what it cannot check)",
                "remove it; put other tools' settings under [package.metadata]",
            )
        )
    return found


# -- the tree on disk --------------------------------------------------------------------


def check_tree(root: Path, *, allow_build_scripts: bool = False, baseline: Baseline | None = None) -> list[Violation]:
    """Everything in the workspace ``root``, as it is on disk, that the policy refuses.

    ``baseline`` is the crate as published (:meth:`Baseline.from_git`); without
    it nothing counts as published. ``.git/`` and ``target/`` at the root are
    not walked (flakebot's history and cargo's outputs).

    Examples
    --------
    >>> import tempfile
    >>> ws = Path(tempfile.mkdtemp())
    >>> _ = (ws / "Cargo.toml").write_text('[package]\\nname = "x"\\nversion = "0.1.0"\\n')
    >>> _ = (ws / "build.rs").write_text("fn main() {}\\n")
    >>> [str(v) for v in check_tree(ws)]  # doctest: +ELLIPSIS
    ['build.rs: a build script runs arbitrary code at build time...']
    >>> check_tree(ws, allow_build_scripts=True)
    []
    """
    baseline = baseline or Baseline()
    root = Path(os.path.abspath(root))
    found = _walk(root, baseline)
    found += _manifests(root, allow_build_scripts=allow_build_scripts, baseline=baseline)
    seen: set[tuple[str, str]] = set()
    unique: list[Violation] = []
    for violation in found:
        if (violation.path, violation.reason) not in seen:
            seen.add((violation.path, violation.reason))
            unique.append(violation)
    return unique


def _walk(root: Path, baseline: Baseline) -> list[Violation]:
    found: list[Violation] = []
    real_root = os.path.realpath(root)
    top = str(root)
    walk = Walk(top)  # an explicit stack, no deeper than MAX_DEPTH: a deep tree is a violation, never a crash
    for dirpath, dirnames, filenames in walk:
        at_root = dirpath == top
        prefix = "" if at_root else os.path.relpath(dirpath, top).replace(os.sep, "/") + "/"
        if at_root:
            for name in OUTPUT_DIRS:  # not source, not walked; but flakebot's own paths go through them
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
                    found.append(
                        Violation(
                            name,
                            f"{name} is not a directory (a symlink?): flakebot keeps build output there",
                            "remove it; flakebot makes it a directory again",
                        )
                    )
            dirnames[:] = source_dirs(dirnames)
        links = set()
        for name in [*dirnames, *filenames]:
            rel = prefix + name
            if os.path.islink(os.path.join(dirpath, name)):
                links.add(name)
                why = _symlink_problem(real_root, Path(dirpath, name), at_root=at_root)
                if why:
                    found.append(Violation(rel, why, "remove the symlink"))
                continue
            if name == ".cargo":
                found.append(
                    Violation(
                        rel,
                        f"a .cargo/ directory: {REFUSED_DIRS['.cargo']}",
                        "remove it; flakebot configures cargo itself",
                    )
                )
            elif name == ".git" and not at_root:
                found.append(
                    Violation(
                        rel,
                        "a git repository nested in the crate",
                        "remove it; the workspace has one history, flakebot's",
                    )
                )
            elif name in TOOLCHAIN_FILES and not baseline.unchanged(root, rel):
                found.append(Violation(rel, "a toolchain file: the compiler is not the crate's to choose", "remove it"))
            elif name in GIT_FILES:
                found.append(
                    Violation(
                        rel,
                        f"a {name} file: git reads it as configuration (it could hide changes from the review diff)",
                        "remove it; flakebot's git needs no attributes or submodules",
                    )
                )
        dirnames[:] = [d for d in dirnames if d not in (".cargo", ".git") and d not in links]
    for path in walk.too_deep:
        found.append(
            Violation(
                os.path.relpath(path, top).replace(os.sep, "/")[:200],
                f"a directory nested deeper than {MAX_DEPTH} levels: flakebot reads no deeper",
                "remove it",
            )
        )
    for path, why in walk.unreadable:
        found.append(
            Violation(
                os.path.relpath(path, top).replace(os.sep, "/")[:200] if path != top else ".",
                f"a directory flakebot cannot read ({why}): the policy checks every file",
                "make it readable, or remove it",
            )
        )
    return found


def _symlink_problem(real_root: str, path: Path, *, at_root: bool) -> str:
    try:
        target = os.path.realpath(path)
    except (OSError, RuntimeError):  # a loop
        return "a symlink that cannot be resolved (a loop)"
    if at_root and (path.name == "result" or path.name.startswith("result-")) and target.startswith("/nix/store/"):
        return ""  # nix build's own out-link
    if target != real_root and not target.startswith(real_root + os.sep):
        return f"a symlink pointing outside the crate (to {target})"
    first = os.path.relpath(target, real_root).split(os.sep)[0]
    if first == ".git":
        return "a symlink pointing into .git/"
    return ""


def _manifests(root: Path, *, allow_build_scripts: bool, baseline: Baseline) -> list[Violation]:
    """Check every manifest cargo reads from the root: workspace members and path dependencies."""
    found: list[Violation] = []
    queue = [root / "Cargo.toml"]
    seen: set[str] = set()
    while queue and len(seen) < _MAX_MANIFESTS:
        manifest = queue.pop(0)
        key = os.path.realpath(manifest)
        if key in seen:
            continue
        seen.add(key)
        rel = os.path.relpath(manifest, root).replace(os.sep, "/")
        if _outside(root, root, rel):
            continue  # reported where it was named
        doc, problem = _load_manifest(manifest)
        if problem:
            if manifest != root / "Cargo.toml" or os.path.lexists(manifest):
                found.append(Violation(rel, problem, "fix the manifest"))
            continue
        found += check_manifest(root, manifest, doc, allow_build_scripts=allow_build_scripts, baseline=baseline)
        base = manifest.parent
        for script in _declared_build_scripts(doc, lambda r, base=base: os.path.lexists(base / r)):
            path = Path(os.path.normpath(base / script))
            script_rel = os.path.relpath(path, root).replace(os.sep, "/")
            if _outside(root, root, script_rel) or allow_build_scripts:
                continue  # outside: check_manifest reported package.build
            if script_rel in baseline.build_scripts and baseline.unchanged(root, script_rel):
                continue
            changed = "changed since it was published" if script_rel in baseline.blobs else "new"
            found.append(
                Violation(
                    script_rel,
                    f"a build script runs arbitrary code at build time ({changed}, in {rel})",
                    f"remove it, {_ALLOW_HINT}",
                )
            )
        queue += [Path(os.path.normpath(base / d)) / "Cargo.toml" for d in _local_crates(root, base, doc)]
    return found


def _load_manifest(path: Path) -> tuple[dict[str, Any], str]:
    try:
        data, more = read_regular(path, _MAX_MANIFEST)
    except FileNotFoundError:
        return {}, "a manifest named by another one is missing"
    except UnsafePath:
        return {}, "the manifest is not a regular file (a symlink, a FIFO or a device)"
    except OSError as exc:
        return {}, f"the manifest cannot be read ({exc.strerror})"
    if more:
        return {}, f"the manifest passes {_MAX_MANIFEST // 1024} KiB"
    try:
        return load_toml(data.decode("utf-8")), ""
    except (ValueError, UnicodeDecodeError) as exc:
        return {}, f"the manifest is not valid TOML, so it cannot be checked: {str(exc)[:200]}"


def _local_crates(root: Path, base: Path, doc: Mapping[str, Any]) -> Iterable[str]:
    """Directories (relative to ``base``) of the crates a manifest pulls in: members and path dependencies."""
    workspace = doc.get("workspace")
    if isinstance(workspace, Mapping):
        members = workspace.get("members")
        for member in members if isinstance(members, list) else []:
            if not isinstance(member, str) or _outside(root, base, member.split("*")[0] or "."):
                continue
            if any(c in member for c in "*?["):
                for match in sorted(glob.glob(str(base / member)))[:_MAX_MANIFESTS]:
                    if os.path.isdir(match) and not os.path.islink(match):
                        yield os.path.relpath(match, base)
            else:
                yield member

    for dependency in schema.dependencies(doc):
        path = dependency.spec.get("path") if isinstance(dependency.spec, Mapping) else None
        if isinstance(path, str) and not _outside(root, base, path):
            yield path


@dataclass(frozen=True)
class TreePolicy:
    """The policy one workspace is held to: whether build scripts are allowed, and the crate as published.

    Examples
    --------
    >>> TreePolicy().check(Path("/nonexistent"))
    []
    """

    allow_build_scripts: bool = False
    baseline: Baseline = field(default_factory=Baseline)

    def check(self, root: Path) -> list[Violation]:
        """What :func:`check_tree` refuses in ``root``."""
        return check_tree(root, allow_build_scripts=self.allow_build_scripts, baseline=self.baseline)

    def enforce(self, root: Path) -> None:
        """:func:`enforce` for ``root``."""
        enforce(root, allow_build_scripts=self.allow_build_scripts, baseline=self.baseline)


def enforce(root: Path, *, allow_build_scripts: bool = False, baseline: Baseline | None = None) -> None:
    """Raise :class:`~flakebot_magic.errors.PolicyError` naming every violation in ``root``, if any."""
    violations = check_tree(root, allow_build_scripts=allow_build_scripts, baseline=baseline)
    if violations:
        listed = "\n".join(f"  - {v}" for v in violations[:20])
        more = f"\n  ... and {len(violations) - 20} more" if len(violations) > 20 else ""
        raise PolicyError(
            f"The workspace {root} holds what flakebot does not build (code written by a model or a test "
            f"may have put it there):\n{listed}{more}\nFix or remove these files in the workspace, "
            "then run again (the git history shows when each appeared).",
            violations=violations,
            workspace=root,
        )
