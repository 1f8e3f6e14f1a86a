"""The conversation with one deployed MCP server over stdio: which revision it speaks, one request at a time.

:class:`McpSession` starts the server and learns its era the way the
revision 2026-07-28 tells a client that speaks both (basic/transports/stdio,
"Backward Compatibility"): it probes with ``server/discover`` at 2026-07-28.

* A discover result naming 2026-07-28: the server is **modern**. There is no
  handshake; every request carries the envelope in ``params._meta``
  (protocol version, ``clientInfo``, ``clientCapabilities``: flakebot's client
  offers none, so a server must not ask it for sampling, elicitation or roots).
* An unsupported-version error (``-32022``) naming only revisions flakebot
  does not speak: a :class:`~flakebot_magic.errors.ToolError` that names them.
* Anything else (``-32601``, another error, a result that is no discover
  result, no answer within half the start's time, the server exiting): the
  server is **legacy**, and the ``initialize`` handshake follows (offering
  2025-11-25; any handshake revision it answers is accepted). An
  ``initialize`` refused with ``-32022`` naming 2026-07-28 sends the client
  back to the modern era once (a modern server that was slow to answer the
  probe).

The era is kept for the life of the session: a restart of the same server
skips the probe. ``revision`` says which one (``2026-07-28``, ``2025-06-18``).

A call's ``timeout`` bounds the whole call from the moment it is made: the wait
for earlier calls to the same server (one request at a time), a start or
restart, and the answer (one :class:`~flakebot_magic.host.deadline.Deadline`, made when the call is made;
a start within a call ends by the call's deadline or its ``ready_timeout``, whichever comes first, and the error
names the one). A server given up on (no answer in time, a start that failed) is killed at once, with whatever
holds its output, never given a grace the call would pay for; the next call starts a fresh one. A call that timed out
while still waiting its turn was never sent and stops nothing. A message from
the server is read in chunks and may be at most :data:`MAX_MESSAGE_BYTES` long. What flakebot writes to the
server (a request, an answer to the server's own request) is written within the call's time too: a server that
never reads its stdin is stopped when the call's time runs out, never waited on past it. While it answers one
call a server may send at most :data:`MAX_SERVER_REQUESTS` requests of its own (issue 33: a server flooding
``ping`` and reading nothing held a call with ``timeout=5`` for good).
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from ..errors import ToolError
from ..host.deadline import Deadline
from ..host.fsutil import load_json
from ..host.writes import WriteTimeout, write_within
from .base import TOOL_TIMEOUT
from .lifecycle import LogBuffer, ToolProcess
from .revisions import (
    CLIENT_CAPABILITIES_KEY,
    CLIENT_INFO_KEY,
    HANDSHAKE_VERSIONS,
    LATEST_HANDSHAKE,
    LATEST_MODERN,
    MODERN_VERSIONS,
    PROTOCOL_VERSION_KEY,
    SERVER_INFO_KEY,
    UNSUPPORTED_VERSION,
)
from .schema import nonfinite

__all__ = ["MAX_MESSAGE_BYTES", "MAX_SERVER_REQUESTS", "PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "Launch", "McpSession"]

#: the revision flakebot offers in ``initialize`` (the legacy era's newest)
PROTOCOL_VERSION = LATEST_HANDSHAKE
#: revisions flakebot speaks with a server (all use the same tool calls)
SUPPORTED_VERSIONS = (*HANDSHAKE_VERSIONS, *MODERN_VERSIONS)
#: the longest JSON-RPC message (one line) read from a server
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
#: the most requests of its own (ping, sampling, ...) a server may send while it answers one call
MAX_SERVER_REQUESTS = 100
#: who flakebot's client says it is
CLIENT_INFO = {"name": "flakebot-magic", "version": __version__}

#: what a session starts: (argv, environment, working directory, called after the process stopped)
Launch = tuple[list[str], Mapping[str, str], "Path | None", "Callable[[], None] | None"]


class _Refused(Exception):
    """The server answered a request with a JSON-RPC error (during the start, where it decides the era)."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        super().__init__(str(error.get("message", "")))
        self.code = error.get("code")
        self.data = error.get("data")


class _Exited(ToolError):
    """The server exited (while answering, or before a request reached it)."""


class _Silent(Exception):
    """No answer within the time a start step had (the probe's: a legacy server may ignore it)."""


def _json_error(message: Mapping[str, Any]) -> Mapping[str, Any]:
    error = message.get("error")
    return error if isinstance(error, Mapping) else {}


