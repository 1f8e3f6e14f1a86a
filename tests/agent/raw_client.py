"""A raw JSON-RPC client of one ``flakebot mcp`` process over stdio, for tests that name each message."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["FLAKEBOT", "Client"]

#: the ``flakebot`` command of this interpreter
FLAKEBOT = Path(sys.executable).parent / "flakebot"


class Client:
    """A JSON-RPC client of one ``flakebot mcp`` process; keeps every notification it reads.

    A thread reads the server's stdout line by line into a queue. (Waiting with
    ``select`` on the pipe and then ``readline`` loses messages: when two
    arrive together, as ``list_changed`` and a build's answer do, the second
    sits in the reader's buffer while ``select`` waits on the empty pipe.)
    """

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(FLAKEBOT), "mcp", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.notes: list[dict[str, Any]] = []
        self.ident = 0
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.reader = threading.Thread(target=self._read_all, daemon=True)
        self.reader.start()

    def _read_all(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            self.lines.put(line)
        self.lines.put(b"")  # end of output

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 120.0) -> dict[str, Any] | None:
        """The next message within ``timeout`` seconds (None: none came, or the server exited)."""
        try:
            line = self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if not line:
            self.lines.put(b"")  # every later read sees the end too
            return None
        message: dict[str, Any] = json.loads(line)
        return message

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 120.0) -> dict[str, Any]:
        self.ident += 1
        self.send({"id": self.ident, "method": method, **({"params": params} if params is not None else {})})
        deadline = time.monotonic() + timeout
        while True:
            message = self.read(deadline - time.monotonic())
            assert message is not None, f"no answer to {method} within {timeout} s (or the server exited)"
            if message.get("id") == self.ident:
                return message
            self.notes.append(message)

    def initialize(self, name: str = "raw-client") -> dict[str, Any]:
        answer = self.request(
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": name, "version": "0"}},
        )
        self.send({"method": "notifications/initialized"})
        return answer

    def call(self, name: str, arguments: dict[str, Any], **params: Any) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": arguments, **params})

    def names(self) -> set[str]:
        return {t["name"] for t in self.request("tools/list")["result"]["tools"]}

    def close(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(60)
        finally:
            self.reader.join(10)
            self.proc.stdout.close()
