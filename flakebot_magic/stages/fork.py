"""The ``fork`` stage: the crate's published source becomes a git workspace, made buildable offline.

The published source is imported as data (:mod:`flakebot_magic.stages.source`):
a crate's ``.git``, ``.cargo/``, ``rust-toolchain*``, ``.gitattributes`` and
``.gitmodules`` never enter the workspace, and the first commit holds exactly
the files on disk. The lock file is settled by cargo in the sandbox's fetch
profile, after the tree policy has passed the imported tree.

History of a workspace::

    published   "Published source of NAME VERSION" (checksum, files not imported)
    └── flakebot
          "Drop dev-dependencies the registry cannot satisfy"   (when needed)
          "Regenerate Cargo.lock ..." / "Add Cargo.lock ..."    (when needed)
          "Add flake.nix"                                       (flake stage)

Every offline fix-up is its own commit with a message that says why, and
test targets that lost their dev-dependencies are reported as skipped, one
target at a time: auto-discovery stays on, so a test the model adds under
``tests/`` is built and counted.

Where it forks is :mod:`flakebot_magic.stages.workspace`'s; how a build that
replaces a tool's workspace puts the new one in place is
:mod:`flakebot_magic.manage.transaction`'s. A reused workspace first loses the lock
files a killed git left in it (:func:`~flakebot_magic.host.git.remove_stale_locks`).
Each step is followed by a crash point (``fork.*``) where a test kills the
process.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import tomlkit

from ..errors import ForkError
from ..events import EventBus
from ..host.crashpoints import crash_point
from ..host.fsutil import atomic_write, load_toml
from ..host.git import Git, remove_stale_locks
from ..host.process import ProcessRunner
from ..host.trees import remove_tree
from ..registry.base import CrateCandidate, FetchedSource, Registry, ResolvesLocally
from ..sandbox.cargo import Cargo
from ..sandbox.policy import Baseline, TreePolicy
from .source import Imported, import_source
from .workspace import (
    FORK_FORMAT,
    NEXT_DIR,
    OLD_DIR,
    DroppedDependency,
    Workspace,
    copy_beside,
    next_owner,
    next_path,
)

__all__ = [
    "FORK_FORMAT",
    "NEXT_DIR",
    "OLD_DIR",
    "SKIP_FEATURE",
    "DroppedDependency",
    "Workspace",
    "fork",
    "next_owner",
]


def fork(
    candidate: CrateCandidate,
    registry: Registry,
    workspaces_dir: Path,
    name: str,
    *,
    runner: ProcessRunner,
    bus: EventBus,
    cargo: Cargo,
    fresh: bool = False,
    copy: bool = False,
    timeout: float = 600.0,
) -> Workspace:
    """Fork ``candidate`` for the tool ``name`` (reusing ``workspaces_dir/name`` when it is the same crate).

    When ``workspaces_dir/name`` exists and is not reused as it is (``fresh``,
    another crate, or ``copy``: a ``--continue`` edits a copy of it), the
    returned workspace is under ``.next/`` and :attr:`Workspace.replaces`
    names the one it replaces once the build's transaction puts it in place.
    """
    path = workspaces_dir / name
    replaces: Path | None = None
    if path.exists() or path.is_symlink():
        existing = Workspace.load(path)
        if (
            not fresh
            and existing is not None
            and existing.crate.id == candidate.id
            and existing.crate.registry == candidate.registry
        ):
            for lock in remove_stale_locks(path):
                bus.notice("fork", f"removed {lock}, left by a git that was killed", "warning")
            crash_point("fork.unlocked")
            if copy:
                existing = copy_beside(existing, next_path(workspaces_dir, name))
                crash_point("fork.copied")
                bus.notice(
                    "fork",
                    f"working on a copy of {path} at {existing.path}; {path} stays as it is until the build succeeds",
                )
            else:
                bus.notice("fork", f"reusing the workspace {path}")
            git = Git(existing.path, runner)
            # edits made by hand (say, a fix after a failed build) become history, so the
            # deployed tool's commit really contains what was built
            if git.is_dirty() and git.commit(
                "Local edits in the workspace\n\nCommitted by flakebot before building them.", all_files=True
            ):
                bus.notice("fork", "committed local edits found in the workspace", "warning")
            crash_point("fork.local_edits")
            return existing
        replaces, path = path, next_path(workspaces_dir, name)
        bus.notice("fork", f"forking into {path}; {replaces} stays as it is until the build succeeds")
    path.mkdir(parents=True)
    crash_point("fork.made")
    fetched, imported = _import(candidate, registry, path)
    crash_point("fork.fetched")
    for note in fetched.notes:
        bus.notice("fork", note)
    git = Git(path, runner)
    git.init("published")
    crash_point("fork.init")
    if not imported.files:
        raise ForkError(f"The published source of {candidate.id} is empty.", workspace=path)
    message = (
        f"Published source of {candidate.name} {candidate.version}\n\n"
        f"Registry: {candidate.registry}\n"
        f"Checksum ({fetched.checksum_kind}): {fetched.checksum}\n"
    )
    if imported.dropped:
        message += f"\nNot imported (flakebot never takes these from a crate):\n{imported.describe()}\n"
        bus.notice(
            "fork",
            f"not imported from {candidate.id}: "
            + "; ".join(f"{p} ({why})" for p, why in sorted(imported.dropped.items())),
            "warning",
        )
    published = git.commit_files(message, imported.files)
    crash_point("fork.published")
    git("tag", "published")
    crash_point("fork.tagged")
    git("checkout", "-q", "-b", "flakebot")
    crash_point("fork.branched")
    workspace = Workspace(
        path=path,
        crate=candidate,
        checksum=fetched.checksum,
        checksum_kind=fetched.checksum_kind,
        published_commit=published,
        replaces=replaces,
    )
    if registry.offline and isinstance(registry, ResolvesLocally):
        _make_satisfiable(workspace, registry, git, bus)
    crash_point("fork.satisfiable")
    # what the registry published is the baseline: its own build script or proc macro passes, nothing else
    _settle_lockfile(workspace, registry, git, bus, cargo, timeout, TreePolicy(baseline=Baseline.from_git(git)))
    crash_point("fork.locked")
    workspace.save()
    crash_point("fork.saved")
    return workspace


def _import(candidate: CrateCandidate, registry: Registry, path: Path) -> tuple[FetchedSource, Imported]:
    """Unpack ``candidate`` beside ``path`` and import it into ``path`` as data (the unpacked copy goes)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.published-", dir=path.parent))
    try:
        fetched = registry.fetch(candidate, staging)
        return fetched, import_source(staging, path)
    finally:
        remove_tree(staging, ignore_errors=True)