class McpSession:
    """A running MCP server and the JSON-RPC conversation with it (one request at a time).

    Parameters
    ----------
    argv, env
        How to start the server.
    name
        The tool's name, for messages.
    logs
        Where the server's stderr (and stray stdout) goes.
    ready_timeout
        Seconds allowed for a start: the probe and, for a legacy server, the handshake.
    launch
        Called at each start instead of using ``argv`` and ``env``: the
        command, environment, working directory and a clean-up to run after
        the process stopped (a confined start's scratch dir).
    max_message
        The longest message (bytes) read from the server.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str],
        name: str,
        logs: LogBuffer,
        ready_timeout: float = 10.0,
        launch: Callable[[], Launch] | None = None,
        max_message: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.argv = argv
        self.env = dict(env)
        self.launch = launch
        self.max_message = max_message
        self._cleanup: Callable[[], None] | None = None
        self.name = name
        self.logs = logs
        self.ready_timeout = ready_timeout
        self.process: ToolProcess | None = None
        #: what the server said of itself: ``protocolVersion``, ``capabilities``, ``serverInfo``, ``instructions``
        #: (the ``initialize`` result, or the same keys read from a ``server/discover`` result)
        self.server: dict[str, Any] = {}
        #: the revision spoken with the server ("" before its first start); kept across restarts
        self.revision = ""
        self.restarts = 0
        #: called after the server was started again by a request
        self.on_restart: Callable[[], None] | None = None
        self._lock = threading.RLock()
        #: the deadline of the call (or start) holding the lock: every wait of it, a stop included, ends by it
        self._deadline: Deadline | None = None
        self._buffer = bytearray()
        self._next_id = 0

    # -- process ---------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.alive and self.process is not None else None

    @property
    def modern(self) -> bool:
        return self.revision in MODERN_VERSIONS

    def start(self) -> dict[str, Any]:
        """Start the server and learn its era (within ``ready_timeout``, or the time left to the call that
        starts it); what it said of itself."""
        deadline = Deadline.of_call(self.ready_timeout, "its ready_timeout")
        if not self._lock.acquire(timeout=deadline.left()):
            raise ToolError(
                f"{self.name}: the MCP server was not started: other calls held it past {deadline}.",
                stderr=self.logs.text(last=30),
            )
        try:
            self._deadline = deadline
            return self._start(deadline)
        finally:
            self._deadline = None
            self._lock.release()

    def _start(self, deadline: Deadline) -> dict[str, Any]:
        if self.alive:
            return self.server
        self._spawn()
        if self.modern:
            return self.server  # stateless: a modern server known from its first start needs no handshake
        try:
            if self.revision == "" and self._modern_start(deadline):
                return self.server
            self._legacy_start(deadline)
        except BaseException:
            self._give_up()  # at once: the call that started it pays for no grace
            raise
        return self.server

    def _spawn(self) -> None:
        if self.process is not None:
            self._stop_process(deadline=self._deadline)  # a dead one: reap it, close its pipes
        self._buffer = bytearray()
        argv, env, cwd, cleanup = self.launch() if self.launch else (self.argv, self.env, None, None)
        self._cleanup = cleanup
        self.process = ToolProcess(argv, env=env, logs=self.logs, stdio=True, cwd=cwd)
        try:
            self.process.start()
        except BaseException:
            self._stop_process()
            raise

    def _modern_start(self, deadline: Deadline) -> bool:
        """Probe with ``server/discover``; True when the server is modern (and now known as such)."""
        known = self.modern
        # a server not known to be modern gets half the start's time to answer: a legacy one may stay silent
        probe = deadline.at if known else time.monotonic() + deadline.left() / 2
        try:
            result = self._exchange("server/discover", self._stamp({}, LATEST_MODERN), probe, start=True)
        except _Refused as refused:
            if refused.code == UNSUPPORTED_VERSION:
                self._refuse_disjoint(refused.data)
            return False
        except _Silent:
            return False
        except _Exited:  # it exited on the probe: a fragile legacy server; start it again for the handshake
            self._spawn()
            return False
        versions = result.get("supportedVersions") if isinstance(result, Mapping) else None
        mutual = [v for v in MODERN_VERSIONS if isinstance(versions, list) and v in versions]
        if not mutual:
            return False  # no discover result, or one that names no modern revision: legacy
        meta = result.get("_meta") if isinstance(result.get("_meta"), Mapping) else {}
        self.revision = mutual[-1]
        self.server = {
            "protocolVersion": self.revision,
            "capabilities": result.get("capabilities") if isinstance(result.get("capabilities"), Mapping) else {},
            "serverInfo": meta.get(SERVER_INFO_KEY) if isinstance(meta.get(SERVER_INFO_KEY), Mapping) else {},
            "instructions": result.get("instructions") if isinstance(result.get("instructions"), str) else "",
        }
        return True

    def _refuse_disjoint(self, data: Any) -> None:
        """A ``-32022`` whose list shares no revision with flakebot's: a clear error (else the era is decided)."""
        supported = data.get("supported") if isinstance(data, Mapping) else None
        if isinstance(supported, list) and not any(v in SUPPORTED_VERSIONS for v in supported):
            names = ", ".join(str(v) for v in supported[:10])
            raise ToolError(
                f"{self.name}: the MCP server speaks only protocol revision(s) {names}; flakebot speaks "
                f"{', '.join(SUPPORTED_VERSIONS)}.",
                stderr=self.logs.text(last=30),
            )

    def _legacy_start(self, deadline: Deadline) -> None:
        params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
        try:
            result = self._exchange("initialize", params, deadline.at, start=True)
        except _Refused as refused:
            data = refused.data if isinstance(refused.data, Mapping) else {}
            modern = [v for v in MODERN_VERSIONS if v in (data.get("supported") or [])]
            if refused.code == UNSUPPORTED_VERSION and modern and self.revision == "":
                # a modern server the probe missed (slow to answer it): once more, modern, with the time left
                self.revision = modern[-1]
                if self._modern_start(deadline):
                    return
                self.revision = ""
            raise ToolError(
                f"{self.name}: the MCP server refused initialize: {refused} (JSON-RPC error {refused.code})",
                stderr=self.logs.text(last=30),
            ) from None
        except _Silent:
            raise ToolError(
                f"{self.name}: the MCP server answered neither server/discover nor initialize within {deadline} "
                "(the time its start had); it was stopped at once.",
                stderr=self.logs.text(last=30),
            ) from None
        version = result.get("protocolVersion") if isinstance(result, Mapping) else None
        if version not in HANDSHAKE_VERSIONS:
            raise ToolError(
                f"{self.name}: the MCP server answered initialize with protocol version {version!r}; "
                f"flakebot speaks {', '.join(SUPPORTED_VERSIONS)}.",
                stderr=self.logs.text(last=30),
            )
        self._notify("notifications/initialized", deadline=deadline.at)
        self.revision = str(version)
        self.server = dict(result)

    def stop(self) -> int | None:
        """Stop the server on purpose: the next call starts a new one, which is not a restart."""
        with self._lock:
            if self.process is None:
                return None
            try:
                return self._stop_process()
            finally:
                self.process = None

    def _give_up(self) -> None:
        """Stop a server that did not answer in time, or floods, or failed to start: at once (SIGKILL, and what
        holds its output; a hung one would sit on a SIGTERM for the whole grace), waiting no longer than the
        call's time (:class:`~flakebot_magic.host.deadline.Deadline`) holds."""
        if self.process is not None:
            try:
                self._stop_process(deadline=self._deadline or Deadline(0.0))
            finally:
                self.process = None

    def _stop_process(self, grace: float = 1.0, deadline: Deadline | None = None) -> int | None:
        assert self.process is not None
        try:
            return self.process.stop(grace=grace, deadline=deadline)
        finally:
            cleanup, self._cleanup = self._cleanup, None
            if cleanup is not None:
                cleanup()

    # -- the conversation --------------------------------------------------------

    def request(self, method: str, params: Mapping[str, Any] | None = None, timeout: float = TOOL_TIMEOUT) -> Any:
        """Send one request and wait for its answer, all within ``timeout`` seconds from now (the wait for earlier
        calls, a start or restart, the answer); start the server first when it is not running."""
        began = time.monotonic()
        call = Deadline.of_call(timeout)
        deadline, timeout = call.at, call.limit
        if not self._lock.acquire(timeout=call.left()):
            raise self._not_sent(method, timeout)
        try:
            self._deadline = call
            waited = time.monotonic() - began
            if call.expired:  # its turn came as its time ran out: nothing was sent, nothing is stopped
                raise self._not_sent(method, timeout)
            if not self.alive:
                if self.process is not None:
                    self.restarts += 1
                    self.logs.append(
                        f"flakebot: restarting {self.name} (it exited with status {self.process.returncode})\n"
                    )
                self._start(call.within(self.ready_timeout, "its ready_timeout"))
                if self.on_restart is not None:
                    self.on_restart()
            return self._request(method, params, deadline, timeout, waited)
        finally:
            self._deadline = None
            self._lock.release()

    def _not_sent(self, method: str, timeout: float) -> ToolError:
        return ToolError(
            f"{self.name}: {method} was not sent: it waited its whole {timeout:g} s timeout behind earlier calls to "
            "this server (it takes one request at a time). Pass a larger timeout=..., or make fewer calls at once.",
            stderr=self.logs.text(last=30),
        )

    def _stamp(self, params: Mapping[str, Any] | None, revision: str) -> dict[str, Any]:
        """``params`` with the modern envelope in ``_meta`` (what the caller put there kept)."""
        out = dict(params or {})
        meta = dict(out.get("_meta") or {})
        meta.update({PROTOCOL_VERSION_KEY: revision, CLIENT_INFO_KEY: CLIENT_INFO, CLIENT_CAPABILITIES_KEY: {}})
        out["_meta"] = meta
        return out

    def _send(self, message: Mapping[str, Any], deadline: float) -> None:
        """Write ``message`` by ``deadline``; a server that does not read it by then is stopped (ToolError)."""
        assert self.process is not None and self.process.proc is not None and self.process.proc.stdin is not None
        try:
            text = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except ValueError:  # NaN or an infinity: JSON has none, and the server could not parse it
            where = nonfinite(message.get("params")) or "a value"
            raise ValueError(
                f"{self.name}: {message.get('method')} not sent: {where} is NaN or infinite, "
                "which JSON cannot carry; pass a finite number"
            ) from None
        data = text.encode() + b"\n"
        try:
            write_within(self.process.proc.stdin.fileno(), data, deadline)
        except WriteTimeout:
            self._give_up()
            raise ToolError(
                f"{self.name}: the MCP server did not read what flakebot wrote to it (its stdin) within the call's "
                f"time ({message.get('method') or 'an answer to its own request'}), so it was stopped; the next call "
                "starts it again.",
                stderr=self.logs.text(last=30),
            ) from None

    def _notify(self, method: str, params: Mapping[str, Any] | None = None, *, deadline: float) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = dict(params)
        self._send(message, deadline)

    def _message(self, method: str, params: Mapping[str, Any] | None) -> tuple[int, dict[str, Any]]:
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if self.modern:
            message["params"] = self._stamp(params, self.revision)
        elif params is not None:
            message["params"] = dict(params)
        return self._next_id, message

    def _exchange(self, method: str, params: Mapping[str, Any] | None, deadline: float, *, start: bool) -> Any:
        """One request of a start: its result; ``_Refused`` for a JSON-RPC error, ``_Silent`` for no answer."""
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method, "params": dict(params or {})}
        try:
            self._send(message, deadline)
        except BrokenPipeError:
            return self._died(method, sent=False)
        return self._answer(ident, method, deadline, 0.0, start=start)

    def _request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        deadline: float,
        timeout: float,
        waited: float,
        *,
        retry: bool = True,
    ) -> Any:
        ident, message = self._message(method, params)
        try:
            try:
                self._send(message, deadline)
            except BrokenPipeError:
                if not retry:
                    return self._died(method, sent=False)
                # it died before the request reached it: nothing ran, so sending again is safe
                self._give_up()
                self.restarts += 1
                self._start((self._deadline or Deadline(0.0)).within(self.ready_timeout, "its ready_timeout"))
                return self._request(method, params, deadline, timeout, waited, retry=False)
            result = self._answer(ident, method, deadline, timeout, waited=waited)
        except KeyboardInterrupt:
            self.logs.append(f"flakebot: {method} interrupted; {self.name} stopped (the next call starts it again)\n")
            self.stop()
            raise
        return self._complete(method, result)

    def _complete(self, method: str, result: Any) -> Any:
        """A result as a value: ``resultType`` absent (legacy) or ``complete``; anything else is a ToolError."""
        if not isinstance(result, Mapping):
            return {}
        kind = result.get("resultType", "complete")
        if kind == "complete":
            return result
        if kind == "input_required":
            wanted = result.get("inputRequests")
            asks = (
                sorted({str(r.get("method")) for r in wanted.values() if isinstance(r, Mapping)})
                if isinstance(wanted, Mapping)
                else []
            )
            raise ToolError(
                f"{self.name}: {method} asked flakebot for more input ({', '.join(asks) or 'input requests'}); "
                "flakebot's client offers no sampling, elicitation or roots, so the call cannot go on.",
                stderr=self.logs.text(last=30),
            )
        raise ToolError(
            f"{self.name}: {method} answered with resultType {str(kind)[:100]!r}, which flakebot does not know.",
            stderr=self.logs.text(last=30),
        )

    def _answer(
        self, ident: int, method: str, deadline: float, timeout: float, *, waited: float = 0.0, start: bool = False
    ) -> Any:
        asked = 0  # the server's own requests while it answers this one
        while True:
            line = self._read_line(deadline, method, timeout, waited, start)
            if line is None:
                return self._died(method, sent=True)
            try:
                message = load_json(line)
            except ValueError:
                self.logs.append(f"stdout (not JSON-RPC): {line.decode('utf-8', 'replace')}\n")
                continue
            if not isinstance(message, dict):
                continue
            if "method" in message:
                asked += "id" in message
                if asked > MAX_SERVER_REQUESTS:
                    self._give_up()
                    raise ToolError(
                        f"{self.name}: the MCP server sent more than {MAX_SERVER_REQUESTS} requests of its own while "
                        f"answering {method}, so it was stopped; the next call starts it again.",
                        stderr=self.logs.text(last=30),
                    )
                self._from_server(message, deadline)
                continue
            if message.get("id") is None and "error" in message:
                # JSON-RPC: the server could not read a request (a parse error or an invalid request), so it
                # could not say which; the one waited for is the one it could not read
                error = _json_error(message)
                if start:
                    raise _Refused(error)
                raise ToolError(
                    f"{self.name}: the MCP server could not read the {method} request: "
                    f"{error.get('message', 'unknown error')} (JSON-RPC error {error.get('code')})",
                    stderr=self.logs.text(last=30),
                )
            if message.get("id") != ident:
                continue  # the answer to a request given up on earlier
            if "error" in message:
                error = _json_error(message)
                if start:
                    raise _Refused(error)
                raise ToolError(
                    f"{self.name}: {method} failed: {error.get('message', 'unknown error')} "
                    f"(JSON-RPC error {error.get('code')})",
                    stderr=self.logs.text(last=30),
                )
            return message.get("result", {})

    def _from_server(self, message: Mapping[str, Any], deadline: float) -> None:
        method = message.get("method")
        if "id" in message:  # a request from the server (legacy only): answer ping, decline the rest
            if method == "ping":
                self._send({"jsonrpc": "2.0", "id": message["id"], "result": {}}, deadline)
            else:
                unsupported = f"flakebot's client does not support {str(method)[:100]}"
                self._send(
                    {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": unsupported}},
                    deadline,
                )
        elif method == "notifications/message":
            params = message.get("params")
            params = params if isinstance(params, Mapping) else {}  # a server's message is data of any shape
            self.logs.append(f"{str(params.get('level', 'info'))[:20]}: {json.dumps(params.get('data'))[:4096]}\n")

    def _read_line(self, deadline: float, method: str, timeout: float, waited: float, start: bool) -> bytes | None:
        assert self.process is not None and self.process.proc is not None and self.process.proc.stdout is not None
        fd = self.process.proc.stdout.fileno()
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n")
            if end >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if line.strip():
                    return line
                continue
            if len(buffer) > self.max_message:
                size = len(buffer)
                self._give_up()
                raise ToolError(
                    f"{self.name}: the MCP server sent a message longer than {self.max_message // (1024 * 1024)} MiB "
                    f"(at least {size} bytes without a newline) while answering {method}; it was stopped and the "
                    "message dropped. The next call starts it again.",
                    stderr=self.logs.text(last=30),
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if start:
                    raise _Silent()
                self._give_up()
                behind = f" ({waited:.1f} s of it waiting behind earlier calls)" if waited >= 0.05 else ""
                raise ToolError(
                    f"{self.name}: {method} got no answer within {timeout:g} s{behind}, so the server was stopped; "
                    "the next call starts it again. Pass a larger timeout=... if the work is just slow.",
                    stderr=self.logs.text(last=30),
                )
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, min(1 << 16, self.max_message + 1 - len(buffer)))
            if not chunk:
                return None
            buffer += chunk

    def _died(self, method: str, *, sent: bool) -> Any:
        assert self.process is not None
        status = self._stop_process(grace=0.5, deadline=self._deadline)
        tail = self.logs.text(last=20)
        when = "while answering" if sent else "before receiving"
        raise _Exited(
            f"{self.name}: the MCP server exited (status {status}) {when} {method}; "
            f"the next call starts it again. Its last output:\n{tail.strip() or '(none)'}",
            returncode=status,
            stderr=tail,
        )
