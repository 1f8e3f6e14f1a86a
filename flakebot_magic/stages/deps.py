"""The dependency cache: each dependency unit compiled once per cache, in a stub, confined, sealed, copied by hash.

docs/dependency-cache.md is the design and the argument; this module is its
build. For a release build or a test build of a workspace
(:meth:`DependencyCache.provide`, called by :func:`~flakebot_magic.stages.build.check`
before the crate's own cargo starts):

1. **Keys.** Each registry package of the workspace's ``Cargo.lock`` gets a key
   (:meth:`DependencyCache.key`): the toolchain (``rustc -vV``), the build's
   cargo arguments and environment, the registry's path, the mode, the package
   and the SHA-256 of every package's files in its build-time closure (the
   registry's own checksum claims are not trusted: Debian's say "Could not get
   crate checksum", and cargo itself never rereads a registry package's files).
   Cargo's own unit hash (features, profile, target, dependencies' hashes)
   decides among the units found under a key: a copied unit whose inputs
   differ in any of these is simply not one cargo asks for.
2. **Dependencies first, in a stub** (:func:`~flakebot_magic.sandbox.stub.stub_of`):
   ``cargo build --release`` or ``cargo test --no-run`` of a crate with the
   workspace's dependencies and none of its code, in a sandbox of its own
   under ``<cache>/units/stubs/``, with the units already sealed copied in
   first, so cargo compiles only what is missing.
3. **Writers confined** (mode ``confined``, when Landlock is there): the stub's
   rustc and build scripts run through :mod:`flakebot_magic.sandbox.unit_wrapper`,
   each able to write only its own unit's files; a unit's writers are then its
   own closure, named by its key. Without Landlock (mode ``per-build``) every
   package of the stub build that has a build script or is a proc macro could
   write every unit: each record names them (``writers``), and a build uses a
   unit only when all of them are among its own packages, with the same files.
4. **Sealed** (:meth:`~flakebot_magic.records.units.UnitStore.seal`) once the
   stub's cargo has exited and its processes are gone; **copied, never
   linked**, into the build's fresh target dir, each file checked by hash.

Anything that keeps the cache from serving (a path dependency, a registry
that is not a directory, a stub build that fails) is a line in the stage's log
and the build goes on as before: the cache never fails a build.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FlakebotError
from ..events import EventBus
from ..host.environment import allowed_env
from ..host.fsutil import atomic_write, load_json, read_regular
from ..host.trees import remove_tree
from ..records.units import UNIT_NAME, UnitRecord, UnitStore, naive
from ..registry.digests import PackageDigests
from ..sandbox import unit_wrapper
from ..sandbox.cargo import Cargo
from ..sandbox.command import SANDBOX_DIR, Sandbox
from ..sandbox.stub import LockPackage, Stub, lock_packages, stub_of

__all__ = [
    "CONFINED",
    "MODE_HOOK",
    "OFF",
    "PER_BUILD",
    "DependencyCache",
    "DepsBuild",
    "Plan",
    "Provided",
    "cache_mode",
    "dependency_cache",
    "filling",
    "wait_for_fills",
]

#: bump when a key's meaning changes
KEY_FORMAT = 1
CONFINED, PER_BUILD, OFF = "confined", "per-build", "off"
#: TEST HOOK: the environment variable that forces a mode (``per-build`` or ``off``)
MODE_HOOK = "FLAKEBOT_UNITS_MODE"
#: the interpreter the unit wrapper runs with, inside the sandbox (the system's: the venv is not shown there)
SANDBOX_PYTHON = "/usr/bin/python3"
#: environment a key leaves out: how rustc caches the crate's own code, never what a dependency is
_NOT_KEYED = frozenset({"CARGO_INCREMENTAL"})
#: the environment's paths of one build, never part of a key (each build has its own)
_ONE_BUILDS = frozenset({"HOME", "TMPDIR", "CARGO_HOME", "CARGO_TARGET_DIR"})
#: a build finding fewer of its packages' units sealed than this share compiles them itself, as without the
#: cache, and the stub builds and seals them once the tool is built (:meth:`DependencyCache.fill_later`): a
#: stub ahead of a build costs what the crate's own compile could overlap, so it runs ahead only when it saves
COLD_SHARE = 0.5
#: the stub builds started after builds that compiled their own dependencies, still running (see
#: :func:`wait_for_fills`): one thread per build that deferred, gone once it is over
_FILLS: list[threading.Thread] = []
_FILLS_LOCK = threading.Lock()


def wait_for_fills(timeout: float | None = None) -> bool:
    """Wait for the stub builds started after earlier builds (at most ``timeout`` seconds each); whether none is
    left running. A front door that exits waits for them anyway (they are not daemon threads)."""
    with _FILLS_LOCK:
        threads = list(_FILLS)
    for thread in threads:
        thread.join(timeout)
    with _FILLS_LOCK:
        _FILLS[:] = [t for t in _FILLS if t.is_alive()]
        return not _FILLS


def filling() -> bool:
    """Is a stub build started after a build still sealing units?"""
    with _FILLS_LOCK:
        return any(t.is_alive() for t in _FILLS)


def cache_mode() -> str:
    """The mode builds use: ``confined`` where Landlock and the sandbox's Python are, else ``per-build``.

    ``FLAKEBOT_UNITS_MODE`` (:data:`MODE_HOOK`, a TEST HOOK) forces ``per-build`` or ``off``.
    """
    asked = os.environ.get(MODE_HOOK, "")
    if asked in (OFF, PER_BUILD):
        return asked
    available = os.access(SANDBOX_PYTHON, os.X_OK) and unit_wrapper.landlock_abi() >= 1
    return CONFINED if available else PER_BUILD


def dependency_cache(units: Path, cargo: Cargo, bus: EventBus) -> DependencyCache | None:
    """The dependency cache for builds with ``cargo`` (sandboxed), or None where it cannot serve soundly: off,
    a registry that is not a directory on this machine, or no sandbox (its writers could reach the store)."""
    mode = cache_mode()
    registry = getattr(cargo.registry, "path", None)
    sandbox = cargo.sandbox
    if mode == OFF or registry is None or not cargo.registry.offline or sandbox is None or not sandbox.isolated:
        return None
    environment = {k: v for k, v in allowed_env(cargo.env()).items() if k not in _ONE_BUILDS}
    store = UnitStore(units)
    return DependencyCache(
        store, registry=Path(registry), toolchain=cargo.rustc_version(), mode=mode, bus=bus, environment=environment
    )


@dataclass(frozen=True)
class DepsBuild:
    """One of the crate's two builds, as the stub repeats it: its name, cargo's profile dir, arguments, environment."""

    name: str
    profile_dir: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What the cache knows of one workspace: its stub, its lock's packages, their files' digests, the writers."""

    stub: Stub
    packages: dict[str, LockPackage]
    #: package id -> SHA-256 of its files in the registry ("" when not found there)
    digests: dict[str, str]
    #: ``name version digest`` of every package of the lock
    present: frozenset[str]
    #: the same for the packages whose code runs at build time (a build script, a proc macro)
    writers: frozenset[str]

    def closure(self, package: str) -> set[str]:
        seen: set[str] = set()
        todo = [package]
        while todo:
            current = todo.pop()
            if current in seen or current not in self.packages:
                continue
            seen.add(current)
            todo.extend(self.packages[current].dependencies)
        return seen


