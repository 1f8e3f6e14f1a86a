"""The Rust toolchain the sandbox shows: found without running any of it outside the sandbox.

cargo is found on ``PATH`` (or in rustup's ``~/.cargo/bin``); what it runs
with (the sysroot, rustup's home, the toolchain's name, ``rustc -vV``) is
asked of ``rustc`` itself, in the sandbox, from ``/``: no
``rust-toolchain.toml`` can answer, and the toolchain's programs never run
outside. From then on every command pins ``RUSTUP_TOOLCHAIN`` to that name,
so a toolchain file a crate ships (even one naming a ``path``) chooses nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, StorageError
from ..host.fsutil import atomic_write
from ..host.probes import ProbeCache, file_identity
from ..host.process import ProcessRunner, scrubbed_env
from ..host.storage import read_cache_json
from .command import BUILD, Sandbox
from .host import is_under, visible_system

__all__ = ["Toolchain", "toolchain_of"]

#: seconds rustc has to answer a question about itself
_ASK_SECONDS = 120.0


@dataclass(frozen=True)
class Toolchain:
    """The Rust toolchain cargo uses, as the sandbox must show it."""

    #: ``rustc --print sysroot``
    sysroot: str
    #: rustup's home and the active toolchain's name (empty without rustup)
    rustup_home: str = ""
    name: str = ""
    #: the directory of the cargo executable (rustup's proxies in ~/.cargo/bin)
    bin_dir: str = ""
    #: ``rustc -vV`` (part of every store hash)
    version: str = ""

    def read_only(self) -> list[str]:
        """What the sandbox must show (read-only) for the toolchain to run."""
        paths = [self.rustup_home or self.sysroot]
        if self.bin_dir:
            paths.append(self.bin_dir)
        return [p for p in paths if p and not visible_system(p)]

    def env(self) -> dict[str, str]:
        """``PATH``, and with rustup its home and the pinned toolchain."""
        path = [p for p in (self.bin_dir, os.path.join(self.sysroot, "bin") if self.sysroot else "") if p]
        env = {"PATH": os.pathsep.join([*dict.fromkeys(path), "/usr/local/bin", "/usr/bin", "/bin"])}
        if self.rustup_home:
            # the toolchain chosen here, not by a rust-toolchain file in the workspace
            env["RUSTUP_HOME"] = self.rustup_home
            env["RUSTUP_TOOLCHAIN"] = self.name
        return env

    def program(self, name: str) -> str:
        """Where ``name`` (``cargo``, ``rustc``) is, as the sandbox's ``PATH`` finds it."""
        return shutil.which(name, path=self.env()["PATH"]) or name


def _rustup_home(bin_dir: str) -> str:
    """rustup's home for proxies in ``bin_dir``: ``$RUSTUP_HOME``, else ``~/.rustup`` beside ``~/.cargo/bin``."""
    if not bin_dir or not os.path.exists(os.path.join(bin_dir, "rustup")):
        return ""
    given = scrubbed_env().get("RUSTUP_HOME", "")
    if given:
        return os.path.abspath(given)
    beside = Path(bin_dir).parent.parent / ".rustup"
    return str(beside) if Path(bin_dir).parent.name == ".cargo" and beside.is_dir() else ""


#: the toolchain behind each cargo, asked again when what chose it changes (see :func:`toolchain_of`)
_TOOLCHAINS: ProbeCache[str, Toolchain] = ProbeCache("toolchain", 8)


def toolchain_of(cargo: str, memo: Path | None = None) -> Toolchain:
    """The toolchain behind ``cargo`` (a rustup proxy or a plain install), asked in the sandbox.

    Kept while cargo, rustc, rustup's settings (``rustup default``) and
    ``RUSTUP_TOOLCHAIN`` are what they were: an upgraded or switched
    toolchain is asked again, without a kernel restart. With ``memo`` (a file
    of the private cache) the answer is also kept across processes, while those
    and the toolchain's own ``rustc`` and compiler library are the same files:
    a fresh process (``flakebot build`` of a tool built before) asks nothing.

    Raises :class:`~flakebot_magic.errors.ConfigError` when ``rustc`` does not
    answer there (nothing is kept: the next call asks again).
    """
    bin_dir = _bin_dir(cargo)
    rustup_home = _rustup_home(bin_dir)
    settings = os.path.join(rustup_home, "settings.toml") if rustup_home else None
    identity = (
        file_identity([cargo, os.path.join(bin_dir, "rustc") if bin_dir else None, settings]),
        scrubbed_env().get("RUSTUP_TOOLCHAIN", ""),
    )
    if memo is None:
        return _TOOLCHAINS.get(cargo, identity, lambda: _probe_toolchain(cargo))
    return _TOOLCHAINS.get(cargo, identity, lambda: _remembered(memo, cargo, identity))


