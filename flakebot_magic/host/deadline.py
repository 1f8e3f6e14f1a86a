"""A call's deadline: made once, when the call is made; every wait inside the call takes the time left on it.

A call of a tool waits in many places: its turn behind other calls, a start or restart of the tool's process,
the ``--help`` probe, the answer, and the stop of a process it gave up on. Each wait asks the call's
:class:`Deadline` how long it may take (:meth:`Deadline.left`), so that the waits together never exceed the
call's time limit. A narrower limit inside the call (a start's ``ready_timeout``, a probe's own limit) is
:meth:`Deadline.within`: whichever ends first applies, and an error names the one that did (``str(deadline)``).

A call made inside another's (a function looked up by the call that starts the tool) keeps the outer deadline:
:meth:`Deadline.of_call` returns the one that is :meth:`Deadline.running` on this thread, if any ends first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["Deadline"]

_RUNNING: ContextVar[Deadline | None] = ContextVar("flakebot_call_deadline", default=None)


class Deadline:
    """The moment (``time.monotonic()``) by which something must end, the limit it came from, and its name.

    ``Deadline(2.0)`` ends 2 s from now; ``str()`` names it: "the call's time limit of 2 s".
    """

    __slots__ = ("at", "limit", "what")

    def __init__(self, limit: float, what: str = "the call's time limit", *, at: float | None = None) -> None:
        self.limit = max(0.0, float(limit))
        self.at = time.monotonic() + self.limit if at is None else at
        self.what = what

    def left(self) -> float:
        """Seconds left (0.0 once it has passed)."""
        return max(0.0, self.at - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def within(self, seconds: float, what: str) -> Deadline:
        """The earlier of this deadline and ``seconds`` from now (named ``what``): a narrower limit inside the call."""
        other = Deadline(seconds, what)
        return other if other.at < self.at else self

    def wait(self, seconds: float) -> float:
        """The time a wait of at most ``seconds`` may take within this deadline."""
        return min(seconds, self.left())

    @classmethod
    def of_call(cls, limit: float, what: str = "the call's time limit") -> Deadline:
        """A new call's deadline, ``limit`` s from now; the enclosing call's, when one runs here and ends first."""
        made = cls(limit, what)
        outer = _RUNNING.get()
        return outer if outer is not None and outer.at < made.at else made

    @staticmethod
    def current() -> Deadline | None:
        """The deadline of the call running on this thread (:meth:`running`), if any."""
        return _RUNNING.get()

    @contextmanager
    def running(self) -> Iterator[Deadline]:
        """Within the block, calls made on this thread end by this deadline too (:meth:`of_call`)."""
        token = _RUNNING.set(self)
        try:
            yield self
        finally:
            _RUNNING.reset(token)

    def __str__(self) -> str:
        return f"{self.what} of {self.limit:g} s"

    def __repr__(self) -> str:
        return f"Deadline({self.limit:g}, {self.what!r}, left={self.left():.3f})"
