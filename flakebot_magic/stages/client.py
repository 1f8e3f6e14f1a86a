"""Stage 6: the Python callable for a deployed command-line tool.

``tool(*args, input=None, timeout=...)`` runs the binary and returns its
standard output as text. Tools that read standard input (their ``--help``
says so) also take the text itself as the first argument: ``md("# Hi")``
sends ``# Hi`` to the binary's standard input, and ``md("# Hi", "-T")``
passes ``-T`` as an option. Pass ``pathlib.Path`` objects for file arguments.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ToolError

__all__ = ["Tool", "reads_stdin"]

_STDIN_HINT = re.compile(r"standard input|\bstdin\b|from input|reads? (?:from )?(?:the )?input", re.I)


def reads_stdin(help_text: str) -> bool:
    """Does the tool's help say it reads standard input?"""
    return bool(_STDIN_HINT.search(help_text))


def _help_of(binary: Path, timeout: float = 10.0) -> str:
    for flag in ("--help", "-h"):
        try:
            done = subprocess.run(
                [str(binary), flag], capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = (done.stdout or done.stderr).decode("utf-8", "replace").strip()
        if done.returncode == 0 and text:
            return text
    return ""


@dataclass
class Tool:
    """A deployed command-line tool, callable from Python.

    Examples
    --------
    >>> md("# Hi")                       # doctest: +SKIP
    '<h1>Hi</h1>\\n'
    >>> hexyl(input=b"\\x00\\x01")       # doctest: +SKIP
    """

    name: str
    binary: Path
    crate: str
    version: str
    source_hash: str
    store_path: Path
    checksum: str = ""
    backend: str = "cargo"
    timeout: float = 60.0
    provenance: dict[str, Any] = field(default_factory=dict)
    #: nix backend: ``sha256-<hex>`` of the flake.lock it was built with
    lock_hash: str = ""
    _help: str | None = field(default=None, repr=False)

    # -- calling ------------------------------------------------------------

    @property
    def help(self) -> str:
        """The binary's ``--help`` text (run once, then remembered)."""
        if self._help is None:
            self._help = _help_of(self.binary)
        return self._help

    @property
    def reads_stdin(self) -> bool:
        return reads_stdin(self.help)

    def __call__(
        self,
        *args: str | os.PathLike[str] | int | float,
        input: str | bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run the tool; return its standard output.

        Parameters
        ----------
        *args
            Command-line arguments. For a tool that reads standard input, a
            first argument that is a plain ``str`` (not an option, not a
            ``Path``) is sent as the input when ``input`` is not given.
        input
            Text or bytes for the tool's standard input.
        timeout
            Seconds before the tool is stopped (default: ``self.timeout``).

        Raises
        ------
        ToolError
            When the tool exits non-zero or runs past ``timeout``.
        """
        argv: list[str] = []
        items = list(args)
        if (
            input is None
            and items
            and isinstance(items[0], str)
            and not items[0].startswith("-")
            and self.reads_stdin
        ):
            input = items.pop(0)
        for item in items:
            argv.append(os.fspath(item) if isinstance(item, os.PathLike) else str(item))
        data = input.encode() if isinstance(input, str) else input
        limit = self.timeout if timeout is None else timeout
        try:
            done = subprocess.run(
                [str(self.binary), *argv],
                input=data if data is not None else b"",
                capture_output=True,
                timeout=limit,
                env=None if env is None else {**os.environ, **env},
            )
        except subprocess.TimeoutExpired as exc:
            raise ToolError(
                f"{self.name} ran past its time limit of {limit:g} s and was stopped. "
                "Pass a larger timeout=... if the input is just big.",
                returncode=None,
                stderr=(exc.stderr or b"").decode("utf-8", "replace"),
            ) from None
        stdout = done.stdout.decode("utf-8", "replace")
        if done.returncode != 0:
            stderr = done.stderr.decode("utf-8", "replace")
            raise ToolError(
                f"{self.name} exited with status {done.returncode}: "
                f"{stderr.strip()[-1500:] or '(no error output)'}",
                returncode=done.returncode,
                stderr=stderr,
            )
        return stdout

    # -- describing ---------------------------------------------------------

    def example(self) -> str:
        if self.reads_stdin:
            return f'{self.name}("some input text")'
        return f'{self.name}("--help")'

    def usage(self) -> str:
        """How to call this tool, for a person or an agent."""
        lines = [
            f"{self.name}: {self.crate} {self.version} ({self.provenance.get('description') or 'a command-line tool'})",
            f"  call:    {self.example()}",
            f"  args:    {self.name}(*args, input=None, timeout={self.timeout:g}) -> str (standard output)",
        ]
        if self.reads_stdin:
            lines.append("  input:   a first plain-str argument is sent to standard input; later ones are options; use pathlib.Path for files")
        lines += [
            "  errors:  ToolError(returncode, stderr) on a non-zero exit",
            f"  help:    {self.name}.help",
            f"  binary:  {self.binary}",
            f"  source:  {self.crate} {self.version}, checksum {self.checksum[:16]}…",
            f"  store:   {self.store_path} (hash {self.source_hash})",
        ]
        if self.backend == "nix":
            lines.append(f"  flake:   flake.lock {self.lock_hash}, nixpkgs {self._nixpkgs()}")
        lines.append(f"  backend: {self.backend}")
        return "\n".join(lines)

    def _nixpkgs(self) -> str:
        from .nix import describe_locked

        locked = self.provenance.get("nixpkgs")
        return describe_locked(locked) if isinstance(locked, dict) else "?"

    def __repr__(self) -> str:
        return f"<flakebot tool {self.name}: {self.crate} {self.version}, {self.backend}, {self.store_path}>\n{self.usage()}"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        # no data of its own (text and HTML come from the methods beside it); the
        # output metadata records the provenance, so a notebook says which tool it got
        from ..provenance import provenance_of

        return {}, {"flakebot": provenance_of(self)}

    def _repr_html_(self) -> str:
        e = html.escape
        rows = [
            ("crate", f"{self.crate} {self.version}"),
            ("source hash", self.source_hash),
            ("store path", str(self.store_path)),
            ("backend", self.backend),
        ]
        if self.backend == "nix":
            rows += [("flake.lock", self.lock_hash), ("nixpkgs", self._nixpkgs())]
        body = "".join(f"<tr><th style='text-align:left'>{e(k)}</th><td><code>{e(v)}</code></td></tr>" for k, v in rows)
        return (
            f"<div class='flakebot-tool'><b>flakebot tool <code>{e(self.name)}</code></b> "
            f"&mdash; {e(str(self.provenance.get('description', '')))}"
            f"<table>{body}</table>"
            f"<p>Call it: <code>{e(self.example())}</code> returns the tool's standard output; "
            f"<code>{e(self.name)}.help</code> shows its options.</p></div>"
        )
