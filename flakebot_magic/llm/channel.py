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
  reply, the last word once when the channel closes).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..events import EventBus, ModelUsage
from ..host.process import CancelToken
from .budget import Budget
from .http import ModelHTTP
from .limits import ReplyLimits
from .model import ModelConfig
from .reply import BrokenReply, Reply, ReplyReader
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
            return reply
        raise ModelError(
            f"The model {self.model.describe()} sent {MAX_STREAM_RETRIES + 1} unusable replies in a row "
            f"(the last: {problem}). Nothing from them was applied. Try again, or another model.",
            workspace=self.workspace,
        )

    def _request(self, messages: list[dict[str, Any]]) -> Reply:
        import openai  # lazy: importing flakebot_magic stays cheap

        reader = ReplyReader(self.limits, estimate_tokens(messages))
        kwargs: dict[str, Any] = {
            "model": self.model.model,
            "messages": messages,
            **self.options,
            "extra_headers": self.headers,
        }
        completions = self.client.chat.completions
        try:
            if self.model.stream:
                return reader.stream(completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
            with completions.with_streaming_response.create(**kwargs) as response:  # read in bounded pieces
                return reader.body(response.iter_bytes())
        except openai.APIStatusError as exc:
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
