"""A test-only tool kind, ``json-call``: a program run once per call, its arguments one JSON object on standard
input, its answer one JSON value on standard output. It runs only while it is called: nothing starts it at a build
or a ``load``, ``stop`` has nothing to stop, and it has no process between calls.

Written as docs/ARCHITECTURE.md's "Adding a tool kind" says: this module (the client, whose class attributes are
the row) and one row in :data:`flakebot_magic.clients.kinds.KINDS`, which the tests add with
:func:`add_row` (a real kind writes it in the table itself).
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from flakebot_magic.clients.agents import ToolFunction
from flakebot_magic.clients.base import ToolClient
from flakebot_magic.clients.confine import Confinement
from flakebot_magic.errors import ToolError
from flakebot_magic.host.exchange import OUTPUT_BYTES, STDERR_BYTES, Exchange, stop_group
from flakebot_magic.host.fsutil import load_json
from flakebot_magic.host.process import spawn, start_call

__all__ = ["JsonCallTool", "add_row"]


class JsonCallTool(ToolClient):
    """A ``json-call`` tool: ``tool(**arguments)`` runs the binary once and returns its JSON answer."""

    kind = "json-call"
    server = False
    noun, a_noun = "JSON program", "a JSON program"
    asked_by = re.compile(r"\bjson program\b", re.I)
    contract_text = (
        "A json-call tool reads one JSON object (its arguments) on standard input and prints one JSON value "
        "on standard output, then exits."
    )

    def __call__(self, **arguments: Any) -> Any:
        self.require_binary()  # says how to get a damaged or missing binary back
        argv = [str(self.binary)]
        confinement = Confinement(self.binary, self.store_path) if self.confined_now else None
        try:
            if confinement is not None:  # in the sandbox (spawn): its scratch dir, the sandbox's environment
                proc: Any = spawn(
                    confinement.command(argv, self.timeout),
                    stdin=True,
                    cwd=confinement.scratch,
                    env=confinement.env(self.env),
                )
            else:  # as the user, with the allowlisted environment: start_call, cheap per call
                proc = start_call(argv, env=self._environment())
            exchange = Exchange(proc, stdout_cap=OUTPUT_BYTES, stderr_cap=STDERR_BYTES)
            try:
                out, err = exchange.run(json.dumps(arguments).encode(), self.timeout)  # the time limit, read now
            except subprocess.TimeoutExpired:
                stop_group(proc)
                exchange.close()
                raise ToolError(f"{self.name} ran past its time limit of {self.timeout:g} s", returncode=None) from None
            except BaseException:  # KeyboardInterrupt: the tool stops with the call
                stop_group(proc)
                exchange.close()
                raise
        finally:
            if confinement is not None:
                confinement.close()
        if exchange.overflow:
            raise ToolError(f"{self.name} wrote more than its output cap; the answer was dropped", returncode=None)
        if proc.returncode:
            text = err.decode("utf-8", "replace")
            raise ToolError(f"{self.name} exited with status {proc.returncode}: {text}", returncode=proc.returncode)
        return load_json(out)

    def functions(self) -> dict[str, ToolFunction]:
        return {
            self.name: ToolFunction(
                name=self.name,
                description=f"Run {self.crate} once with these arguments; returns its JSON answer.",
                parameters={"type": "object", "properties": {}},
                # free-form arguments: every door passes the model's object on whole (docs/tool-contract.md)
                open_arguments=True,
                function=self,
                example=f"{self.name}()",
                wire=lambda arguments: self(**arguments),
            )
        }


def add_row(kinds: dict[str, type[ToolClient]]) -> None:
    """The one row: ``kinds`` (the table) gets this kind."""
    kinds[JsonCallTool.kind] = JsonCallTool