# -- dependencies the registry cannot satisfy -------------------------------

_NON_LINUX = re.compile(
    r"windows|macos|ios|android|wasm|redox|fuchsia|hermit|solaris|illumos|freebsd|netbsd|openbsd|dragonfly|haiku|wasi|emscripten"
)


def _requirement(spec: Any) -> tuple[str, str, bool]:
    """(crate name override, version requirement, optional) of one dependency entry."""
    if isinstance(spec, str):
        return "", spec, False
    if hasattr(spec, "get"):
        return str(spec.get("package", "")), str(spec.get("version", "*")), bool(spec.get("optional", False))
    return "", "*", False


def _make_satisfiable(workspace: Workspace, registry: ResolvesLocally, git: Git, bus: EventBus) -> None:
    manifest_path = workspace.path / "Cargo.toml"
    doc = tomlkit.parse(manifest_path.read_text(encoding="utf-8"))
    can_satisfy = registry.can_satisfy
    dropped: list[DroppedDependency] = []
    missing_required: list[str] = []

    def sweep(table: Any, kind: str, cfg: str = "") -> None:
        if table is None:
            return
        for key in list(table.keys()):
            package, requirement, optional = _requirement(table[key])
            crate = package or key
            if can_satisfy(crate, requirement):
                continue
            if kind == "dev":
                dropped.append(DroppedDependency(key, crate, requirement, "dev"))
            elif optional:
                dropped.append(DroppedDependency(key, crate, requirement, "optional"))
            elif cfg and _NON_LINUX.search(cfg) and "linux" not in cfg and "unix" not in cfg:
                dropped.append(DroppedDependency(key, crate, requirement, "target"))
            else:
                missing_required.append(f"{crate} {requirement}")
                continue
            del table[key]

    for section in ("dev-dependencies", "dev_dependencies"):
        sweep(doc.get(section), "dev")
    for section in ("dependencies", "build-dependencies"):
        sweep(doc.get(section), "normal")
    for cfg, target in (doc.get("target") or {}).items():
        for section in ("dev-dependencies", "dev_dependencies"):
            sweep(target.get(section), "dev", cfg)
        for section in ("dependencies", "build-dependencies"):
            sweep(target.get(section), "normal", cfg)

    if missing_required:
        raise ForkError(
            f"{workspace.crate.id} needs {', '.join(missing_required)}, which the registry "
            f"{registry.id} cannot satisfy. Install those crates (Debian: librust-<name>-dev) "
            "or pick another crate with --crate.",
            workspace=workspace.path,
        )
    if not dropped:
        return

    gone = {d.key for d in dropped if d.kind != "dev"}
    if gone:
        _strip_features(doc, gone)
    dev_idents = {d.key.replace("-", "_") for d in dropped if d.kind == "dev"}
    skipped = _skip_targets(workspace.path, doc, dev_idents)
    workspace.dropped = dropped
    workspace.skipped_targets = skipped
    atomic_write(manifest_path, tomlkit.dumps(doc), mode=0o644, root=workspace.path)

    lines = [f"- {d} ({d.kind}-dependency)" for d in dropped]
    message = "Drop dependencies the registry cannot satisfy\n\n" + "\n".join(lines)
    if skipped:
        message += "\n\nSkipped test targets (they need a dropped dev-dependency):\n" + "\n".join(
            f"- {t}" for t in skipped
        )
    git.commit(message, ["Cargo.toml"])
    bus.notice(
        "fork",
        f"dropped {len(dropped)} dependencies the offline registry lacks: {', '.join(map(str, dropped))}",
        "warning",
    )
    if skipped:
        bus.notice("fork", f"skipped test targets that need them: {', '.join(skipped)}", "warning")


