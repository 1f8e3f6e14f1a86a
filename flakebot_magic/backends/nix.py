"""The nix backend, and how ``auto`` is decided: once, before the search, from cached probes.

::

    flake (write, nix flake lock, commit) ──► build (nix build) ┐ ──► deploy (GC root, record)
                                               test  (cargo test)┘

``nix build`` builds the proven commit's files, exported from git's objects
(:mod:`~flakebot_magic.stages.proven`), as a ``path:`` flake: never the work
tree (a git flake of the work tree takes uncommitted edits of tracked files).

``auto`` is nix when all three hold, else cargo (:func:`decide`):

1. ``nix`` is on PATH;
2. nix builds in its sandbox (:func:`~flakebot_magic.backends.nix_command.nix_sandbox`,
   asked once per process);
3. nix can lock the flake's nixpkgs input here (:func:`nixpkgs_lockable`): a
   ``path:`` reference must be a directory with a flake.nix; a remote one
   (``github:``, ``https:``, a registry name) needs its host to answer a TCP
   connection within half a second, or else nix must hold a copy (``nix flake
   metadata --offline``, one second at most). The answer is kept per
   reference in ``<cache>/probes/nixpkgs.json`` for :data:`PROBE_TTL` seconds.

So an offline machine decides for cargo in well under a second, instead of
spending seconds on a ``nix flake lock`` that cannot succeed. Should the lock
fail anyway under ``auto`` (the probe said yes), the flake row ends
``skipped``, a warning says why, and the run builds with cargo: a handled
fallback is a notice, never a failed stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qs, urlsplit

from ..commands import typed
from ..config import Settings
from ..errors import ConfigError, DeployError, FlakebotError, FlakeError, StageTimeout
from ..host.cache import CacheLayout
from ..host.fsutil import atomic_write, load_json
from ..host.process import ProcessRunner, scrubbed_env
from ..records.provenance import describe_locked
from ..sandbox.cargo import Cargo
from ..stages.build import LINT_CAP
from ..stages.deploy import StorePath, lookup, store_key
from ..stages.flake import FLAKE_FORMAT, LOCK_FILE, check_lock_sources, write_flake
from ..stages.state import BackendChoice, RunState, Stage
from .base import (
    Backend,
    Built,
    cached_rows,
    flake_meta,
    line_logger,
    manifest,
    nixpkgs_url,
)
from .nix_cache import prove, push_tool
from .nix_command import (
    NIX_FEATURES,
    Nix,
    NixOptions,
    NixRelease,
    find_nix,
    pending_link,
    record_nix,
    remove_link,
    resolve_backend,
    root_points_to,
)

__all__ = ["NIX_FLAGS", "PROBE_TTL", "Lockable", "NixBackend", "decide", "nixpkgs_lockable"]

#: what the nix build runs (the flake caps lints for rustc and rustdoc); part of the store hash
NIX_FLAGS = ("nix", "build", "packages.default", *LINT_CAP)
#: seconds a probe's answer is kept (a machine that comes online is noticed this soon)
PROBE_TTL = 600.0
#: the TCP probe's time limit, and nix's for a look in its cache
CONNECT_TIMEOUT = 0.5
NIX_LOOK_TIMEOUT = 1.0
#: the advice every fallback notice ends with
FALLBACK_ADVICE = "Point --nixpkgs at a local nixpkgs, or choose with --backend cargo|nix."

_LOCAL_SCHEMES = ("path", "file", "git+file", "tarball+file")
_FORGES = {"github": "api.github.com", "gitlab": "gitlab.com", "sourcehut": "git.sr.ht"}
#: where nix looks up a flake registry name such as ``nixpkgs``
_REGISTRY_HOST = "channels.nixos.org"


@dataclass(frozen=True)
class Lockable:
    """Can nix lock a flake input here? ``why`` says what was found."""

    ok: bool
    why: str


def nixpkgs_lockable(
    ref: str,
    *,
    cache: CacheLayout,
    runner: ProcessRunner | None = None,
    nix: str | None = None,
    now: Callable[[], float] = time.time,
) -> Lockable:
    """Can ``nix flake lock`` fetch the flake reference ``ref`` from here? Asked at most once per :data:`PROBE_TTL`.

    Decided without nix for local references and reachable hosts; an
    unreachable host leaves nix to say (in at most :data:`NIX_LOOK_TIMEOUT`
    seconds) whether it holds a copy. ``nix``: the nix executable (default:
    on PATH).
    """
    path = cache.probes / "nixpkgs.json"
    try:
        known = load_json(path.read_text())
        entry = known[ref]
        if now() - float(entry["at"]) < PROBE_TTL:
            return Lockable(bool(entry["ok"]), str(entry["why"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    answer = _probe(ref, runner or ProcessRunner(), nix if nix is not None else find_nix())
    remember(cache, ref, answer, now=now)
    return answer


def _kept_lock(cache: CacheLayout, ref: str) -> Path:
    """Where flakebot keeps the flake.lock it made for the nixpkgs reference ``ref`` (see
    :meth:`~flakebot_magic.backends.nix_command.Nix.lock`): in its private cache, never in a workspace."""
    return cache.probes / f"nixpkgs-{hashlib.sha256(ref.encode()).hexdigest()[:32]}.lock"


def remember(cache: CacheLayout, ref: str, answer: Lockable, *, now: Callable[[], float] = time.time) -> None:
    """Keep ``answer`` for ``ref`` (a lock that failed after all replaces a probe's yes)."""
    path = cache.probes / "nixpkgs.json"
    try:
        known = load_json(path.read_text())
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    known[ref] = {"ok": answer.ok, "why": answer.why, "at": now()}
    try:
        atomic_write(path, json.dumps(known, indent=1, sort_keys=True), make_parents=True)
    except OSError:
        pass  # a cache that cannot be written only means asking again


def _probe(ref: str, runner: ProcessRunner, nix: str | None) -> Lockable:
    scheme, _, rest = ref.partition(":")
    if not rest:  # a registry name ("nixpkgs"): the global registry is fetched, then what it names
        scheme, rest = "flake", ref
    if scheme in _LOCAL_SCHEMES:
        location = Path(urlsplit(rest).path if rest.startswith("//") else rest.partition("?")[0])
        if scheme == "path" and not (location / "flake.nix").is_file():
            return Lockable(False, f"{location} holds no flake.nix")
        if not location.exists():
            return Lockable(False, f"{location} does not exist")
        return Lockable(True, f"{location} is on this machine")
    host = _host(scheme, rest)
    if host is None:
        return Lockable(True, f"nix will try {scheme}: references itself")
    proxy = _proxy()
    target, port = (proxy.hostname or "", proxy.port or 443) if proxy is not None else (host, 443)
    failed = _connect(target, port)
    if not failed:
        return Lockable(True, f"{target} answers")
    if nix and _nix_has_copy(nix, ref, runner):
        return Lockable(True, f"{target} cannot be reached, but nix holds a copy")
    return Lockable(False, f"{target} cannot be reached ({failed}) and nix holds no copy of it")


def _host(scheme: str, rest: str) -> str | None:
    """The host nix fetches a reference from; None for schemes it is not worth guessing about."""
    if scheme in _FORGES:
        query = parse_qs(rest.partition("?")[2])
        return query.get("host", [_FORGES[scheme]])[0]
    if scheme == "flake":
        return _REGISTRY_HOST
    if scheme in ("http", "https", "git+http", "git+https", "git+ssh", "tarball+http", "tarball+https"):
        return urlsplit(rest).hostname or None
    return None


def _proxy() -> SplitResult | None:
    for name in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        value = os.environ.get(name)
        if value:
            parsed = urlsplit(value if "://" in value else f"http://{value}")
            if parsed.hostname:
                return parsed
    return None


def _connect(host: str, port: int) -> str:
    """Nothing ("") when a TCP connection to ``host:port`` opens within :data:`CONNECT_TIMEOUT`, else why not.

    On a thread, since name resolution has no time limit of its own.
    """
    outcome: list[str] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT):
                outcome.append("")
        except Exception as exc:  # no network, no name, refused, or a test's guard: all "cannot reach"
            outcome.append(str(exc) or type(exc).__name__)

    thread = threading.Thread(target=attempt, name="flakebot-nixpkgs-probe", daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT + 0.25)
    return outcome[0] if outcome else f"no answer within {CONNECT_TIMEOUT:g}s"