@dataclass
class Provided:
    """What :meth:`DependencyCache.provide` did for one build."""

    build: str
    #: units copied into the build's target dir, and how many of them the stub compiled just now
    copied: int = 0
    compiled: int = 0
    stub_ran: bool = False
    seconds: float = 0.0
    #: why the cache did not serve ("" when it did)
    why_not: str = ""


class _Unavailable(Exception):
    """Why the cache cannot serve this build (it goes on without it)."""


class DependencyCache:
    """The cache of one cache dir's units for builds against one directory registry with one toolchain."""

    def __init__(
        self,
        store: UnitStore,
        *,
        registry: Path,
        toolchain: str,
        mode: str,
        bus: EventBus,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.registry = Path(registry).resolve()
        self.toolchain = toolchain
        self.mode = mode
        self.bus = bus
        #: what every cargo of a build sees of the environment (a build script may read any of it: the locale,
        #: the time zone, SOURCE_DATE_EPOCH, the toolchain's PATH), less the paths of one build
        self.environment = dict(environment or {})

    # -- keys ----------------------------------------------------------------------------------------------

    def plan(self, workspace: Path) -> Plan | str:
        """The plan for ``workspace`` (after the tree policy passed it), or why the cache cannot serve it."""
        stub = stub_of(workspace)
        if isinstance(stub, str):
            return stub
        try:
            packages = lock_packages(stub.lock)
        except ValueError as exc:
            return str(exc)
        sources = PackageDigests(self.store.root / "sources.json", self.registry)
        digests = {pid: sources.digest(p) for pid, p in packages.items()}
        sources.save()
        present = frozenset(f"{pid} {d}" for pid, d in digests.items() if d)
        writers = frozenset(
            f"{pid} {digests[pid]}" for pid, p in packages.items() if digests[pid] and sources.writes(p)
        )
        return Plan(stub, packages, digests, present, writers)

    def _base(self, build: DepsBuild) -> str:
        env = sorted((k, v) for k, v in {**self.environment, **build.env}.items() if k not in _NOT_KEYED)
        parts = [
            KEY_FORMAT,
            self.mode,
            self.toolchain,
            str(self.registry),
            build.name,
            build.profile_dir,
            list(build.args),
            env,
        ]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    def key(self, plan: Plan, build: DepsBuild, package: str) -> str | None:
        """The key of ``package``'s units in ``build``; None when a package of its closure is not in the registry."""
        closure = sorted(plan.closure(package))
        if not closure or any(not plan.digests.get(p) for p in closure):
            return None
        lines = [self._base(build), package, *(f"{p} {plan.digests[p]}" for p in closure)]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    def set_key(self, plan: Plan, build: DepsBuild) -> str:
        lines = [self._base(build), plan.stub.digest, *sorted(f"{p} {d}" for p, d in plan.digests.items())]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    def usable(self, plan: Plan, record: UnitRecord) -> bool:
        """May this build use ``record``? Confined units, yes; otherwise only when every package whose code could
        write it when it was built is among this build's, with the same files (the per-build rule)."""
        if record.writers is None or naive():
            return True
        return set(record.writers) <= plan.present

    # -- serving -------------------------------------------------------------------------------------------

    def cold(self, plan: Plan, build: DepsBuild) -> bool:
        """Are fewer than :data:`COLD_SHARE` of the lock's packages sealed for ``build`` (and its set was never
        built)? Then the build compiles them itself and :meth:`fill_later` seals them after."""
        try:
            if self.store.set_units(self.set_key(plan, build)) is not None:
                return False
            keys = [self.key(plan, build, package) for package in plan.packages]
            sealed = sum(
                1 for key in keys if key is not None and any(self.usable(plan, r) for r in self.store.find(key))
            )
        except OSError:
            return True
        return sealed < COLD_SHARE * len(keys)

    def fill_later(self, plan: Plan, builds: list[DepsBuild], cargo: Cargo, *, timeout: float) -> None:
        """The stub builds of ``builds``, each sealing its units, on a thread of their own at the lowest priority,
        started now (when the build that compiled its own dependencies is done): the next tools find them."""

        def fill() -> None:
            for build in builds:
                set_key = self.set_key(plan, build)
                try:
                    with _locked(self.store.stubs / f"{set_key[:32]}.lock"):
                        if self.store.set_units(set_key) is None:
                            done = Provided(build.name)
                            self._stub_build(
                                plan, build, set_key, cargo, timeout=timeout, on_line=None, nice=19, done=done
                            )
                except (_Unavailable, OSError, FlakebotError):
                    continue  # the next build of these dependencies compiles them, and tries again

        thread = threading.Thread(target=fill, name="flakebot-deps-fill")
        with _FILLS_LOCK:
            _FILLS.append(thread)
        thread.start()

    def provide(
        self,
        plan: Plan,
        build: DepsBuild,
        root: Path,
        target: str,
        cargo: Cargo,
        *,
        timeout: float,
        on_line: Callable[[str, str], None] | None = None,
        nice: int = 0,
    ) -> Provided:
        """Copy the units of ``build`` into the target dir ``root/target`` (compiling the missing ones in the stub
        first). ``root`` is flakebot's own directory (a workspace, a release target dir); nothing below it is
        followed if it is a link (:meth:`~flakebot_magic.records.units.UnitStore.copy_out`)."""
        started = time.monotonic()
        done = Provided(build.name)
        profile_dir = (root, f"{target}/{build.profile_dir}".strip("/"))
        try:
            set_key = self.set_key(plan, build)
            if not self._from_set(plan, set_key, profile_dir, done):
                # one stub build of a set at a time: a build of the same dependencies beside waits, then copies
                with _locked(self.store.stubs / f"{set_key[:32]}.lock"):
                    if not self._from_set(plan, set_key, profile_dir, done):
                        units = self._stub_build(
                            plan, build, set_key, cargo, timeout=timeout, on_line=on_line, nice=nice, done=done
                        )
                        self._copy_all(plan, units, profile_dir, done)
        except _Unavailable as exc:
            done.why_not = str(exc)
        except OSError as exc:
            done.why_not = f"the unit store could not be used ({exc.strerror or exc})"
        done.seconds = time.monotonic() - started
        return done

    def _from_set(self, plan: Plan, set_key: str, profile_dir: tuple[Path, str], done: Provided) -> bool:
        """The units the same dependencies used before, copied; False when any is gone or unusable."""
        units = self.store.set_units(set_key)
        if units is None:
            return False
        try:
            self._copy_all(plan, units, profile_dir, done)
        except _Unavailable:
            return False
        return True

    def _copy_all(
        self, plan: Plan, units: list[tuple[str, str]], profile_dir: tuple[Path, str], done: Provided
    ) -> None:
        records = [self.store.get(key, unit) for key, unit in units]
        if any(r is None or not self.usable(plan, r) for r in records):
            raise _Unavailable("a unit of the set is gone")
        for record in records:
            assert record is not None
            if not self.store.copy_out(record, *profile_dir):
                raise _Unavailable(f"the sealed unit {record.unit} differs from what was sealed (set aside)")
        done.copied = len(records)

    def _stub_build(
        self,
        plan: Plan,
        build: DepsBuild,
        set_key: str,
        cargo: Cargo,
        *,
        timeout: float,
        on_line: Callable[[str, str], None] | None,
        nice: int,
        done: Provided,
    ) -> list[tuple[str, str]]:
        """Build the stub with every usable sealed unit copied in, seal what it compiled; the set's units. The
        stub's directory (and its sandbox's) is scratch: gone once this is over, whatever happened."""
        with _scratch(self.store.stubs / set_key[:32]) as stub_dir:
            stub_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            target = stub_dir / "target"
            remove_tree(target, ignore_errors=True)
            target.mkdir(mode=0o700)
            for relative, data in plan.stub.files.items():
                path = stub_dir / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, data, mode=0o644, root=stub_dir)
            keys = {pid: self.key(plan, build, pid) for pid in plan.packages}
            sealed: dict[str, tuple[str, str]] = {}
            for key in {k for k in keys.values() if k is not None}:
                for record in self.store.find(key):
                    if self.usable(plan, record) and self.store.copy_out(record, target, build.profile_dir):
                        sealed[record.unit] = (key, record.unit)
            read_only, env = self._confinement()
            stub_cargo = cargo.confined_to(Sandbox(stub_dir, read_only=read_only))
            env |= {**build.env, "CARGO_TARGET_DIR": str(target)}
            done.stub_ran = True
            # what the stub's cargo said, kept beside it (a fill after a build has no run log): `clean` removes it
            with open(stub_dir.with_suffix(".log"), "a", encoding="utf-8", errors="replace") as kept:

                def said(stream: str, line: str) -> None:
                    if not line.startswith("{"):
                        kept.write(line + "\n")
                    if on_line is not None:
                        on_line(stream, line)

                ran = stub_cargo.run(*build.args, cwd=stub_dir, timeout=timeout, on_line=said, env=env, nice=nice)
            if ran.returncode != 0:
                tail = "; ".join(line for line in ran.stderr.strip().splitlines()[-3:])
                raise _Unavailable(f"the stub build of the dependencies failed ({tail[:300]})")
            # cargo has exited and the sandbox's processes are gone: what the stub built can be sealed
            units = _built_units(ran.stdout, target / build.profile_dir, plan)
            writers = None if self.mode == CONFINED or naive() else sorted(plan.writers)
            used: list[tuple[str, str]] = []
            for unit, (package, fresh) in units.items():
                unit_key = keys.get(package)
                if unit_key is None:
                    continue
                if fresh and unit in sealed:
                    used.append(sealed[unit])
                    continue
                if self.store.seal(target / build.profile_dir, unit, package, unit_key, writers) is not None:
                    used.append((unit_key, unit))
                    done.compiled += not fresh
            if len(used) == len(units):
                self.store.remember_set(set_key, used)
            remove_tree(target, ignore_errors=True)
            return used

    def _confinement(self) -> tuple[list[Path], dict[str, str]]:
        """What the stub's sandbox shows read-only, and its environment: the unit wrapper when confined."""
        if self.mode != CONFINED or naive():
            return [], {}
        script = Path(unit_wrapper.__file__).resolve()
        launcher = self.store.root / "bin" / "rustc-wrapper"
        text = f"#!/bin/sh\nexec {SANDBOX_PYTHON} -I -S '{script}' \"$@\"\n"
        try:
            current, _ = read_regular(launcher, len(text) + 1)
        except OSError:
            current = b""
        if current != text.encode():
            atomic_write(launcher, text, mode=0o755, make_parents=True)
        return [script, launcher], {"RUSTC_WRAPPER": str(launcher), "FLAKEBOT_UNIT_CONFINE": "1"}