def _strip_features(doc: Any, gone: set[str]) -> None:
    """Remove feature entries that enable a dropped optional dependency."""
    features = doc.get("features")
    if not features:
        return
    for feature in list(features.keys()):
        items = features[feature]
        kept = [item for item in items if re.split(r"[/?]", str(item).removeprefix("dep:"))[0] not in gone]
        if len(kept) != len(items):
            array = tomlkit.array()
            array.extend(kept)
            features[feature] = array


_MOD = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)


def _module_files(root: Path) -> list[Path]:
    """A target's root file and the module files it declares, recursively."""
    seen: list[Path] = []
    stack = [root]
    while stack:
        current = stack.pop()
        if current in seen or not current.is_file():
            continue
        seen.append(current)
        text = current.read_text(encoding="utf-8", errors="replace")
        base = (
            current.parent
            if current.name in ("mod.rs", "main.rs", "lib.rs") or current == root
            else current.parent / current.stem
        )
        for name in _MOD.findall(text):
            stack += [base / f"{name}.rs", base / name / "mod.rs"]
    return seen


def _uses(files: list[Path], idents: set[str]) -> set[str]:
    pattern = re.compile(
        r"\b("
        + "|".join(map(re.escape, sorted(idents)))
        + r")\s*::|extern\s+crate\s+("
        + "|".join(map(re.escape, sorted(idents)))
        + r")\b|\buse\s+("
        + "|".join(map(re.escape, sorted(idents)))
        + r")\b"
    )
    found: set[str] = set()
    for path in files:
        for match in pattern.finditer(path.read_text(encoding="utf-8", errors="replace")):
            found.update(g for g in match.groups() if g)
    return found


