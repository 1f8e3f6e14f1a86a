"""``--replay`` and ``--reference``: a task's script served by the fake OpenAI-compatible server, in place of a model.

The script is the task's ``solution.json`` (``--replay``) or the replies that
apply its reference solution (``--reference``, :mod:`.reference`).

A replay checks the suite and the harness (each solution really solves its
task through the edit loop, and the hidden tests agree), never a model: the
server is :class:`flakebot_magic.testing.fake_openai.FakeOpenAIServer`, the
project's test double, and every view of a replay's results says so
(:data:`~flakebot_magic.eval.results.REPLAY_LABEL`). This module is the one
place outside the tests that starts it, only for ``--replay``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import UsageError

__all__ = ["REPLAY_MODEL_NAME", "replay_server"]

#: the model name a replay's requests carry (a replay never reaches a model)
REPLAY_MODEL_NAME = "replay-not-a-model"


@contextmanager
def replay_server(solution: Path | list[dict[str, Any]] | None, task: str) -> Iterator[str]:
    """Serve ``solution`` (a script file, or the replies themselves: a reference's) on 127.0.0.1; yield the base URL.

    A task without a solution, or one whose script is malformed, is a
    :class:`UsageError` naming the task and what to fix (its attempt is then
    counted as a bad task, never a model's failure).
    """
    if solution is None:
        raise UsageError(f"The task {task!r} has no solution.json, so --replay has nothing to serve for it.")
    from ..testing.fake_openai import FakeOpenAIServer  # the test double, only for --replay

    try:
        server = FakeOpenAIServer(solution)
    except (OSError, ValueError) as exc:
        raise UsageError(f"The task {task!r} has a solution.json the fake server cannot replay: {exc}") from None
    server.start(announce=False)
    try:
        yield server.base_url
    finally:
        server.stop()