def _own_files(toolchain: Toolchain) -> tuple[tuple[object, ...], ...]:
    """What the toolchain itself is on disk: its rustc and compiler library (a ``rustup update`` replaces them)."""
    sysroot = Path(toolchain.sysroot)
    return file_identity([sysroot / "bin" / "rustc", *sorted(sysroot.glob("lib/librustc_driver-*"))])


def _remembered(memo: Path, cargo: str, identity: object) -> Toolchain:
    """The toolchain ``memo`` kept for ``cargo`` while nothing that chose it changed; else probed and kept."""
    fields = ("sysroot", "rustup_home", "name", "bin_dir", "version")
    try:
        kept = read_cache_json(memo).get(cargo, {})
        found = Toolchain(**{f: str(kept["toolchain"][f]) for f in fields})
        if json.dumps(kept["identity"]) == json.dumps([identity, _own_files(found)]):
            return found
    except (OSError, StorageError, ValueError, KeyError, TypeError, AttributeError):
        pass
    found = _probe_toolchain(cargo)
    try:
        known = read_cache_json(memo)
    except (OSError, StorageError, ValueError):
        known = {}
    known[cargo] = {"identity": [identity, _own_files(found)], "toolchain": {f: getattr(found, f) for f in fields}}
    try:
        atomic_write(memo, json.dumps(known), make_parents=True)
    except OSError:
        pass  # only means asking again next time
    return found


def _bin_dir(cargo: str) -> str:
    bin_dir = os.path.dirname(os.path.abspath(cargo))
    if not os.path.exists(os.path.join(bin_dir, "rustc")):  # not a toolchain's bin directory (a stand-in for cargo)
        rustc = shutil.which("rustc", path=scrubbed_env().get("PATH"))
        bin_dir = os.path.dirname(rustc) if rustc else ""
    return bin_dir


def _probe_toolchain(cargo: str) -> Toolchain:
    bin_dir = _bin_dir(cargo)
    rustup_home = _rustup_home(bin_dir)
    # without rustup the toolchain is the install around bin/ (/opt/rust for /opt/rust/bin), never $HOME itself
    prefix = os.path.dirname(bin_dir) if bin_dir and not rustup_home else ""
    shown = [p for p in (bin_dir, rustup_home or prefix) if p and p not in ("/", os.path.expanduser("~"))]
    base = Toolchain(sysroot="", rustup_home=rustup_home, bin_dir=bin_dir)
    with tempfile.TemporaryDirectory(prefix="flakebot-toolchain-") as scratch:
        probe = _Probe(Path(scratch), shown)
        env = base.env()
        given = scrubbed_env().get("RUSTUP_TOOLCHAIN")
        if rustup_home and given:  # the user's own choice, from the kernel's environment
            env["RUSTUP_TOOLCHAIN"] = given
        elif rustup_home:
            del env["RUSTUP_TOOLCHAIN"]
        sysroot = os.path.realpath(probe.ask(["rustc", "--print", "sysroot"], env))
        parent = Path(sysroot).parent
        if rustup_home and parent.name == "toolchains":
            found = Toolchain(sysroot=sysroot, rustup_home=str(parent.parent), name=Path(sysroot).name, bin_dir=bin_dir)
        else:
            found = Toolchain(sysroot=sysroot, bin_dir=bin_dir)
        if not is_under(sysroot, [*shown, "/usr"]):
            probe.sandbox.read_only.append(sysroot)
        version = probe.ask(["rustc", "-vV"], found.env())
    return Toolchain(
        sysroot=found.sysroot, rustup_home=found.rustup_home, name=found.name, bin_dir=bin_dir, version=version
    )


class _Probe:
    """Questions to ``rustc`` in a sandbox around an empty directory."""

    def __init__(self, scratch: Path, shown: list[str]) -> None:
        self.scratch = scratch
        self.sandbox = Sandbox(scratch, read_only=shown, cargo_home=scratch / "cargo-home")

    def ask(self, argv: list[str], env: dict[str, str]) -> str:
        program = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        # from "/": no directory a toolchain file could be planted in (the sandbox's own root, or the host's)
        command = self.sandbox.command([program, *argv[1:]], BUILD, cwd="/", timeout=_ASK_SECONDS)
        try:
            done = ProcessRunner().run(command, cwd=Path("/"), env=self.sandbox.env(env), timeout=_ASK_SECONDS)
        finally:
            self.sandbox.release()
        answer = done.stdout.strip()
        if done.returncode != 0 or not answer:
            raise ConfigError(
                f"`{' '.join(argv)}` did not answer in the sandbox ({(done.stderr.strip() or 'no output')[:300]}). "
                "Check the Rust toolchain (`rustc -vV`), or install it with `make install` or https://rustup.rs."
            )
        return answer
