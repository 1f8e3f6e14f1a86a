"""The one channel to a model: every request flakebot sends (engineer, architect, crate choice) goes through here.

A :class:`ModelChannel` is one actor's conversation with one model, and the
only code that builds an ``openai`` client or sends a chat request (a test
reads the package to hold it so). Whatever its role, every request

* names its role (``X-Flakebot-Role``) and, in a race, its candidate
  (``X-Flakebot-Candidate``);
* asks the run's shared :class:`~flakebot_magic.llm.budget.Budget` first: a
  spent token budget, or a prompt that could take the cost past
  ``max_cost``, stops it before it is sent;
* is read within the reply caps (:mod:`.reply`); an unusable reply is
  discarded whole and asked again, up to :data:`MAX_STREAM_RETRIES` times,
  then :class:`~flakebot_magic.errors.ModelError`;
* can be cut from any thread (:meth:`ModelChannel.stop`, or the run's cancel
  token): the socket in flight is shut down (:mod:`.http`), and no retry
  follows;
* is charged to the budget as its reply arrives, and counted in a
  :class:`~flakebot_magic.events.ModelUsage` event (running totals after each
  reply, the last word once when the channel closes);
* has its function calls read from its text when the server passed them
  through as text (:mod:`.dialects`): each recovered call gets an id
  ``call_text_*``, the reply names its ``dialect``, and the log says so; a
  text that holds calls that cannot be read whole becomes a ``refusal`` (the
  answer to the model; none of its calls runs). ``--tool-format`` says how
  the functions are offered: ``native`` (the API's ``tools``), ``text`` (in
  the system prompt, one strict form; no ``tools`` sent), ``auto`` (native
  until a reply writes its calls as text, or the endpoint refuses ``tools``;
  then text).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..events import EventBus, ModelUsage
from ..host.fsutil import load_json
from ..host.process import CancelToken
from .budget import Budget
from .dialects import TextCallRefused, as_text_conversation, read_calls
from .http import ModelHTTP
from .limits import ReplyLimits
from .model import ModelConfig
from .reply import BrokenReply, Reply, ReplyReader, function_call
from .usage import Usage, estimate_tokens

__all__ = ["MAX_STREAM_RETRIES", "ModelChannel"]

#: unusable replies asked again before the request fails
MAX_STREAM_RETRIES = 3


class ModelChannel:
    """One actor's conversation with ``model``: requests within the caps and the budget, cancellable, counted.

    Parameters
    ----------
    model
        The endpoint and model (its name is sent; ``stream`` is honoured).
    role
        Who asks: ``engineer``, ``architect``, ``chooser`` (the header, the usage events).
    bus
        Receives a notice for each unusable reply (in ``stage``'s row) and the usage events.
    budget
        The run's budget, shared by every channel of the run.
    limits
        The caps on each reply.
    candidate
        The candidate's index in a race (``--candidates``), else None.
    sampling
        ``temperature`` and ``seed``: what makes one candidate differ from another.
    tools, tool_choice
        The functions the model may call, and which one it must.
    cancel
        The run's cancel token: setting it cuts the request in flight.
    workspace
        Named in the errors raised.
    """

    def __init__(
        self,
        model: ModelConfig,
        *,
        role: str,
        bus: EventBus,
        budget: Budget,
        limits: ReplyLimits,
        stage: str = "edit",
        candidate: int | None = None,
        sampling: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: dict[str, Any] | None = None,
        cancel: CancelToken | None = None,
        workspace: Path | None = None,
    ) -> None:
        self.model = model
        self.role = role
        self.bus = bus
        self.budget = budget
        self.limits = limits
        self.stage = stage
        self.candidate = candidate
        self.cancel = cancel
        self.workspace = workspace
        self.headers = {"X-Flakebot-Role": role}
        if candidate is not None:
            self.headers["X-Flakebot-Candidate"] = str(candidate)
        self.options: dict[str, Any] = {
            **({"tools": tools} if tools else {}),
            **({"tool_choice": tool_choice} if tool_choice else {}),
            **(sampling or {}),
        }
        #: the functions are described in the system prompt and read from the text (no ``tools`` sent)
        self.text_protocol = model.tool_format == "text"
        self.http = ModelHTTP(timeout=model.timeout)
        self._client: Any = None
        #: prompt, completion and cached tokens of the replies so far (an unusable reply read to its end too)
        self.spent = Usage()
        #: tokens counted (estimated where a reply reported none) and requests sent (an unusable reply's too)
        self.tokens = 0
        self.calls = 0
        self._closed = False

    @property
    def client(self) -> Any:
        """The ``openai.OpenAI`` client on this channel's connection (made at the first request)."""
        if self._client is None:
            self._client = self.model.client(http_client=self.http.client)
        return self._client

    # -- requests ---------------------------------------------------------------------

    def complete(self, messages: list[dict[str, Any]]) -> Reply:
        """The model's next usable reply to ``messages`` (the budget asked before each request, charged after)."""
        problem = ""
        for _ in range(MAX_STREAM_RETRIES + 1):
            self.budget.check(self.model.model, next_prompt_tokens=estimate_tokens(messages))
            self.http.check()
            self.calls += 1
            try:
                with self._watching():
                    reply = self._request(messages)
            except BrokenReply as exc:
                if exc.usage is not None:
                    self._charge(exc.usage, exc.usage.tokens)
                problem = str(exc)
                self.bus.notice(
                    self.stage,
                    f"the model's reply was unusable ({problem}); nothing was applied, asking again",
                    "warning",
                )
                continue
            self._charge(reply.usage, reply.tokens)
            return self._calls_from_text(reply)
        raise ModelError(
            f"The model {self.model.describe()} sent {MAX_STREAM_RETRIES + 1} unusable replies in a row "
            f"(the last: {problem}). Nothing from them was applied. Try again, or another model.",
            workspace=self.workspace,
        )

    def _request(self, messages: list[dict[str, Any]]) -> Reply:
        import openai  # lazy: importing flakebot_magic stays cheap

        reader = ReplyReader(self.limits, estimate_tokens(messages))
        messages = encodable(messages)
        options = dict(self.options)
        tools = options.get("tools")
        if tools and self.text_protocol:
            messages = as_text_conversation(messages, tools, options.pop("tool_choice", None))
            del options["tools"]
        kwargs: dict[str, Any] = {
            "model": self.model.model,
            "messages": messages,
            **options,
            "extra_headers": self.headers,
        }
        completions = self.client.chat.completions
        try:
            if self.model.stream:
                return reader.stream(completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
            with completions.with_streaming_response.create(**kwargs) as response:  # read in bounded pieces
                return reader.body(response.iter_bytes())
        except openai.APIStatusError as exc:
            if tools and self._refused_tools(exc):
                return self._request(messages)
            raise ModelError(
                f"The model endpoint {self.model.base_url} answered HTTP {exc.status_code} "
                f"(after the SDK's retries): {str(exc)[:300]}. Check --model, --base-url and the key.",
                status=exc.status_code,
                workspace=self.workspace,
            ) from exc
        except openai.APIConnectionError as exc:
            self.http.check(exc)  # cut on purpose: stopped, not unreachable
            raise ModelError(
                f"Cannot reach the model endpoint {self.model.base_url} (after the SDK's retries): {exc}.",
                workspace=self.workspace,
            ) from exc

    # -- function calls written as text ---------------------------------------------------

    @property
    def function_names(self) -> list[str]:
        """The names of the functions this channel offers."""
        return [str(t.get("function", {}).get("name")) for t in self.options.get("tools") or []]

    def _refused_tools(self, exc: Any) -> bool:
        """With ``--tool-format auto``: an endpoint that refuses ``tools`` (HTTP 4xx/5xx naming them) -> text."""
        if self.model.tool_format != "auto" or self.text_protocol or exc.status_code not in (400, 404, 422, 500, 501):
            return False
        said = str(exc).lower()
        if "tool" not in said and "jinja" not in said:
            return False
        self._to_text(f"the endpoint refused the `tools` parameter (HTTP {exc.status_code})")
        return True

    def _to_text(self, why: str) -> None:
        self.text_protocol = True
        self.bus.notice(
            self.stage,
            f"{why}: switching to the text protocol (--tool-format auto); the functions are now described in "
            "the system prompt. Pass --tool-format text to start so.",
            "warning",
        )

    def _calls_from_text(self, reply: Reply) -> Reply:
        """The reply with the calls its text holds (marked), or its refusal; native calls stand as they are."""
        names = self.function_names
        if not names:
            return reply
        cut = reply.finish_reason == "length" and not reply.calls
        try:
            found = read_calls(reply.content, names, truncated=cut)
        except TextCallRefused as exc:
            if reply.calls:  # calls through the API; the text around them is prose
                return reply
            reply.refusal = str(exc)
            self.bus.notice(
                self.stage,
                f"the model wrote function calls as text that cannot be read whole: {exc.problem}",
                "warning",
            )
            if self.model.tool_format == "auto" and not self.text_protocol:
                self._to_text("the server passed the model's function calls through as text")
            return reply
        if found is None:
            return reply
        if reply.calls:
            native = [(c["function"]["name"], _arguments(c["function"]["arguments"])) for c in reply.calls]
            if native != [(c.name, c.arguments) for c in found.calls]:
                reply.refusal = (
                    "error: your reply made function calls through the API and wrote other calls as text. "
                    "Nothing from this reply was applied. Make every call one way, through the API."
                )
                reply.calls = []
            return reply
        number = self.calls
        reply.calls = [
            function_call(f"call_text_{number}_{index}", call.name, json.dumps(call.arguments))
            for index, call in enumerate(found.calls)
        ]
        reply.content = found.prose
        reply.dialect = found.dialect
        self.bus.notice(self.stage, found.describe())
        if self.model.tool_format == "auto" and not self.text_protocol:
            self._to_text("the server passed the model's function calls through as text")
        return reply

    def _charge(self, usage: Usage, tokens: int) -> None:
        """Count one reply here and in the shared budget, and send the running totals."""
        self.tokens += tokens
        self.spent = self.spent + usage
        self.budget.charge(self.model.model, usage)
        self.bus.emit(self.usage_event(final=False))

    # -- stopping and the last word ---------------------------------------------------------

    @contextmanager
    def _watching(self) -> Iterator[None]:
        """While a request is out, a set cancel token stops this channel (its socket is shut down)."""
        cancel = self.cancel
        if cancel is None:
            yield
            return
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                if cancel.wait(0.05):
                    self.stop("the run was cancelled")
                    return

        watcher = threading.Thread(target=watch, name=f"flakebot-{self.role}-cancel", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()

    def stop(self, reason: str = "stopped") -> None:
        """End the request in flight (if any) and refuse further ones; safe from any thread, idempotent."""
        self.http.stop(reason)

    def check(self) -> None:
        """Raise :class:`~flakebot_magic.llm.http.ModelStopped` once the channel was stopped."""
        self.http.check()

    def usage_event(self, *, final: bool) -> ModelUsage:
        """What this channel spent, as a usage event (the requests sent, the tokens counted)."""
        event = self.spent.event(
            self.budget.cost(self.model.model, self.spent), final=final, candidate=self.candidate, role=self.role
        )
        return replace(event, tokens=self.tokens, calls=self.calls, stage=self.stage)

    def close(self, *, report: bool = True) -> None:
        """Send the last word on what was spent (once; not with ``report=False``), and close the connection."""
        if self._closed:
            return
        self._closed = True
        if report:
            self.bus.emit(self.usage_event(final=True))
        if self._client is not None:
            self._client.close()
        self.http.close()

    def __enter__(self) -> ModelChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: a code point UTF-8 cannot encode: a surrogate, as a name that is not UTF-8 decodes (``os.fsdecode``)
_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(value: Any) -> Any:
    """``value`` (a request's messages) with every string UTF-8 can encode: a surrogate becomes U+FFFD.

    What a request carries is text about the workspace, and sandboxed code names
    its files: a file name that is not UTF-8 (``b"src/\\xff"``) is a string with
    a surrogate in Python, which no JSON body can carry (before, a test that
    planted one ended the session with ``UnicodeEncodeError`` when the policy
    told the model about it). The one place every request passes.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {encodable(key): encodable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable(item) for item in value]
    return value


def _arguments(text: str) -> Any:
    try:
        return load_json(text or "{}")
    except ValueError:
        return None
