"""Waiting in tests: poll a condition until a deadline, never sleep a fixed time and hope.

A fixed ``time.sleep(0.3)`` before an assertion is either too short on a busy
machine (a flaky test) or longer than needed everywhere else. ``wait_for``
returns as soon as the condition holds and, past its deadline, fails with an
``AssertionError`` that says what never happened.

Importable from any test module as ``from polling import wait_for`` (pytest
puts ``tests/`` on ``sys.path`` for ``tests/conftest.py``, as for
``tinycrates``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for", "wait_for_async"]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.05) -> T:
    """Call ``predicate`` until it returns something truthy; return that value.

    Raises ``AssertionError("... waiting for {what}")`` when ``timeout``
    seconds pass first. The predicate is always tried once more at the
    deadline, so a slow machine gets the full ``timeout``.

    >>> wait_for(lambda: 42, 1, "the answer")
    42
    >>> wait_for(lambda: [], 0.1, "an empty list to fill up", interval=0.02)
    Traceback (most recent call last):
    ...
    AssertionError: timed out after 0.1 s waiting for an empty list to fill up
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


async def wait_for_async(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.05) -> T:
    """:func:`wait_for` for a coroutine: the event loop keeps running while it waits."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)
