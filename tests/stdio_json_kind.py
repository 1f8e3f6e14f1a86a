"""A test-only tool kind, ``stdio-json``: a program started once per call (no server) that reads one JSON object
(the call's arguments) on standard input and writes one JSON object on standard output. Its client has one
function, ``call(**arguments)``, which returns the parsed answer.

Written as docs/ARCHITECTURE.md's "Adding a tool kind" says: this module (the client, whose class attributes are
the row) and one row in :data:`flakebot_magic.clients.kinds.KINDS`, which only the tests add (:func:`add_row`; as a
pytest plugin, ``-p stdio_json_kind``, for a whole session, see :func:`pytest_configure`).

``call`` is also the name every client gives its OpenAI tool-call method (``tool.call(tool_call)``,
docs/tool-contract.md, "Arguments"): here one positional argument is that, and keywords are the tool's arguments.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from flakebot_magic.clients.agents import ToolFunction
from flakebot_magic.clients.base import ToolClient
from flakebot_magic.clients.confine import Confinement
from flakebot_magic.errors import ToolError
from flakebot_magic.host.exchange import Exchange, Started, stop_group
from flakebot_magic.host.fsutil import load_json
from flakebot_magic.host.process import spawn, start_call

__all__ = ["HOSTILE_PROGRAM", "StdioJsonTool", "add_row", "child_prelude"]

_UNSET: Any = object()


class StdioJsonTool(ToolClient):
    """A ``stdio-json`` tool: ``tool.call(**arguments)`` runs the binary once and returns its JSON answer."""

    kind = "stdio-json"
    server = False
    noun, a_noun = "stdio JSON program", "a stdio JSON program"
    asked_by = re.compile(r"\bstdio[- ]json\b", re.I)
    contract_text = (
        "A stdio-json tool is started once per call: it reads one JSON object (the call's arguments) on standard "
        "input, writes one JSON object on standard output, then exits."
    )

    def call(self, tool_call: Any = _UNSET, **arguments: Any) -> Any:
        """``call(**arguments)``: run the tool once with ``arguments``; ``call(tool_call)``: a model's tool call."""
        if tool_call is not _UNSET:
            if arguments:
                raise TypeError("call() takes a model's tool call or the tool's keyword arguments, not both")
            return super().call(tool_call)
        return self._run(arguments)

    def _run(self, arguments: dict[str, Any]) -> Any:
        self.require_binary()
        argv = [str(self.binary)]
        data = json.dumps(arguments).encode()
        confinement = Confinement(self.binary, self.store_path) if self.confined_now else None
        try:
            proc: Started
            if confinement is not None:  # in the sandbox: its scratch dir, the sandbox's environment
                proc = spawn(
                    confinement.command(argv, self.timeout),
                    stdin=True,
                    cwd=confinement.scratch,
                    env=confinement.env(self.env),
                )
            else:  # as the user, with the allowlisted environment; posix_spawn, cheap per call
                proc = start_call(argv, env=self._environment())
            out, err = self._exchange(proc, data)
        finally:
            if confinement is not None:
                confinement.close()
        if proc.returncode:
            text = err.decode("utf-8", "replace")
            raise ToolError(f"{self.name} exited with status {proc.returncode}: {text}", returncode=proc.returncode)
        try:
            return load_json(out)
        except ValueError as exc:
            raise ToolError(f"{self.name} did not answer with one JSON value: {exc}", returncode=0) from None

    def _exchange(self, proc: Started, data: bytes) -> tuple[bytes, bytes]:
        exchange = Exchange(proc)
        try:
            out, err = exchange.run(data, self.timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            exchange.close()
            raise ToolError(f"{self.name} ran past its time limit of {self.timeout:g} s", returncode=None) from None
        except BaseException:  # Ctrl-C: the tool stops with the call
            stop_group(proc)
            exchange.close()
            raise
        if exchange.overflow:
            raise ToolError(f"{self.name} wrote too much to standard output and was stopped", returncode=None)
        return out, err

    def functions(self) -> dict[str, ToolFunction]:
        def call(**arguments: Any) -> Any:
            return self._run(arguments)

        call.__qualname__ = f"{self.name}.call"
        return {
            "call": ToolFunction(
                name="call",
                description=f"Run {self.crate} once with these arguments (one JSON object); returns its JSON answer.",
                parameters={"type": "object", "properties": {}},
                function=call,
                example=f"{self.name}.call()",
                wire=self._run,
                open_arguments=True,  # the tool's arguments are its own: any JSON object
            )
        }


def add_row(kinds: dict[str, type[ToolClient]]) -> None:
    """The one row: ``kinds`` (the table) gets this kind."""
    kinds[StdioJsonTool.kind] = StdioJsonTool


#: the kind's hostile program for tests/kindtools.py (after its probe), and the call that makes it probe
HOSTILE_PROGRAM = (
    """
import json, sys
json.load(sys.stdin)
print(json.dumps(probe()))
""",
    "hostile.call()",
)


def child_prelude() -> str:
    """Code a child Python (eval's hidden pytest) runs first, so its fresh table has the row too."""
    tests = str(Path(__file__).resolve().parent)
    return (
        f"import sys\nsys.path.insert(0, {tests!r})\nfrom stdio_json_kind import add_row\n"
        "from flakebot_magic.clients.kinds import KINDS\nadd_row(KINDS)\n"
    )


def pytest_configure(config: Any) -> None:
    """As a plugin (``pytest -p stdio_json_kind``): the row in the table for the whole session, before the tests
    that build their cases from ``KINDS`` at import (tests/security/test_every_kind_confined.py) are collected."""
    from kindtools import CHILD_PRELUDE, HOSTILE

    from flakebot_magic.clients.kinds import KINDS

    add_row(KINDS)
    HOSTILE[StdioJsonTool.kind] = HOSTILE_PROGRAM
    CHILD_PRELUDE[StdioJsonTool.kind] = child_prelude()