def _nix_has_copy(nix: str, ref: str, runner: ProcessRunner) -> bool:
    try:
        done = runner.run(
            [nix, *NIX_FEATURES, "flake", "metadata", "--offline", "--json", ref],
            cwd=Path("/"),
            env=scrubbed_env(),
            timeout=NIX_LOOK_TIMEOUT,
        )
    except (StageTimeout, ConfigError):
        return False
    return done.returncode == 0


def decide(settings: Settings, runner: ProcessRunner | None = None) -> BackendChoice:
    """The backend a run builds with: ``settings.backend``, with ``auto`` decided here, once.

    ``nix`` and ``cargo`` are taken as asked (``nix`` without nix, or with its
    sandbox off, is a :class:`ConfigError`); ``auto`` is nix only when nix is
    installed, builds in its sandbox and can lock the flake's nixpkgs here.
    """
    name, why = resolve_backend(settings.backend)
    auto = why.startswith("auto")
    if name != "nix" or not auto:
        return BackendChoice(name, why, auto)
    url = nixpkgs_url(settings)
    lockable = nixpkgs_lockable(url, cache=settings.cache, runner=runner)
    if lockable.ok:
        return BackendChoice("nix", f"{why}; nixpkgs {url}: {lockable.why}", auto)
    reason = f"nix cannot lock the flake's nixpkgs input {url} here: {lockable.why}"
    return BackendChoice("cargo", f"auto: {reason}", auto, fallback=reason)