def _auto_targets(root: Path, directory: str) -> list[tuple[str, str]]:
    """Targets cargo discovers by itself in ``tests/``, ``examples/`` or ``benches/``."""
    base = root / directory
    found: list[tuple[str, str]] = []
    if not base.is_dir():
        return found
    for entry in sorted(base.iterdir()):
        if entry.suffix == ".rs" and entry.is_file():
            found.append((entry.stem, f"{directory}/{entry.name}"))
        elif (entry / "main.rs").is_file():
            found.append((entry.name, f"{directory}/{entry.name}/main.rs"))
    return found


#: the feature an example or bench that needs a dropped dev-dependency requires: off by default, so
#: cargo skips just that target (``cargo test`` builds examples, ``clippy --all-targets`` benches)
SKIP_FEATURE = "flakebot-needs-dropped-dev-dependencies"


def _target_path(table: Any, directory: str) -> str:
    return str(table.get("path", f"{directory}/{table['name']}.rs"))


def _skip_targets(root: Path, doc: Any, idents: set[str]) -> list[str]:
    """Switch off, one target at a time, what needs a dropped crate; auto-discovery stays on.

    A test target gets an explicit ``[[test]]`` entry with ``test = false``
    (cargo neither builds nor runs it), an example or bench one that requires
    :data:`SKIP_FEATURE`; every other target, and every test file added
    later under ``tests/``, is still discovered, built and run.
    """
    if not idents:
        return []
    package = doc["package"]
    skipped: list[str] = []
    needs_feature = False
    for kind, directory, auto_key in (
        ("test", "tests", "autotests"),
        ("example", "examples", "autoexamples"),
        ("bench", "benches", "autobenches"),
    ):
        tables = list(doc.get(kind) or [])
        explicit_paths = {_target_path(t, directory) for t in tables}
        auto = (
            []
            if package.get(auto_key) is False
            else [(name, rel) for name, rel in _auto_targets(root, directory) if rel not in explicit_paths]
        )
        targets = [(str(t["name"]), _target_path(t, directory), t) for t in tables]
        targets += [(name, rel, None) for name, rel in auto]
        for name, rel, table in targets:
            needs = _uses(_module_files(root / rel), idents)
            if not needs:
                continue
            skipped.append(f"{kind} {name} (needs {', '.join(sorted(needs))})")
            if table is None:
                table = tomlkit.table()
                table["name"] = name
                table["path"] = rel
                if kind not in doc:
                    doc[kind] = tomlkit.aot()
                doc[kind].append(table)
            if kind == "test":
                table["test"] = False
            else:
                required = [str(f) for f in table.get("required-features", [])]
                if SKIP_FEATURE not in required:
                    array = tomlkit.array()
                    array.extend([*required, SKIP_FEATURE])
                    table["required-features"] = array
                needs_feature = True
    if needs_feature:
        if "features" not in doc:
            doc["features"] = tomlkit.table()
        if SKIP_FEATURE not in doc["features"]:
            doc["features"][SKIP_FEATURE] = tomlkit.array()
    skipped += _skip_unit_tests(root, doc, idents)
    return skipped


