"""nix's command line (:class:`Nix`): ``nix build`` of the workspace flake (its /nix/store path is the tool), its sandbox.

The flow, driven by :mod:`flakebot_magic.pipeline`::

    write flake.nix ─► nix flake lock ─► commit both ─► nix build ─► GC root
                                                        (cargo test alongside)

* :func:`resolve_backend` turns ``auto`` into ``nix`` (``nix`` on PATH and
  its sandbox on) or ``cargo``.
* :func:`nix_sandbox` (:mod:`.nix_sandbox`) asks nix whether builds run in
  its sandbox, as unprivileged build users when nix runs as root. Crate
  code (build scripts, tests) and the model's code run in a nix build, so
  with the sandbox off the nix backend refuses to build (a
  :class:`ConfigError` saying how to turn it on) and ``auto`` picks cargo,
  which builds in bubblewrap.
* :class:`Nix` runs every nix command through the process runner, with the
  user's ``builders``, ``substituters`` and ``trusted-public-keys`` as
  ``--option`` arguments (so a team builds on remote builders and shares a
  binary cache), and maps failures to :class:`FlakeError`: an evaluation
  error names the workspace's flake file and line, a failed build carries the
  tail of the build log.
* The built path is kept alive by a GC root ``<cache>/gcroots/<tool name>``
  (an indirect root: ``nix-collect-garbage`` keeps what it points to while the
  symlink exists). ``nix build`` writes its out-link to
  ``gcroots/.pending/`` first; only a deploy that completes moves the root to
  the tool's name, so a failed or interrupted run leaves no root behind.
* An interrupted ``nix build`` gets SIGINT before SIGKILL: nix's builders run
  in their own session, and only nix can stop them and discard the
  unfinished output (it never becomes a valid store path).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import ConfigError, FlakeError, StorageError, UsageError
from ..host.fsutil import atomic_write, load_json, read_inside
from ..host.output import LineCallback
from ..host.process import Completed, ProcessRunner, scrubbed_env
from ..host.storage import read_cache_file
from ..host.trees import remove_tree
from ..stages.build import BuildResult
from ..stages.deploy import StorePath, write_entry
from ..stages.flake import FLAKE_FILE, LOCK_FILE
from .nix_sandbox import NIX_FEATURES, NixSandbox, find_nix, nix_sandbox

__all__ = [
    "NIX_FEATURES",
    "NIX_INSTALL_HINT",
    "NIX_SANDBOX_HINT",
    "Nix",
    "NixOptions",
    "NixRelease",
    "NixSandbox",
    "find_nix",
    "lock_hash",
    "nix_sandbox",
    "normalize_flake_ref",
    "record_nix",
    "resolve_backend",
]

NIX_INSTALL_HINT = (
    "Install Nix: `make install` in the flakebot-magic checkout (Debian: "
    "`apt-get install nix-bin`, then `bash scripts/setup-nix.sh` as root to enable "
    "flakes), or see https://nixos.org/download. Or use --backend cargo."
)
NIX_SANDBOX_HINT = (
    "Turn it on: `make nix` in the flakebot-magic checkout (runs scripts/setup-nix.sh as root), "
    "or set `sandbox = true` and `build-users-group = nixbld` in /etc/nix/nix.conf "
    "(the nixbld group and its nixbld1..N users must exist)."
)
#: seconds nix gets to stop its builders after SIGINT
INTERRUPT_GRACE = 20.0
#: how many lines of a failed build's log a FlakeError carries
LOG_TAIL = 40

_EVAL_AT = re.compile(r"\bat (/nix/store/[0-9a-z]{32}-[^/\s:]+)/([^\s:]+):(\d+):(\d+):")
_BUILD_FAILED = re.compile(r"error: builder for '([^']+)' failed")
_LOG_LINE = re.compile(r"^[A-Za-z0-9+._?=-]+> ?(.*)$")


def sandbox_off_error(state: NixSandbox) -> ConfigError:
    """The ConfigError for a nix whose builds are not confined."""
    return ConfigError(
        f"The nix backend builds only in nix's sandbox, and it is off here ({state.why}): "
        f"crate code and model-written code (build scripts, tests) would run unconfined. {NIX_SANDBOX_HINT} "
        "Or use --backend cargo, which builds in bubblewrap."
    )


def resolve_backend(
    requested: str | None,
    *,
    nix: str | None = None,
    sandbox: NixSandbox | None = None,
) -> tuple[str, str]:
    """``(backend, why)`` for ``auto``/``nix``/``cargo``.

    ``auto`` is ``nix`` when the ``nix`` command is on PATH and builds in its
    sandbox (:func:`nix_sandbox`, or ``sandbox`` when given), else ``cargo``.
    ``nix`` without nix installed, or with its sandbox off, raises
    :class:`ConfigError` saying how to install it or turn the sandbox on.

    Examples
    --------
    >>> resolve_backend("cargo")
    ('cargo', 'asked for')
    """
    choice = (requested or "auto").strip().lower()
    if choice not in ("auto", "nix", "cargo"):
        raise UsageError(f"Unknown backend {requested!r}: use auto, nix or cargo.")
    if choice == "cargo":
        return "cargo", "asked for"
    found = nix if nix is not None else find_nix()
    if choice == "nix":
        if not found:
            raise ConfigError(f"--backend nix needs the `nix` command, which is not on PATH. {NIX_INSTALL_HINT}")
        state = sandbox or nix_sandbox(found)
        if not state.on:
            raise sandbox_off_error(state)
        return "nix", "asked for"
    if not found:
        return "cargo", "auto: nix is not installed"
    state = sandbox or nix_sandbox(found)
    if not state.on:
        return "cargo", (
            f"auto: nix is on PATH but its sandbox is off ({state.why}), so cargo builds, in bubblewrap. "
            f"For the nix backend: {NIX_SANDBOX_HINT}"
        )
    return "nix", "auto: nix is on PATH"


def normalize_flake_ref(ref: str, base: Path | None = None) -> str:
    """A flake reference usable from any directory.

    A plain directory path, or a ``path:`` reference with a relative path,
    becomes ``path:/absolute/dir`` (relative to ``base``, default the current
    directory); other references (``github:...``) pass through.
    """
    ref = ref.strip()
    if not ref:
        raise UsageError("--nixpkgs is empty: give a flake reference such as github:NixOS/nixpkgs/nixos-24.05")
    root = base or Path.cwd()
    if ref.startswith("path:"):
        location, sep, query = ref[len("path:") :].partition("?")
        if not location.startswith("/"):
            location = str((root / location).resolve())
        return f"path:{location}{sep}{query}"
    if ref.startswith(("/", "./", "../", "~")) or ref in (".", ".."):
        return f"path:{(root / Path(ref).expanduser()).resolve()}"
    return ref


_MAX_READ = 4 << 20  #: the most read of a flake.lock or flake.nix (either is a few KiB)


def lock_hash(workspace: Path) -> str:
    """``sha256-<hex>`` of the workspace's flake.lock (empty when there is none)."""
    try:
        data, _ = read_inside(Path(workspace), LOCK_FILE, _MAX_READ)
    except OSError:
        return ""
    return "sha256-" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class NixOptions:
    """Nix settings passed on every command line (None: nix.conf decides).

    ``builders`` is nix's ``builders`` setting (``ssh://host x86_64-linux``
    lines separated by ``;``), ``substituters`` and ``trusted_public_keys``
    are space-separated lists, exactly as in nix.conf.
    """

    builders: str | None = None
    substituters: str | None = None
    trusted_public_keys: str | None = None
    #: the nix store to use (``--store``): a second store such as ``local?root=/srv/mate``; None: nix's own
    store: str | None = None
    #: nix's ``max-jobs``: 0 sends every build to the builders
    max_jobs: int | None = None

    @classmethod
    def of(cls, settings: Settings) -> NixOptions:
        """The nix options a run's settings give."""
        return cls(
            settings.nix_builders,
            settings.nix_substituters,
            settings.nix_trusted_public_keys,
            settings.nix_store,
            settings.nix_max_jobs,
        )

    def argv(self) -> list[str]:
        args: list[str] = ["--store", self.store] if self.store else []
        if self.max_jobs is not None:
            args += ["--option", "max-jobs", str(self.max_jobs)]
        for name, value in (
            ("builders", self.builders),
            ("substituters", self.substituters),
            ("trusted-public-keys", self.trusted_public_keys),
        ):
            if value is not None:
                args += ["--option", name, value]
        return args