class NixBackend(Backend):
    """Builds with ``nix build``; the tool is the /nix/store path, rooted at ``<cache>/gcroots/NAME``."""

    name = "nix"
    falls_back_to = "cargo"

    def describe(self) -> str:
        return f"nix: nix build in nix's sandbox with nixpkgs {nixpkgs_url(self.settings)}, cargo test beside it"

    def nix(self) -> Nix:
        settings = self.settings
        options = NixOptions.of(settings)
        return Nix(self.deps.runner, options=options)

    def recipe_parts(self) -> list[str]:
        return ["backend=nix", nixpkgs_url(self.settings), str(FLAKE_FORMAT)]

    def alive(self, store: StorePath, name: str) -> bool:
        """Is the recorded /nix/store path still there? Roots it under ``name`` if so.

        No process runs when the tool's GC root already points at it.
        """
        recorded = store.manifest.get("nix_store_path")
        if not recorded:
            return False
        path, root = Path(recorded), self.settings.cache.gcroots / name
        if root_points_to(root, path):
            return True
        return self.nix().add_root(path, root)

    def build(self, run: RunState, cargo: Cargo) -> Built | None:
        """Flake first (nix builds it), then ``nix build`` beside ``cargo test``."""
        settings, bus = self.settings, self.bus
        if settings.nix_store:  # the tool would be looked for under /nix/store, not under that store's root
            raise ConfigError(f"--store {settings.nix_store} is for {typed('pull')}; builds use nix's own store.")
        workspace = run.forked()
        crate = workspace.crate
        nix = self.nix()
        git = self.git(run)
        url = nixpkgs_url(settings)
        unlockable: FlakeError | None = None
        with Stage(bus, "flake") as stage:
            check_lock_sources(workspace.path)  # nix reads the lock on this machine, outside its sandbox
            written = write_flake(workspace.path, flake_meta(workspace, run.main_program), url)
            present = [f for f in written if (workspace.path / f).exists()]
            git("add", "-f", "--", *present)  # a git flake shows nix only tracked files
            try:
                lock = nix.lock(
                    workspace.path,
                    _kept_lock(settings.cache, url),
                    timeout=settings.build_timeout,
                    on_line=line_logger(bus, "flake"),
                )
            except FlakeError as exc:
                if not self.choice.auto:
                    raise
                unlockable = exc
                stage.status, stage.detail = "skipped", "nix could not lock nixpkgs; cargo builds instead"
            else:
                committed = git.commit(
                    "Add flake.nix and flake.lock\n\n"
                    "`nix build` builds packages.default, this crate's binaries; flake.lock pins nixpkgs:\n"
                    f"{describe_locked(lock.nixpkgs)}",
                    [*written, LOCK_FILE],
                )
                stage.detail = f"{'committed' if committed else 'unchanged'}, nixpkgs {describe_locked(lock.nixpkgs)}"
        if unlockable is not None:
            first = (str(unlockable).strip().splitlines() or [""])[0][:200]
            remember(settings.cache, url, Lockable(False, f"nix flake lock failed: {first}"))
            bus.notice(
                "deploy",
                f"auto: nix could not lock the flake's nixpkgs input ({first}); "
                f"falling back to the cargo backend. {FALLBACK_ADVICE}",
                "warning",
            )
            return None
        key = store_key(git, run.rustc, NIX_FLAGS, backend="nix")
        built = Built(
            key=key,
            flags=list(NIX_FLAGS),
            lock={
                "lock_hash": lock.hash,
                "nixpkgs": lock.nixpkgs,
                "nixpkgs_url": url,
            },
        )
        cached = None if run.flags.rebuild else lookup(settings.cache.store, key, crate.name, crate.version)
        if cached is not None and self.alive(cached, run.name):
            built.cached = cached
            cached_rows(bus, ("build", "test"), cached)
            return built
        pending = pending_link(settings.cache.pending_gcroots, run.name)
        release = NixRelease(
            nix, workspace.path, pending, timeout=settings.build_timeout, on_line=line_logger(bus, "build")
        )
        try:
            result = self.check(run, cargo, git, release=release)
        except BaseException:
            remove_link(pending)  # the tool's own root (or none) is all a run leaves
            raise
        built.binaries, built.tests, built.proof = dict(result.build.binaries), result.tests, result.proof
        built.out_path, built.pending, built.source = release.store_path, pending, result.source
        return built

    def _push(self, data: dict[str, Any]) -> None:
        """--push: the tool and its proof to the team's cache; a push that fails leaves the tool, and says so."""
        settings = self.settings
        try:
            if not settings.push_to or not settings.nix_secret_key:
                raise ConfigError("--push needs --push-to CACHE_URL and --secret-key FILE (or their settings).")
            pushed = push_tool(self.nix(), data, settings.push_to, Path(settings.nix_secret_key))
        except FlakebotError as exc:
            self.bus.notice("deploy", f"built, but not pushed: {exc}", "warning")
            return
        recipe = " with its derivation" if pushed.derivation else ""
        self.bus.notice("deploy", f"pushed to {settings.push_to}{recipe}, signed by {', '.join(pushed.signed_by)}")

    def deploy(self, run: RunState, built: Built, contract: dict[str, Any]) -> StorePath:
        settings = self.settings
        crate = run.crate()
        try:
            with Stage(self.bus, "deploy") as stage:
                if built.cached is not None:
                    store = built.cached
                    stage.status = "cached"
                else:
                    if built.out_path is None:
                        raise DeployError("nix build recorded no store path to deploy.")
                    nix = self.nix()
                    root = settings.cache.gcroots / run.name
                    if not nix.add_root(built.out_path, root):
                        raise DeployError(f"Could not make {root} a GC root for {built.out_path}.")
                    proven = prove(nix, run, built, contract, self.git(run), settings.cache.gcroots)
                    data = manifest(
                        run,
                        self.name,
                        built,
                        commit=self.git(run).head(),
                        contract=contract,
                        gcroot=str(root),
                        **built.lock,
                        **proven,
                    )
                    store = record_nix(settings.cache.store, built.key, crate.name, crate.version, built.out_path, data)
                    if settings.push_after_build:
                        self._push(store.manifest)
                stage.detail = str(store.manifest["nix_store_path"])
        finally:
            if built.pending is not None:
                remove_link(built.pending)
        return store
