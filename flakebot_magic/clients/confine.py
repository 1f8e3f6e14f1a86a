"""Where a deployed tool runs: as the user with the allowlisted environment, or confined in the sandbox.

:func:`tool_environment` is the whole environment of an unconfined start;
:class:`Confinement` is a confined one (every kind's, whenever
:attr:`~flakebot_magic.clients.base.ToolClient.confined_now` says so).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..host.process import allowed_env
from ..host.trees import remove_tree
from ..sandbox import Sandbox

__all__ = ["Confinement", "tool_environment"]


def tool_environment(*extras: Mapping[str, str] | None) -> dict[str, str]:
    """The whole environment a deployed tool starts with: the allowlist, ``HOME``, then ``extras``.

    The allowlist is :func:`flakebot_magic.host.process.allowed_env` (``PATH``,
    ``LANG``, ``LC_*``, ``TZ`` ...). A deployed tool runs as the user, so it
    gets the user's ``HOME`` (a path, not a secret). Nothing else of the
    kernel's environment passes (no API key, no ``DATABASE_URL``): what a tool
    needs beyond that, the user gives explicitly (the ``tool_env`` setting,
    ``tool(..., env={...})``), later mappings winning.
    """
    env = allowed_env(home=os.environ.get("HOME"))
    for mapping in extras:
        if mapping:
            env.update({str(k): str(v) for k, v in mapping.items()})
    return env


class Confinement:
    """A deployed tool run inside the sandbox: a private scratch dir, the store entry read-only.

    Used for what flakebot runs on its own initiative (the ``--help`` probe,
    acceptance examples) and, with the ``confine_tools`` setting, for every
    call. The scratch dir is the only writable directory and the working
    directory: inside, a tmpfs capped at the sandbox's ``tmp_bytes`` (the files flakebot put there, an
    input text, bound read-only into it), so a tool fills no disk; :meth:`close` removes it.
    """

    def __init__(self, binary: Path, store_path: Path, read_only: Iterable[str | Path] = ()) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="flakebot-tool-"))
        # the store entry and the binary (a nix tool's libraries are in /nix/store: the sandbox then shows it),
        # and what else the start needs to read (a confined service's forwarder: its Python)
        visible = {Path(store_path).resolve(), Path(binary).resolve().parent, *(Path(p) for p in read_only)}
        self.sandbox: Sandbox = Sandbox(
            self.scratch, read_only=tuple(sorted(visible)), cargo_home=self.scratch / ".cargo-home", scratch=True
        )

    def command(self, argv: list[str], timeout: float | None = None) -> list[str]:
        """``argv`` in the sandbox; ``timeout``: the call's wall seconds, which its CPU limit follows."""
        return self.sandbox.command(argv, timeout=timeout)

    def env(self, *extras: Mapping[str, str] | None) -> dict[str, str]:
        """The sandbox's environment plus ``extras`` (what the user passed explicitly)."""
        env = self.sandbox.env()
        for mapping in extras:
            env.update({str(k): str(v) for k, v in (mapping or {}).items()})
        return env

    def close(self) -> None:
        """Remove the scratch dir and the sandbox's process-count cgroups (after the process ended)."""
        self.sandbox.release()
        remove_tree(self.scratch, ignore_errors=True)