def _skip_unit_tests(root: Path, doc: Any, idents: set[str]) -> list[str]:
    """``test = false`` on the lib or a bin whose own ``#[cfg(test)]`` code needs a dropped crate."""
    skipped: list[str] = []
    package = doc["package"]
    lib = doc.get("lib")
    lib_root = root / str((lib or {}).get("path", "src/lib.rs"))
    if lib_root.is_file():
        needs = _uses(_module_files(lib_root), idents)
        if needs:
            if lib is None:
                lib = doc["lib"] = tomlkit.table()
            lib["test"] = False
            lib["doctest"] = False
            skipped.append(f"lib unit and doc tests (need {', '.join(sorted(needs))})")
    bins = list(doc.get("bin") or [])
    declared = {str(b.get("path", "")) for b in bins} | {str(b.get("name", "")) for b in bins}
    auto: list[tuple[str, str]] = []
    if package.get("autobins") is not False:
        if (root / "src/main.rs").is_file():
            auto.append((str(package.get("name", "")), "src/main.rs"))
        auto += _auto_targets(root / "src", "bin")
        auto = [(n, r if r.startswith("src/") else f"src/{r}") for n, r in auto]
    targets = [(str(b.get("name", "")), str(b.get("path", f"src/bin/{b.get('name', '')}.rs")), b) for b in bins]
    targets += [(n, r, None) for n, r in auto if n not in declared and r not in declared]
    for name, rel, table in targets:
        needs = _uses(_module_files(root / rel), idents)
        if not needs:
            continue
        if table is None:
            table = tomlkit.table()
            table["name"] = name
            table["path"] = rel
            if "bin" not in doc:
                doc["bin"] = tomlkit.aot()
            doc["bin"].append(table)
        table["test"] = False
        skipped.append(f"bin {name} unit tests (need {', '.join(sorted(needs))})")
    return skipped


# -- Cargo.lock -------------------------------------------------------------


def _read_lock(path: Path) -> dict[str, Any]:
    return load_toml(path.read_text(encoding="utf-8"))


def _settle_lockfile(
    workspace: Workspace,
    registry: Registry,
    git: Git,
    bus: EventBus,
    cargo: Cargo,
    timeout: float,
    policy: TreePolicy,
) -> None:
    lock = workspace.path / "Cargo.lock"

    def log(stream: str, line: str) -> None:
        bus.log("fork", line, "stderr" if stream == "stderr" else "stdout")

    def run(subcommand: str, *args: str) -> None:
        # in the sandbox's fetch profile, once the policy has passed the tree (Cargo.resolve)
        done = cargo.resolve(subcommand, *args, cwd=workspace.path, policy=policy, timeout=timeout, on_line=log)
        if done.returncode != 0:
            raise ForkError(
                f"`cargo {subcommand}` could not resolve the dependencies of {workspace.crate.id} "
                f"from {registry.id}:\n{done.stderr.strip()[-2000:]}",
                workspace=workspace.path,
            )

    if lock.exists():
        versions = getattr(registry, "versions", None)
        missing: list[str] = []
        if registry.offline and versions is not None:
            recorded = getattr(registry, "recorded_checksum", None)
            for package in _read_lock(lock).get("package", []):
                if not str(package.get("source", "")).startswith("registry+"):
                    continue
                if package["version"] not in versions(package["name"]):
                    missing.append(f"{package['name']} {package['version']}")
                elif (
                    recorded is not None
                    and "checksum" in package
                    and package["checksum"] != recorded(package["name"], package["version"])
                ):
                    # cargo refuses a lock whose checksums differ from the source's
                    missing.append(f"{package['name']} {package['version']} (checksum differs)")
        if missing:
            lock.unlink()
            run("generate-lockfile")
            workspace.lock_action = "regenerated"
            shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
            git.commit(
                "Regenerate Cargo.lock from the registry\n\n"
                f"The upstream lock pins versions the registry {registry.id} lacks:\n{shown}",
                ["Cargo.lock"],
            )
            bus.notice("fork", f"regenerated Cargo.lock: upstream pinned {shown}, which the registry lacks", "warning")
            return
        # the lock may only need trimming (dropped dev-dependencies); cargo does it minimally
        run("metadata", "--format-version", "1", "--no-deps")
        if git.commit("Update Cargo.lock after dropping dependencies", ["Cargo.lock"]):
            workspace.lock_action = "updated"
        return
    run("generate-lockfile")
    workspace.lock_action = "generated"
    git.commit(
        f"Add Cargo.lock resolved from {registry.id}\n\n"
        "Published crates ship no lock file; Nix's cargoLock and reproducible builds need one.",
        ["Cargo.lock"],
    )
    bus.notice("fork", f"generated Cargo.lock from {registry.id}")