def _built_units(stdout: str, profile_dir: Path, plan: Plan) -> dict[str, tuple[str, bool]]:
    """The units of registry packages cargo's JSON names (unit -> (package id, fresh)), each one whose files are
    in ``profile_dir``."""
    units: dict[str, tuple[str, bool]] = {}
    fingerprints = {name.rsplit("-", 1)[1]: name for name in _listdir(profile_dir / ".fingerprint")}
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            message = load_json(line)
            package = _package_of(str(message["package_id"]))
        except (ValueError, KeyError, TypeError):
            continue
        if package not in plan.packages:
            continue
        paths = [*message.get("filenames", []), message.get("out_dir") or ""] if isinstance(message, dict) else []
        for path in paths:
            unit = _unit_of(str(path), profile_dir, fingerprints)
            if unit is not None and unit.startswith(plan.packages[package].name + "-"):
                # a build script's run says nothing of freshness: it is fresh when its unit was (copied in)
                said = message.get("fresh", message.get("reason") == "build-script-executed")
                fresh = bool(said) and units.get(unit, ("", True))[1]
                units[unit] = (package, fresh)
    return units


def _package_of(package_id: str) -> str:
    """``name version`` of a registry package's id (``registry+https://...#name@1.2.3``); "" for others."""
    if not package_id.startswith("registry+") or "#" not in package_id:
        return ""
    name, _, version = package_id.rsplit("#", 1)[1].partition("@")
    return f"{name} {version}"


def _unit_of(path: str, profile_dir: Path, fingerprints: Mapping[str, str]) -> str | None:
    """The unit a file cargo names belongs to: ``build/UNIT/...``, or ``deps/NAME-HASH.ext`` by its hash."""
    try:
        parts = Path(path).relative_to(profile_dir).parts
    except ValueError:
        return None
    if len(parts) >= 2 and parts[0] == "build" and UNIT_NAME.fullmatch(parts[1]):
        return parts[1]
    if len(parts) == 2 and parts[0] == "deps":
        stem = parts[1].split(".", 1)[0]
        return fingerprints.get(stem.rsplit("-", 1)[-1])
    return None


def _listdir(path: Path) -> list[str]:
    try:
        return [name for name in os.listdir(path) if UNIT_NAME.fullmatch(name)]
    except OSError:
        return []


@contextmanager
def _scratch(stub_dir: Path) -> Iterator[Path]:
    """``stub_dir`` for the ``with`` block, then gone with its sandbox's directory, whatever happened."""
    try:
        yield stub_dir
    finally:
        remove_tree(stub_dir, ignore_errors=True)
        remove_tree(stub_dir.parent / SANDBOX_DIR / stub_dir.name, ignore_errors=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (made if missing) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