@dataclass(frozen=True)
class LockInfo:
    """What ``nix flake lock`` pinned."""

    hash: str  # lock_hash of flake.lock
    nixpkgs: dict[str, Any]  # the locked nixpkgs node: type, rev or path, narHash


class Nix:
    """nix, through the process runner, with the user's options.

    Parameters
    ----------
    runner
        Runs every command (its cancel token stops a build).
    executable
        The nix binary; default: ``nix`` on PATH (ConfigError when missing).
    options
        builders, substituters, trusted-public-keys for every command.
    sandbox
        Whether nix builds in its sandbox; default: ask nix
        (:func:`nix_sandbox`) before the first build. :meth:`build` refuses
        when it does not.
    """

    def __init__(
        self,
        runner: ProcessRunner,
        *,
        executable: str | None = None,
        options: NixOptions | None = None,
        sandbox: NixSandbox | None = None,
    ) -> None:
        found = executable or find_nix()
        if not found:
            raise ConfigError(f"The nix backend needs the `nix` command, which is not on PATH. {NIX_INSTALL_HINT}")
        self.executable = found
        self.runner = runner
        self.options = options or NixOptions()
        self._sandbox = sandbox

    @property
    def sandbox(self) -> NixSandbox:
        """Does this nix build in its sandbox? (asked once)"""
        if self._sandbox is None:
            self._sandbox = nix_sandbox(self.executable, self.runner)
        return self._sandbox

    def argv(self, *args: str) -> list[str]:
        return [self.executable, *NIX_FEATURES, *self.options.argv(), *args]

    def on_store(self, store: str) -> Nix:
        """This nix, on another store (a binary cache's URL, a chroot store)."""
        return Nix(
            self.runner, executable=self.executable, options=replace(self.options, store=store), sandbox=self._sandbox
        )

    def trusting(self, keys: str) -> Nix:
        """This nix, trusting exactly the public keys ``keys``."""
        options = replace(self.options, trusted_public_keys=keys)
        return Nix(self.runner, executable=self.executable, options=options, sandbox=self._sandbox)

    def _nix_store(self) -> str:
        sibling = Path(self.executable).with_name("nix-store")
        return str(sibling) if sibling.exists() else "nix-store"

    def run(
        self,
        *args: str,
        cwd: Path | None = None,
        timeout: float = 600.0,
        on_line: LineCallback | None = None,
    ) -> Completed:
        return self.runner.run(
            self.argv(*args),
            cwd=cwd,
            env=scrubbed_env(),
            timeout=timeout,
            on_line=on_line,
            workspace=cwd,
            interrupt_grace=INTERRUPT_GRACE,
        )

    # -- the flake ----------------------------------------------------------

    def lock(
        self, workspace: Path, kept: Path, *, timeout: float = 600.0, on_line: LineCallback | None = None
    ) -> LockInfo:
        """``nix flake lock`` in ``workspace``: write flake.lock from flakebot's own, return what it pins.

        The workspace's flake.lock is never used as it stands: nix keeps any lock
        whose ``original`` matches flake.nix's input, whatever its ``locked`` names,
        and a crate can ship one, a model or a test write one, to choose the nixpkgs
        whose Nix code nix evaluates and whose builders make the tool. So before nix
        runs it is replaced by ``kept`` (the lock flakebot saved, in its private
        cache, the last time it locked the same nixpkgs reference), or removed when
        there is none; what nix locks is saved to ``kept`` again. One reference is
        pinned once per cache: every tool built against it uses the same nixpkgs.
        """
        target = workspace / LOCK_FILE
        try:
            saved: bytes | None = read_cache_file(kept, _MAX_READ)
        except (OSError, StorageError):  # none yet, or damaged (a link, a FIFO): nix locks the reference afresh
            saved = None
        if saved is not None:
            atomic_write(target, saved, mode=0o644, root=workspace)
        else:
            remove_tree(target)
        done = self.run("flake", "lock", cwd=workspace, timeout=timeout, on_line=on_line)
        if done.returncode != 0:
            raise flake_error(
                done,
                workspace,
                "nix could not lock the flake's inputs",
                "When offline, point nixpkgs at a local copy with --nixpkgs path:/a/nixpkgs "
                "(or FLAKEBOT_NIXPKGS), or use --backend cargo.",
            )
        try:
            written = read_inside(workspace, LOCK_FILE, _MAX_READ)[0]
            lock = load_json(written)
            node = lock["nodes"][lock["nodes"]["root"]["inputs"]["nixpkgs"]]["locked"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise FlakeError(f"nix flake lock wrote no usable {LOCK_FILE}: {exc}", workspace=workspace) from exc
        if written != saved:
            try:
                atomic_write(kept, written, make_parents=True)
            except OSError:
                pass  # not kept: the next build locks the reference again
        return LockInfo(hash=lock_hash(workspace), nixpkgs=dict(node))

    def build(
        self,
        workspace: Path,
        out_link: Path,
        *,
        timeout: float,
        on_line: LineCallback | None = None,
        attribute: str = "",
        source: Path | None = None,
    ) -> Path:
        """``nix build`` the workspace flake; return the output's /nix/store path.

        With ``source`` (the proven commit's exported files, :mod:`~flakebot_magic.stages.proven`), the flake
        built is that directory, as a ``path:`` flake: exactly the commit's files, never the work tree's.
        ``out_link`` becomes a GC root for it (nix creates it only after a
        successful build). Refuses (:class:`ConfigError`) when nix's sandbox
        is off: the build runs the crate's build scripts and tests.
        """
        if not self.sandbox.on:
            raise sandbox_off_error(self.sandbox)
        out_link.parent.mkdir(parents=True, exist_ok=True)
        flake = f"path:{Path(source).resolve()}" if source is not None else "."
        installable = f"{flake}#{attribute}" if attribute else flake
        done = self.run(
            "build",
            installable,
            "--print-build-logs",
            "--json",
            "--out-link",
            str(out_link),
            cwd=workspace,
            timeout=timeout,
            on_line=on_line,
        )
        if done.returncode != 0:
            raise flake_error(done, workspace, "nix build failed")
        try:
            built = load_json(done.stdout)
            path = Path(built[0]["outputs"]["out"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise FlakeError(
                f"nix build succeeded but printed no output path ({exc}): {done.stdout[-500:]}",
                workspace=workspace,
            ) from exc
        return path

    # -- store paths and roots ----------------------------------------------

    def add_root(self, path: Path, link: Path, *, timeout: float = 120.0) -> bool:
        """Make ``link`` an (indirect) GC root for the valid ``path``; False when it is not valid.

        ``nix-store --realise`` on a valid path does nothing but add the
        root; on a collected one it asks the substituters, and fails.
        """
        link.parent.mkdir(parents=True, exist_ok=True)
        done = self.runner.run(
            [self._nix_store(), *self.options.argv(), "--realise", str(path), "--add-root", str(link)],
            env=scrubbed_env(),
            timeout=timeout,
            interrupt_grace=INTERRUPT_GRACE,
        )
        return done.returncode == 0

    def is_valid(self, path: Path, *, timeout: float = 60.0) -> bool:
        """Is ``path`` a complete, registered store path?"""
        done = self.runner.run([self._nix_store(), "--check-validity", str(path)], env=scrubbed_env(), timeout=timeout)
        return done.returncode == 0


def root_points_to(link: Path, path: Path) -> bool:
    """Does the GC root ``link`` exist and point at ``path`` (which then is alive)?"""
    try:
        return link.is_symlink() and Path(os.readlink(link)) == path and path.exists()
    except OSError:
        return False


def pending_link(pending: Path, name: str) -> Path:
    """Where ``nix build`` puts its out-link until the deploy completes (``pending``: ``CacheLayout.pending_gcroots``)."""
    return pending / f"{name}-{os.getpid()}-{time.monotonic_ns()}"


def binaries_of(path: Path) -> dict[str, Path]:
    """The executables in ``path/bin``, by name."""
    bin_dir = path / "bin"
    if not bin_dir.is_dir():
        return {}
    return {entry.name: entry for entry in sorted(bin_dir.iterdir()) if os.access(entry, os.X_OK)}


def flake_error(done: Completed, workspace: Path, what: str, advice: str = "") -> FlakeError:
    """A FlakeError for a failed nix command: the flake file and line, or the build log's tail."""
    stderr = done.stderr
    lines = [line.rstrip() for line in stderr.splitlines()]
    failed = _BUILD_FAILED.search(stderr)
    if failed:
        logged = [m.group(1) for m in map(_LOG_LINE.match, lines) if m]
        if not logged:  # without --print-build-logs nix quotes the last lines itself
            logged = [line.strip()[2:] for line in lines if line.strip().startswith("> ")]
        tail = "\n".join(logged[-LOG_TAIL:])
        return FlakeError(
            f"{what}: the builder of {failed.group(1)} failed. The end of its log:\n{tail}\n"
            f"Full log: nix log {failed.group(1)}",
            log_tail=tail,
            workspace=workspace,
            drv=failed.group(1),
        )
    errors = [line for line in lines if line.startswith("error:")]
    message = (errors[0] if errors else (lines[-1] if lines else f"exit status {done.returncode}")).removeprefix(
        "error: "
    )
    location = _EVAL_AT.search(stderr)
    file = line_no = None
    where = ""
    if location:
        # nix's stderr is data: the file it names is only compared with the one flakebot wrote, never opened
        named, line_no = location.group(2), int(location.group(3))
        where = f"\n  at {location.group(2)}:{line_no}:{location.group(4)}"
        if named == FLAKE_FILE:
            file = workspace / FLAKE_FILE
            source = _flake_line(workspace, line_no)
            if source:
                where += f"\n  {line_no} | {source}"
    tail = "\n".join(line for line in lines if line.strip() and not line.startswith("warning:"))[-4000:]
    return FlakeError(
        f"{what}: {message}{where}" + (f"\n{advice}" if advice else ""),
        log_tail=tail,
        workspace=workspace,
        file=file,
        line=line_no,
    )


def _flake_line(workspace: Path, line: int) -> str:
    """Line ``line`` of the workspace's ``flake.nix`` (a regular file, never through a link), or ""."""
    try:
        data, _ = read_inside(workspace, FLAKE_FILE, _MAX_READ)
        return data.decode("utf-8", errors="replace").splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return ""


class NixRelease:
    """The ``release`` step for :func:`flakebot_magic.stages.build.check`: ``nix build``, as a BuildResult.

    After it ran, :attr:`store_path` is the built /nix/store path.
    """

    def __init__(
        self, nix: Nix, workspace: Path, out_link: Path, *, timeout: float, on_line: LineCallback | None = None
    ) -> None:
        self.nix, self.workspace, self.out_link = nix, workspace, out_link
        self.timeout, self.on_line = timeout, on_line
        self.store_path: Path | None = None

    def __call__(self, source: Path | None = None) -> BuildResult:
        """``nix build`` of ``source`` (the proven commit's files; default: the workspace's flake)."""
        path = self.nix.build(self.workspace, self.out_link, timeout=self.timeout, on_line=self.on_line, source=source)
        binaries = binaries_of(path)
        if not binaries:
            raise FlakeError(f"nix built {path}, which has no bin/ programs to deploy.", workspace=self.workspace)
        self.store_path = path
        return BuildResult(binaries=binaries, diagnostics=[])


def nix_release(
    nix: Nix, workspace: Path, out_link: Path, *, timeout: float, on_line: LineCallback | None = None
) -> NixRelease:
    """A :class:`NixRelease` (the name the pipeline has always used)."""
    return NixRelease(nix, workspace, out_link, timeout=timeout, on_line=on_line)


def remove_link(link: Path) -> None:
    """Remove a GC root symlink, if it is one (nix drops the stale registration itself)."""
    try:
        if link.is_symlink():
            link.unlink()
    except OSError:
        pass


def record_nix(store_dir: Path, key: str, crate: str, version: str, built: Path, manifest: dict[str, Any]) -> StorePath:
    """The cache entry ``<store_dir>/<key>-<crate>-<version>/`` for a nix-built tool, written atomically.

    It holds ``manifest.json`` (with ``nix_store_path``) and ``bin``, a
    symlink to the /nix/store path's ``bin``: the same shape as a cargo
    entry, so the recipe and cleanup machinery treat both alike.
    """
    return write_entry(
        store_dir,
        key,
        crate,
        version,
        lambda staging: (staging / "bin").symlink_to(built / "bin"),
        {**manifest, "nix_store_path": str(built)},
    )
