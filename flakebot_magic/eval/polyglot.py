"""The adapter for aider's polyglot Rust exercises: a checkout the user has becomes a suite of tasks.

``flakebot eval --polyglot PATH/rust`` reads ``PATH/rust/exercises/practice/*``
(or the ``practice`` directory itself, or one exercise). For each exercise:

* the request is its instructions (``.docs/introduction.md``,
  ``instructions.md``, ``instructions.append.md``), then a paragraph saying
  that hidden tests will call the public items ``src/lib.rs`` declares;
* the starting crate is its ``Cargo.toml`` and ``src/``, staged under
  ``OUT/polyglot/`` with the tool contract added (``kind = "cli"`` and a
  placeholder binary ``src/bin/<name>.rs``: flakebot deploys tools, and an
  exercise is a library) and nothing else: not ``tests/``, ``.meta/`` (which
  holds the reference solution) nor ``.docs/``;
* the hidden check is its test files (``.meta/config.json``'s ``files.test``,
  by default ``tests/*.rs``), run after the session on a copy of the final
  workspace with ``cargo test --test STEM -- --include-ignored``, as aider
  runs them, with the exercise's whole ``tests/`` tree beside them (what they
  need: macros' ``tests/invalid/`` crate of compile-fail cases) and the
  features its ``Cargo.toml`` turns on by default;
* the reference solution (``--reference``) is its ``.meta/example.rs`` as
  ``src/lib.rs``, with the dependencies of ``.meta/Cargo-example.toml``.

Nothing of an exercise is copied into this repository; the exercises stay
where the user keeps them. :class:`ExerciseRegistry` serves the staged crates
to the pipeline's fork stage and leaves everything else (dependencies, the
search) to the registry it wraps.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import tomlkit

from ..errors import RegistryError, SearchError, UsageError
from ..host.fsutil import UnsafePath, atomic_write, edit_toml, is_real_dir, load_json, load_toml, read_inside, real_dir
from ..host.literals import rust_string
from ..host.names import tool_name
from ..host.trees import copy_tree, remove_tree
from ..registry.base import CrateCandidate, FetchedSource, Registry, check_crate_field
from ..registry.directory import tree_sha256
from ..request import UntrustedText
from .task import HiddenCheck, Reference, Suite, Task, TaskProblem, read_manifest, regular_files

__all__ = ["ExerciseRegistry", "exercise_dirs", "polyglot_suite"]

_DOCS = (".docs/introduction.md", ".docs/instructions.md", ".docs/instructions.append.md")
#: the most a text file of an exercise may hold, and its src/ together
_MAX_TEXT = 4 * 1024 * 1024
_MAX_SRC = 64 * 1024 * 1024
#: what a reference's Cargo-example.toml adds to the exercise's manifest (its [package] is the exercise's own)
_REFERENCE_TABLES = ("dependencies", "dev-dependencies", "build-dependencies", "features", "target")
_ADVICE = (
    "This crate is a programming exercise: implement it in Rust as the instructions above say. Tests you cannot "
    "see will call the public items that src/lib.rs declares, so keep their names and signatures (and make them "
    "work for every case the instructions describe). Use only the dependencies Cargo.toml already lists. The "
    "crate meets the tool contract already, with a placeholder binary {bin}: keep it."
)


def exercise_dirs(path: Path) -> list[Path]:
    """The exercise directories under ``path``: ``rust/``, ``rust/exercises/practice/`` or one exercise."""
    path = Path(path).expanduser()
    for candidate in (path / "exercises" / "practice", path / "practice", path):
        if _is_exercise(candidate):
            return [candidate]
        if candidate.is_dir():
            found = sorted(child for child in candidate.iterdir() if _is_exercise(child))
            if found:
                return found
    return []


def _is_exercise(path: Path) -> bool:
    # by its names only: a link at the exercise, its manifest or its instructions makes it a problem that says so
    # when it is read (never followed), not a directory passed over in silence
    return (
        path.is_dir() and os.path.lexists(path / "Cargo.toml") and os.path.lexists(path / ".docs" / "instructions.md")
    )


def _regular(path: Path) -> bool:
    """A regular file itself (no symlink at it or at its directory under the exercise)."""
    return is_real_dir(path.parent) and stat.S_ISREG(_lstat_mode(path))


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _text(exercise: Path, relative: str) -> str:
    """A file of the checkout, read without following a symlink anywhere under the exercise, capped."""
    try:
        data, more = read_inside(exercise, relative, _MAX_TEXT)
    except (UnsafePath, FileNotFoundError) as exc:
        raise _Bad(
            f"{relative} is a symlink or not a regular file: an exercise is read, never followed ({exc})"
        ) from None
    except OSError as exc:
        raise _Bad(f"{relative} cannot be read: {exc.strerror or exc}") from None
    if more:
        raise _Bad(f"{relative} is larger than {_MAX_TEXT // (1024 * 1024)} MiB")
    return data.decode("utf-8", errors="replace")


def polyglot_suite(path: str | Path, staging: Path) -> Suite:
    """The exercises under ``path`` as tasks, their starting crates staged under ``staging``."""
    root = Path(os.path.abspath(Path(path).expanduser()))  # "rust/.." has no name to stage an exercise under
    if not root.is_dir():
        raise UsageError(f"--polyglot {root}: not a directory. Give your checkout's rust/ directory.")
    exercises = exercise_dirs(root)
    if not exercises:
        raise UsageError(
            f"--polyglot {root}: no exercise found (an exercise is a directory with Cargo.toml and "
            ".docs/instructions.md, under rust/exercises/practice/ in aider's polyglot-benchmark checkout)."
        )
    tasks: list[Task] = []
    problems: list[TaskProblem] = []
    for exercise in exercises:
        try:
            tasks.append(_task(exercise, staging / "crates" / exercise.name))
        except _Bad as exc:
            problems.append(TaskProblem(exercise.name, exercise, str(exc)))
    return Suite(root, tuple(tasks), tuple(problems))


class _Bad(Exception):
    """An exercise that cannot become a task; the message says why."""


def _task(exercise: Path, staged: Path) -> Task:
    if not is_real_dir(exercise):
        raise _Bad("the exercise is a symlink: a checkout is read, never followed")
    try:
        manifest = load_toml(_text(exercise, "Cargo.toml"))
    except ValueError as exc:
        raise _Bad(f"Cargo.toml cannot be read: {exc}") from None
    package = manifest.get("package")
    if not isinstance(package, dict) or not isinstance(package.get("name"), str):
        raise _Bad("Cargo.toml has no [package] name")
    try:  # it names the staged crate's binary (a path) and its workspace: a crate's name, or nothing
        crate = check_crate_field("name", package["name"])
    except RegistryError:
        raise _Bad(
            f"Cargo.toml's [package] name {package['name'][:80]!r} is not a crate name (1 to 64 ASCII letters, "
            "digits, '-' or '_'); a checkout's name never becomes a path or code unchecked"
        ) from None
    config = _config(exercise)
    tests_dir = exercise / "tests"
    found = sorted(p for p in tests_dir.glob("*.rs") if _regular(p)) if is_real_dir(tests_dir) else []
    tests = _files(exercise, config.get("test"), default=found)
    if not tests:
        raise _Bad("it has no test files (.meta/config.json files.test, or tests/*.rs)")
    hidden = _hidden(exercise, tests, manifest)
    reference = _reference(exercise, config)
    instructions = "\n\n".join(_text(exercise, doc).strip() for doc in _DOCS if os.path.lexists(exercise / doc))
    binary = _stage(exercise, staged, crate)
    # a checkout's prose, untrusted: its ">>>" lines are words, never acceptance examples (and are shown so)
    request = UntrustedText((instructions.replace(">>>", "> >>") + "\n\n" + _ADVICE.format(bin=binary)).strip())
    return Task(
        id=exercise.name,
        path=exercise,
        name=tool_name(crate),
        request=request,
        hidden=hidden,
        crate=crate,
        source=staged,
        origin="polyglot",
        reference=reference,
    )


def _hidden(exercise: Path, tests: list[Path], manifest: dict[str, Any]) -> HiddenCheck:
    """The named test files, run with every file of ``tests/`` beside them and the default features turned on."""
    root = exercise.resolve()
    try:
        named = [path.resolve().relative_to(root).as_posix() for path in tests]
        staged = regular_files(exercise, "tests") if is_real_dir(exercise / "tests") else []
    except ValueError as exc:
        raise _Bad(str(exc)) from None
    features = manifest.get("features")
    default = features.get("default") if isinstance(features, dict) else None
    return HiddenCheck(
        "cargo",
        tuple(root / name for name in named),
        root=root,
        staged=tuple(sorted(set(staged) | set(named))),
        features=tuple(str(f) for f in default) if isinstance(default, list) else (),
    )


def _reference(exercise: Path, config: dict[str, Any]) -> Reference | None:
    """``.meta/example.rs`` (config's ``files.example``) as ``src/lib.rs``, and ``Cargo-example.toml``'s dependencies."""
    examples = config.get("example")
    example = str(examples[0]) if isinstance(examples, list) and examples else ".meta/example.rs"
    if not (exercise / example).is_file() or (exercise / example).is_symlink():
        return None
    solutions = config.get("solution")
    target = next((str(s) for s in solutions if str(s).endswith(".rs")), None) if isinstance(solutions, list) else None
    additions: dict[str, Any] = {}
    if os.path.lexists(exercise / ".meta" / "Cargo-example.toml"):
        try:
            cargo = read_manifest(exercise, ".meta/Cargo-example.toml")
        except ValueError as exc:
            raise _Bad(str(exc)) from None
        additions = {key: cargo[key] for key in _REFERENCE_TABLES if key in cargo}
    return Reference(exercise, ((target or "src/lib.rs", example),), additions)


def _config(exercise: Path) -> dict[str, Any]:
    if not os.path.lexists(exercise / ".meta" / "config.json"):
        return {}
    try:
        data = load_json(_text(exercise, ".meta/config.json"))
    except ValueError as exc:
        raise _Bad(f".meta/config.json is not valid JSON: {exc}") from None
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def _files(exercise: Path, listed: Any, *, default: list[Path]) -> list[Path]:
    """The files ``listed`` (relative to the exercise, each inside it and regular), or ``default``."""
    if not isinstance(listed, list) or not listed:
        return default
    found = []
    for entry in listed:
        path = (exercise / str(entry)).resolve()
        if not path.is_relative_to(exercise.resolve()) or (exercise / str(entry)).is_symlink():
            raise _Bad(f".meta/config.json names {entry!r}, which is not a file inside the exercise")
        if not _regular(exercise / str(entry)):
            raise _Bad(f".meta/config.json names {entry!r}, which is missing (or not a regular file)")
        found.append(path)
    return found


def _stage(exercise: Path, staged: Path, crate: str) -> str:
    """Copy the exercise's Cargo.toml and src/ to ``staged``, with the tool contract; return the binary's path."""
    remove_tree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    if os.path.lexists(exercise / "src"):
        try:  # the checkout's files as bytes; a symlink anywhere is refused, never followed (nor copied)
            copied = copy_tree(exercise / "src", staged / "src", links=False, max_bytes=_MAX_SRC, max_files=5000)
        except OSError as exc:
            raise _Bad(f"src/ cannot be copied: {exc}") from None
        if copied.left_out:
            what, why = next(iter(copied.left_out.items()))
            raise _Bad(f"src/{what} is {why}: an exercise's files are read, never followed")
    manifest = _with_contract(_text(exercise, "Cargo.toml"), crate)
    has_main = (staged / "src" / "main.rs").is_file()
    binary = "src/main.rs" if has_main else f"src/bin/{crate}.rs"  # crate: check_crate_field's, no "/" or ".."
    if not has_main:
        usage = f"Usage: {crate}\n\nThe exercise {crate} is a library (src/lib.rs); this command only meets flakebot's tool contract."
        real_dir(staged, staged / "src" / "bin")
        atomic_write(
            staged / binary,
            "//! A placeholder: flakebot deploys tools, and this exercise is a library (src/lib.rs).\n\n"
            f"fn main() {{\n    println!({rust_string(usage)});\n}}\n",
            mode=0o644,
            root=staged,
        )
    atomic_write(staged / "Cargo.toml", manifest, mode=0o644, root=staged)
    return binary


def _with_contract(text: str, crate: str) -> str:
    """The exercise's manifest with ``[package.metadata.flakebot]`` saying ``kind = "cli"``, ``bin = crate``.

    A manifest ``tomllib`` reads may still be one ``tomlkit`` refuses, or hold ``[package]`` as an inline table
    or ``metadata = 1`` (red team 33: a traceback that ended the whole eval): each is a problem of this
    exercise that says why. What is written is read back as cargo would read it.
    """
    try:
        document = edit_toml(text)
        package = document.get("package")
        if not isinstance(package, tomlkit.items.Table):
            raise ValueError("[package] must be a table of its own (a [package] header, not an inline table)")
        if "metadata" not in package:
            package["metadata"] = tomlkit.table()
        if not isinstance(package["metadata"], tomlkit.items.Table):
            raise ValueError("[package] metadata must be a table ([package.metadata])")
        contract = tomlkit.table()
        contract.add("kind", "cli")
        contract.add("bin", crate)
        package["metadata"]["flakebot"] = contract
        written = tomlkit.dumps(document)
        meta = load_toml(written).get("package", {}).get("metadata", {})
        if not isinstance(meta, dict) or meta.get("flakebot") != {"kind": "cli", "bin": crate}:
            raise ValueError("the tool contract does not read back from it")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a shape tomlkit will not take
        raise _Bad(f"Cargo.toml cannot be given the tool contract: {exc}") from None
    return written


class ExerciseRegistry:
    """A registry that serves staged exercise crates by name, and everything else from ``base``.

    The pipeline forks an exercise from here like any crate; cargo resolves
    the exercise's dependencies from ``base`` (its configuration, its path in
    the sandbox), and the search is ``base``'s.
    """

    def __init__(self, base: Registry, tasks: tuple[Task, ...]) -> None:
        self.base = base
        self.id = base.id
        self.offline = base.offline
        self._crates: dict[str, tuple[Path, CrateCandidate]] = {}
        for task in tasks:
            if task.source is None or task.crate is None:
                continue
            manifest = load_toml(task.source / "Cargo.toml")
            package = manifest.get("package", {})
            version = str(package.get("version") or "0.1.0")
            candidate = CrateCandidate(
                name=task.crate,
                version=version,
                description=f"aider polyglot exercise {task.id}",
                registry=f"polyglot:{task.path}",
                checksum=None,
            )
            self._crates[task.crate] = (task.source, candidate)

    @property
    def path(self) -> Any:
        """The wrapped registry's directory (what cargo resolves from, shown read-only in the sandbox)."""
        return getattr(self.base, "path", None)

    def search(self, query: str, limit: int = 10) -> list[CrateCandidate]:
        return self.base.search(query, limit)

    def get(self, name: str, version: str | None = None) -> CrateCandidate:
        if name in self._crates:
            return self._crates[name][1]
        return self.base.get(name, version)

    def source_dir(self, candidate: CrateCandidate) -> Path:
        if candidate.name in self._crates:
            return self._crates[candidate.name][0]
        source_dir = getattr(self.base, "source_dir", None)
        if source_dir is None:
            raise SearchError(f"{candidate.id} has no source directory in {self.base.id}.")
        found: Path = source_dir(candidate)
        return found

    def fetch(self, candidate: CrateCandidate, dest: Path) -> FetchedSource:
        if candidate.name not in self._crates:
            return self.base.fetch(candidate, dest)
        source = self._crates[candidate.name][0]
        copy_tree(source, dest)  # staged by _stage: plain files only
        return FetchedSource(
            path=dest,
            checksum=tree_sha256(dest),
            checksum_kind="tree-sha256",
            notes=("an aider polyglot exercise, staged with the tool contract; its checksum is its tree's",),
        )

    def cargo_config(self) -> str:
        return self.base.cargo_config()

    def signature(self) -> str:
        signature = getattr(self.base, "signature", None)
        return str(signature()) if signature is not None else ""

    def can_satisfy(self, name: str, requirement: str) -> bool:
        can_satisfy = getattr(self.base, "can_satisfy", None)
        return bool(can_satisfy(name, requirement)) if can_satisfy is not None else True

    def versions(self, name: str) -> list[str]:
        if name in self._crates:
            return [self._crates[name][1].version]
        versions = getattr(self.base, "versions", None)
        return list(versions(name)) if versions is not None else []

    def recorded_checksum(self, name: str, version: str) -> str | None:
        recorded = getattr(self.base, "recorded_checksum", None)
        return recorded(name, version) if recorded is not None and name not in self._crates else None
