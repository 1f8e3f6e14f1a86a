"""What only the sandbox may run: the Rust toolchain's programs, and the command lines the sandbox makes for them.

Those programs run what a crate says (its build scripts, its ``.cargo/config.toml``, its
``rust-toolchain.toml``), so :class:`~.process.ProcessRunner` runs one only as a :class:`SandboxedCommand`
(:func:`refuse_unsandboxed`), which ``flakebot_magic.sandbox.Sandbox.command`` alone makes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["TOOLCHAIN_PROGRAMS", "SandboxedCommand", "refuse_unsandboxed"]

#: programs that run what a crate ships or says: they run only inside the sandbox
TOOLCHAIN_PROGRAMS = frozenset(
    {"cargo", "rustc", "rustdoc", "rustup", "cargo-clippy", "clippy-driver", "cargo-fmt", "rustfmt"}
)


class SandboxedCommand(list[str]):
    """A command line made by the sandbox (``flakebot_magic.sandbox.Sandbox.command``), and only there.

    :meth:`~.process.ProcessRunner.run` refuses any other command line that names a
    :data:`TOOLCHAIN_PROGRAMS` program. ``cgroup``: the pids cgroup the command
    enters first (every process it starts is in it), or None. ``cgroups``: every
    cgroup it enters (the pids one, the memory one).
    """

    def __init__(self, argv: Sequence[str] = (), cgroup: Path | None = None, cgroups: Sequence[Path] = ()) -> None:
        super().__init__(argv)
        self.cgroup = cgroup
        self.cgroups = tuple(cgroups)


def _toolchain_program(argv: Sequence[str]) -> str:
    """The first word of ``argv`` that names a Rust toolchain program, or ""."""
    for word in argv:
        if os.path.basename(word) in TOOLCHAIN_PROGRAMS:
            return word
    return ""


def refuse_unsandboxed(args: Sequence[str | os.PathLike[str]], argv: Sequence[str]) -> None:
    """Raise ``ValueError`` when ``argv`` names a toolchain program and ``args`` is no :class:`SandboxedCommand`."""
    program = _toolchain_program(argv)
    if program and not isinstance(args, SandboxedCommand):
        raise ValueError(
            f"refusing to run {program!r} outside the sandbox: Rust toolchain programs run only as "
            "flakebot_magic.sandbox.Sandbox.command makes them"
        )
