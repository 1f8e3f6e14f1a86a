"""``flakebot mcp`` over stdio: newline-delimited JSON-RPC on stdin and stdout, and the inventory watcher.

Only JSON-RPC messages go to stdout: while the server runs, anything else
that would print there (a stray ``print``) goes to stderr. The watcher
notices tools built elsewhere (a notebook, the command) by polling the
inventory file's size and time every :data:`POLL_SECONDS`, and tells each
session whose tool list changed.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable
from contextlib import redirect_stdout
from typing import IO, Any

from ..clients.jsonrpc import serve_lines
from ..config import Settings
from ..host.writes import PEER_SECONDS, PeerStream
from ..request import RunFlags
from ..untrusted import safe_text
from .catalog import ToolCatalog
from .functions import BUILTIN_NAMES
from .mcp import ServerSession

__all__ = ["POLL_SECONDS", "InventoryWatcher", "StreamWriter", "serve_stdio"]

#: how often the inventory file is checked for tools built elsewhere
POLL_SECONDS = 0.05


class StreamWriter:
    """Writes one JSON-RPC message per line; one writer at a time (builds send from their threads).

    Each write ends within :data:`~flakebot_magic.host.writes.PEER_SECONDS`: an agent that stops reading is
    taken as gone (``BrokenPipeError``), so a build's progress never waits on it while holding its tool's lock.
    """

    def __init__(self, stream: IO[bytes], seconds: float = PEER_SECONDS) -> None:
        self.stream = PeerStream(stream, seconds)

    def __call__(self, message: dict[str, Any]) -> None:
        self.stream.write(json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")


class InventoryWatcher:
    """Polls the tool inventory; calls ``on_change(signature)`` when the tools (names, store entries) change."""

    def __init__(
        self,
        catalog: ToolCatalog,
        sessions: Callable[[], Iterable[ServerSession]],
        *,
        interval: float = POLL_SECONDS,
    ) -> None:
        self.catalog = catalog
        self.sessions = sessions
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="flakebot-mcp-watcher", daemon=True)

    def start(self) -> InventoryWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _main(self) -> None:
        stamp = self.catalog.stamp()
        while not self._stop.wait(self.interval):
            now = self.catalog.stamp()
            if now == stamp:
                continue
            stamp = now
            try:
                signature = self.catalog.signature()
            except Exception as exc:  # an inventory being rewritten: try again at the next change
                print(safe_text(f"flakebot: could not read the tool inventory: {exc}"), file=sys.stderr)
                continue
            for session in list(self.sessions()):
                session.tools_changed(signature)


def serve_stdio(
    settings: Settings,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
    *,
    flags: RunFlags | None = None,
) -> int:
    """Serve one MCP session on ``stdin``/``stdout`` until stdin closes; running builds are then cancelled."""
    stdin = stdin or sys.stdin.buffer
    out = StreamWriter(stdout or sys.stdout.buffer)
    catalog = ToolCatalog(settings, reserved=BUILTIN_NAMES)
    session = ServerSession(settings, catalog, notify=out, flags=flags)
    watcher = InventoryWatcher(catalog, lambda: [session]).start()
    try:
        with redirect_stdout(sys.stderr):  # stdout carries JSON-RPC only
            # batches: flakebot mcp speaks 2025-03-26 too, which has them
            serve_lines(stdin, out, lambda message: session.handle(message, out), batches=True)
    finally:
        watcher.stop()
        session.close()
        catalog.close()
    return 0
