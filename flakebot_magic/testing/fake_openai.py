"""A scripted OpenAI-compatible HTTP server on 127.0.0.1: a test double, not a language model.

``FakeOpenAIServer`` speaks the real chat-completions protocol over real HTTP
so the real ``openai`` client can be pointed at it, and replays a script
instead of thinking. Every reply names the model ``scripted-test-double``.

The script is ``{"responses": [...]}`` (or just the list). Each
chat-completions request consumes the next item, which is either an assistant
message in the OpenAI ``message`` shape::

    {"role": "assistant", "content": "hello"}
    {"role": "assistant", "content": null,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "run", "arguments": "{\\"x\\": 1}"}}]}

or a fault:

``{"fault": "status", "status": 429, "headers": {...}, "body": {...}}``
    Answer with that HTTP status, the given headers, and ``body`` (default: an
    OpenAI-shaped ``{"error": {...}}``).
``{"fault": "reset"}`` / ``{"fault": "reset", "after_chunks": N}``
    Close the TCP connection abruptly (RST) without an answer. A streaming
    request first receives the first ``N`` SSE chunks of ``message`` (an
    optional assistant message; a placeholder text by default).
``{"fault": "malformed"}``
    Answer 200 with a body that is not valid JSON (non-streaming) or an SSE
    chunk whose data is not valid JSON (streaming).
``{"fault": "flood", "interval": S}``
    A reply that never ends: a streaming request gets SSE chunks of text
    (``chunk_bytes`` each, default 65536) every ``S`` seconds (default 0), a
    non-streaming one an endless JSON body, until the client hangs up.
``{"fault": "stall", "seconds": N}``
    Sleep ``N`` seconds, then answer with the item *after* the stall. Both
    items are consumed when the request arrives, so a client that times out
    and retries gets the item after that pair, not the stalled answer. If no
    item follows, the stalled request gets the script-exhausted error.

Model dialects: a message with ``"dialect": "qwen"`` (or ``llama``, ``json``,
``mistral``; :mod:`flakebot_magic.llm.dialects`) has its ``tool_calls``
written into its content as a server without a tool parser passes them
(``"content"`` the prose before, ``"after"`` the prose after, ``"fence":
true`` for ```json blocks, ``"cut": N`` to stop the text after N characters),
and ``"finish_reason": "length"`` makes a reply end as one cut at the token
limit.

A response may also carry ``"delay": SECONDS`` (wait that long before
answering, as a model would think; other requests are served meanwhile and
``stop()`` does not wait for it) and, if it is a message, ``"usage":
{"prompt_tokens": P, "completion_tokens": C, "total_tokens": T,
"prompt_tokens_details": {"cached_tokens": K}}`` (``total_tokens`` defaults
to P + C), which becomes that completion's ``usage`` -- in a stream, the last
chunk (empty ``choices``) when the request asks for
``stream_options: {"include_usage": true}``. Without it the usage is a rough
estimate (four characters a token).

Routed scripts: a script may hold one queue per role and per candidate::

    {"roles": {"architect": {"responses": [...], "delay": 0.5}},
     "candidates": {"0": {"responses": [...]}, "1": [...]},
     "responses": [...],
     "delay": 1.5}

A request goes to the queue ``candidates.<i>`` if its header
``X-Flakebot-Candidate: <i>`` names one the script has, else to
``roles.<role>`` if its ``X-Flakebot-Role: <role>`` does, else to the default
queue ``responses``. Each queue is consumed in order, independently of the
others. A ``"delay"`` at the top applies to every reply, one on a queue to
that queue's replies, one on a response to that response: the most specific
wins. A delayed or stalled item is consumed when its request arrives.

When a queue runs out (or no queue claims a request), the request gets HTTP
500 naming the queue, with ``x-should-retry: false`` so the SDK fails at once
instead of retrying.

``GET /_requests`` returns every recorded request (not itself) as JSON:
``method``, ``path``, ``headers`` (lower-cased; ``Authorization`` redacted),
``body``, and ``queue`` (the queue that answered a chat-completions request,
e.g. ``"candidates.1"``; null otherwise). In Python, ``server.requests`` is the
chat-completions bodies, ``server.records`` the same requests' full records
(``records[i]["headers"]``, ``records[i]["queue"]``), and
``server.requests_for("roles.architect")`` the bodies one queue answered.
``GET /v1/models`` lists the scripted model.

Example
-------
>>> with FakeOpenAIServer([{"role": "assistant", "content": "hi"}]) as server:
...     client = openai.OpenAI(base_url=server.base_url, api_key="test")  # doctest: +SKIP

From a shell: ``python -m flakebot_magic.testing.fake_openai --script FILE``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import socketserver
import struct
import sys
import termios
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import urlsplit

from .openai_script import CANDIDATE_HEADER, ROLE_HEADER, LoadedScript, Queue, Script, Taken, load_script
from .openai_wire import LABEL, MODEL_NAME, completion, deltas, error_body, finish_reason, usage

__all__ = ["LABEL", "MODEL_NAME", "FakeOpenAIServer", "Script", "load_script", "main"]

_HOST = "127.0.0.1"


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # stop() shuts connections down and joins handlers itself

    def __init__(self, fake: FakeOpenAIServer, port: int) -> None:
        self.fake = fake
        super().__init__((_HOST, port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves an FQDN, a DNS lookup a loopback server never needs.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = _HOST, self.server_address[1]

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):  # the client went away: expected in fault tests
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-openai-test-double/1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.fake._connection_opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.fake._connection_closed(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read /_requests; a line per request on stderr is noise

    # -- routing -----------------------------------------------------------

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/_requests":
            self._send_json(200, self.server.fake.recorded)
            return
        self.server.fake._record(self._record_of(None))
        if path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [self._model()]})
        elif path == f"/v1/models/{MODEL_NAME}":
            self._send_json(200, self._model())
        else:
            self._not_found(path)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
            self.server.fake._record(self._record_of(raw.decode("utf-8", "replace")))
            self._send_json(400, error_body("request body is not JSON", "invalid_request_error"))
            return
        record = self._record_of(body)
        queue = None
        if path == "/v1/chat/completions":
            queue = self.server.fake.script.route(record["headers"])
            record["queue"] = queue.name if queue is not None else None
        self.server.fake._record(record)
        if path != "/v1/chat/completions":
            self._not_found(path)
        elif not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._send_json(400, error_body('the body needs "messages": [...]', "invalid_request_error"))
        else:
            self._chat_completion(body, queue, record["headers"])

    # -- chat completions --------------------------------------------------

    def _chat_completion(self, request: dict[str, Any], queue: Queue | None, headers: Mapping[str, str]) -> None:
        fake = self.server.fake
        number = fake._next_number()
        taken = queue.take() if queue is not None else None
        if taken is not None and taken.wait and fake._stopping.wait(taken.wait):
            self.close_connection = True  # stopping: a delayed answer is never sent
            return
        stream = bool(request.get("stream"))
        try:
            if taken is None or taken.item is None:
                self._send_json(
                    500,
                    error_body(self._no_answer(number, taken, headers), "server_error", "script_exhausted"),
                    {"x-should-retry": "false"},
                )
                return
            scripted = taken.item
            item = scripted.body
            if item.get("fault") == "status":
                body = item.get("body") or error_body(
                    f"scripted HTTP {item['status']} from fake-openai (a scripted test double)",
                    "rate_limit_error" if item["status"] == 429 else "server_error",
                )
                self._send_json(item["status"], body, item.get("headers") or {})
            elif item.get("fault") == "reset":
                if stream:
                    self._stream(request, number, item["message"], limit=item.get("after_chunks", 0))
                self._reset()
            elif item.get("fault") == "malformed":
                self._malformed(stream)
            elif item.get("fault") == "flood":
                self._flood(number, stream, int(item.get("chunk_bytes", 65536)), float(item.get("interval", 0)))
            elif stream:
                self._stream(request, number, item, scripted_usage=scripted.usage, finish=scripted.finish)
            else:
                self._send_json(200, completion(request, number, item, scripted.usage, scripted.finish))
        except OSError:  # the client hung up (timed out) before the answer went out
            self.close_connection = True

    def _no_answer(self, number: int, taken: Taken | None, headers: Mapping[str, str]) -> str:
        where = "fake-openai (a scripted test double)"
        if taken is None:
            role = headers.get(ROLE_HEADER)
            candidate = headers.get(CANDIDATE_HEADER)
            queues = ", ".join(self.server.fake.script.queues) or "none"
            return (
                f"{where}: no queue answers chat-completions request {number} (X-Flakebot-Role {role!r}, "
                f'X-Flakebot-Candidate {candidate!r}) and the script has no default "responses" queue '
                f"(its queues: {queues})"
            )
        return (
            f"{where}: the script ran out: queue {taken.queue!r} has only {taken.size} items and this is its "
            f"request {taken.number} (chat-completions request {number} overall)"
        )

    def _stream(
        self,
        request: Mapping[str, Any],
        number: int,
        message: Mapping[str, Any],
        limit: int | None = None,
        scripted_usage: Mapping[str, Any] | None = None,
        finish: str | None = None,
    ) -> None:
        options = request.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        created = int(time.time())

        def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> dict[str, Any]:
            data: dict[str, Any] = {
                "id": f"chatcmpl-testdouble-{number}",
                "object": "chat.completion.chunk",
                "created": created,
                "model": MODEL_NAME,
                "system_fingerprint": None,
                "choices": []
                if delta is None
                else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if include_usage:
                data["usage"] = None
            return data

        self._start_stream()
        sent = 0
        for delta in deltas(message):
            if limit is not None and sent >= limit:
                return
            self._send_event(chunk(delta))
            sent += 1
        if limit is not None:  # a reset after more chunks than the message has
            return
        self._send_event(chunk({}, finish_reason(message, finish)))
        if include_usage:
            final = chunk(None)
            final["usage"] = dict(scripted_usage) if scripted_usage is not None else usage(request, message)
            self._send_event(final)
        self._send_chunk(b"data: [DONE]\n\n")
        self._send_chunk(b"")

    def _flood(self, number: int, stream: bool, size: int, interval: float) -> None:
        self._start_stream()
        if not stream:
            self._send_chunk(b'{"id": "chatcmpl-testdouble-flood", "choices": [{"index": 0, "message": {"content": "')
        text = "x" * max(1, size)
        while not self.server.fake._stopping.wait(interval):  # ends when the client hangs up (OSError)
            if stream:
                delta = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
                self._send_event(
                    {
                        "id": f"chatcmpl-testdouble-{number}",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": MODEL_NAME,
                        "choices": [delta],
                    }
                )
            else:
                self._send_chunk(text.encode())
        self.close_connection = True

    def _malformed(self, stream: bool) -> None:
        if stream:
            self._start_stream()
            self._send_chunk(b'data: {"id": "chatcmpl-testdouble-malformed", "choices": [\n\n')
            self._send_chunk(b"data: [DONE]\n\n")
            self._send_chunk(b"")
        else:
            body = b'{"id": "chatcmpl-testdouble-malformed", "object": "chat.completion", "choices": ['
            self._send_raw(200, body, {"Content-Type": "application/json"})

    def _reset(self) -> None:
        # What was sent must reach the client before the reset (a busy machine may not have sent it
        # yet): wait, briefly, until the peer has acknowledged every byte (SIOCOUTQ is 0).
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                unsent = struct.unpack("i", fcntl.ioctl(self.connection.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
            except OSError:
                break
            if unsent == 0:
                break
            time.sleep(0.005)
        # SO_LINGER 0 makes close() send RST: the client sees a reset, not a clean FIN.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()  # the socket only really closes once its file objects have
        self.connection.close()
        self.close_connection = True

    # -- wire --------------------------------------------------------------

    def _model(self) -> dict[str, Any]:
        return {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "flakebot-magic test double"}

    def _not_found(self, path: str) -> None:
        message = f"fake-openai (a scripted test double) has no route {path!r}"
        self._send_json(404, error_body(message, "invalid_request_error"))

    def _record_of(self, body: object) -> dict[str, Any]:
        headers = {key.lower(): value for key, value in self.headers.items()}
        if "authorization" in headers:  # never keep a key, even a test one, in failure output
            headers["authorization"] = headers["authorization"].split(" ")[0] + " <redacted>"
        return {"method": self.command, "path": self.path, "headers": headers, "body": body, "queue": None}

    def _send_json(self, status: int, body: object, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self._send_raw(status, data, {"Content-Type": "application/json", **(headers or {})})

    def _send_raw(self, status: int, data: bytes, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, str(value))
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-fake-openai", LABEL)
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-fake-openai", LABEL)
        self.end_headers()

    def _send_event(self, data: Mapping[str, Any]) -> None:
        self._send_chunk(b"data: " + json.dumps(data).encode() + b"\n\n")

    def _send_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


class FakeOpenAIServer:
    """A scripted OpenAI-compatible server on 127.0.0.1 (a test double, not a model).

    Parameters
    ----------
    script
        ``{"responses": [...]}``, the bare list, or a JSON file holding either
        (see the module docstring for the item shapes).
    host
        Must be ``"127.0.0.1"`` (or ``"localhost"``): the double never listens
        beyond loopback.
    port
        ``0`` picks a free port.

    Examples
    --------
    >>> with FakeOpenAIServer([{"role": "assistant", "content": "hi"}]) as server:
    ...     server.base_url  # doctest: +ELLIPSIS
    'http://127.0.0.1:.../v1'
    """

    def __init__(self, script: Script, host: str = _HOST, port: int = 0) -> None:
        if host not in (_HOST, "localhost"):
            raise ValueError(f"fake-openai only listens on {_HOST}, not {host!r}")
        self.source = str(script) if isinstance(script, (str, os.PathLike)) else "an inline script"
        self.script: LoadedScript = load_script(script)
        self.port = port
        self._count = 0
        self._recorded: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._base_url: str | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self, *, announce: bool = True) -> str:
        """Start serving in a background thread; return the base URL (ending in ``/v1``).

        With ``announce`` the label line goes to stderr, so a failing test's
        captured output says a test double was answering.
        """
        if self._httpd is not None:
            raise RuntimeError("this FakeOpenAIServer is already started")
        self._httpd = _HTTPServer(self, self.port)
        self.port = self._httpd.server_address[1]
        self._base_url = f"http://{_HOST}:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )
        self._thread.start()
        if announce:
            print(self.label, file=sys.stderr, flush=True)
        return self._base_url

    def stop(self) -> None:
        """Stop serving, drop open connections, and wait for handlers to finish."""
        if self._httpd is None:
            return
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            open_connections = list(self._connections.items())
        for connection, _ in open_connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked on a keep-alive read
            except OSError:
                pass
        for _, thread in open_connections:
            thread.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what tests look at ------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, for ``openai.OpenAI(base_url=...)``."""
        if self._base_url is None:
            raise RuntimeError("start the FakeOpenAIServer before asking for its base_url")
        return self._base_url

    @property
    def label(self) -> str:
        """The line that says what this server is (printed at startup)."""
        where = self._base_url or "(not started)"
        queues = len(self.script.queues)
        spread = f" in {queues} queues" if queues > 1 else ""
        return f"fake-openai: {LABEL} replaying {len(self.script)} responses{spread} from {self.source} at {where}"

    @property
    def recorded(self) -> list[dict[str, Any]]:
        """Every request received (method, path, headers, parsed JSON body), oldest first."""
        with self._lock:
            return [dict(record) for record in self._recorded]

    @property
    def records(self) -> list[dict[str, Any]]:
        """The chat-completions requests' records (``method``, ``path``, ``headers``, ``body``, ``queue``), oldest first.

        ``records[i]`` is the request whose body is ``requests[i]``;
        ``records[i]["queue"]`` names the queue that answered it
        (``"responses"``, ``"roles.architect"``, ``"candidates.0"``; None when
        no queue claimed it).
        """
        return [r for r in self.recorded if r["path"].split("?")[0].rstrip("/") == "/v1/chat/completions"]

    @property
    def requests(self) -> list[Any]:
        """The parsed JSON bodies of the chat-completions requests received, oldest first."""
        return [r["body"] for r in self.records]

    def requests_for(self, queue: str) -> list[Any]:
        """The bodies of the chat-completions requests the queue named ``queue`` answered, oldest first."""
        if queue not in self.script.queues:
            raise ValueError(f"this script has no queue {queue!r}; it has {', '.join(self.script.queues)}")
        return [r["body"] for r in self.records if r["queue"] == queue]

    @property
    def remaining(self) -> int:
        """How many script items, over all queues, have not been consumed yet."""
        return self.script.remaining

    def __repr__(self) -> str:
        return f"<FakeOpenAIServer {LABEL}: {self.remaining}/{len(self.script)} left at {self._base_url}>"

    # -- called from handler threads ---------------------------------------

    def _next_number(self) -> int:
        """Count a chat-completions request; return its number (1 for the first), used in reply ids."""
        with self._lock:
            self._count += 1
            return self._count

    def _record(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._recorded.append(record)

    def _connection_opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections[connection] = threading.current_thread()

    def _connection_closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.pop(connection, None)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a script until SIGINT or SIGTERM.

    Prints the label line, then the base URL on a line of its own.
    """
    parser = argparse.ArgumentParser(
        prog="python -m flakebot_magic.testing.fake_openai",
        description=f"A {LABEL}: an OpenAI-compatible server on {_HOST} that replays a script.",
    )
    parser.add_argument(
        "--script",
        required=True,
        type=Path,
        help='JSON file: {"responses": [...]} or a routed script (see the module docstring)',
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    args = parser.parse_args(argv)
    try:
        server = FakeOpenAIServer(args.script, port=args.port)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    url = server.start(announce=False)
    print(server.label, flush=True)
    print(url, flush=True)
    try:
        while not done.wait(0.2):  # a timed wait lets the signal handler run promptly
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
