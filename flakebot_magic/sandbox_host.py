"""What a sandbox shows of this host: the system paths, bubblewrap's namespaces, the Rust toolchain."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .process import scrubbed_env

__all__ = [
    "INSTALL_BWRAP",
    "Toolchain",
    "bubblewrap_works",
    "is_under",
    "namespaces",
    "system_binds",
    "toolchain_of",
    "visible_system",
]

#: how to get bubblewrap, said wherever it is missing
INSTALL_BWRAP = "install bubblewrap (`apt-get install bubblewrap`, or `make install`)"

#: system directories bound read-only (a symlink, as /bin on merged-/usr systems, is recreated)
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: from /etc only what running the toolchain and ordinary programs needs: no shadow, no ssh keys
_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/hosts",
    "/etc/os-release",
)


@lru_cache(maxsize=4)
def bubblewrap_works(bwrap: str = "bwrap") -> str:
    """``""`` when bubblewrap can make an isolated, network-less sandbox here, else why not."""
    path = shutil.which(bwrap)
    if path is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        done = subprocess.run(
            [path, *system_binds(), *namespaces(), "--", "true"],
            capture_output=True,
            timeout=20,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not start ({exc})"
    if done.returncode != 0:
        return f"bubblewrap cannot create a sandbox here ({done.stderr.decode(errors='replace').strip()[:200]})"
    return ""


def system_binds() -> list[str]:
    """bubblewrap arguments showing the system directories and the few /etc files, read-only, plus /dev and /proc."""
    args: list[str] = []
    for path in (*_SYSTEM, *_ETC):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return [*args, "--dev", "/dev", "--proc", "/proc"]


def namespaces() -> list[str]:
    """bubblewrap arguments for fresh namespaces (no network), a new session and no capabilities."""
    return [
        "--unshare-user-try",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--unshare-net",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]


def is_under(path: str, roots: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one (as strings: no path is resolved)."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def visible_system(path: str) -> bool:
    """Whether the sandbox already shows ``path`` as part of the system directories."""
    real = os.path.realpath(path)
    return is_under(real, ("/usr",)) or is_under(path, _SYSTEM)


# --- the toolchain ------------------------------------------------------------------------------


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

    def read_only(self) -> list[str]:
        paths = [self.rustup_home or self.sysroot]
        if self.bin_dir:
            paths.append(self.bin_dir)
        return [p for p in paths if p and not visible_system(p)]

    def env(self) -> dict[str, str]:
        path = [p for p in (self.bin_dir, os.path.join(self.sysroot, "bin")) if p]
        env = {"PATH": os.pathsep.join([*dict.fromkeys(path), "/usr/local/bin", "/usr/bin", "/bin"])}
        if self.rustup_home:
            # the toolchain chosen here, not by a rust-toolchain file in the workspace
            env["RUSTUP_HOME"] = self.rustup_home
            env["RUSTUP_TOOLCHAIN"] = self.name
        return env


@lru_cache(maxsize=8)
def toolchain_of(cargo: str) -> Toolchain:
    """The toolchain behind ``cargo`` (a rustup proxy or a plain install), found outside any workspace.

    ``rustc`` runs in ``/`` so no ``rust-toolchain`` file can pick it.
    """
    bin_dir = os.path.dirname(os.path.abspath(cargo))
    rustc = os.path.join(bin_dir, "rustc")
    if not os.path.exists(rustc):  # not a toolchain's bin directory (a stand-in for cargo)
        bin_dir = ""
        rustc = shutil.which("rustc", path=scrubbed_env().get("PATH")) or "rustc"
    env = scrubbed_env()
    beside = Path(bin_dir).parent.parent / ".rustup"  # rustup's proxies in ~/.cargo/bin, toolchains in ~/.rustup
    if bin_dir and "RUSTUP_HOME" not in env and Path(bin_dir).parent.name == ".cargo" and beside.is_dir():
        env["RUSTUP_HOME"] = str(beside)
    try:
        done = subprocess.run(
            [rustc, "--print", "sysroot"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
        )
        sysroot = done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        sysroot = ""
    if not sysroot:
        sysroot = os.path.dirname(os.path.dirname(os.path.abspath(rustc)))
    sysroot = os.path.realpath(sysroot)
    parent = Path(sysroot).parent
    if parent.name == "toolchains":
        return Toolchain(sysroot=sysroot, rustup_home=str(parent.parent), name=Path(sysroot).name, bin_dir=bin_dir)
    return Toolchain(sysroot=sysroot, bin_dir=bin_dir)
