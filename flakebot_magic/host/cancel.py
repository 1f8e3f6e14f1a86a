"""A run's cancel tokens: set by a front end (Cancel button, Ctrl-C), read by the process runner and the stages;
and what a cancelled command's message says.

Re-exported by :mod:`.process`, where they stop the running command.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["CancelToken", "LinkedToken", "stopped_during"]


class CancelToken:
    """Set by a front end (Cancel button, Ctrl-C) to stop the run's current process."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


class LinkedToken(CancelToken):
    """A cancel token also set when its ``parent`` is: one candidate of a run can be stopped alone.

    >>> run = CancelToken(); one = LinkedToken(run); other = LinkedToken(run); one.cancel()
    >>> (one.cancelled, other.cancelled, run.cancelled)
    (True, False, False)
    """

    def __init__(self, parent: CancelToken) -> None:
        super().__init__()
        self.parent = parent

    @property
    def cancelled(self) -> bool:
        return self._event.is_set() or self.parent.cancelled

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.cancelled:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._event.wait(min(left, 0.05))
        return True


def stopped_during(argv: list[str]) -> str:
    """The message of a cancelled run: what the user knows was running (``cargo test``, not its wrapper or flags).

    (:class:`~flakebot_magic.errors.Cancelled` adds where the workspace is kept, on a line of its own: a long path wraps
    whole there, where JupyterLab's error box would break it mid-word.)

    Not "Cancelled during": IPython puts the class's name before it (``Cancelled: Stopped during …``).
    >>> stopped_during(["cargo", "test", "--locked"])
    'Stopped during `cargo test`.'
    """
    words = [os.path.basename(argv[0])] if argv else []
    for word in argv[1:3]:
        if word.startswith("-"):
            break
        words.append(word)
    return f"Stopped during `{' '.join(words)}`."
