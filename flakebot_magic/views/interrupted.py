"""Builds shown in this kernel, ended as records when the kernel stops under them (a restart, a shutdown).

A widget lives only as long as its kernel. A kernel restarted while a build
runs would leave the cell's widget frozen ("building… 13.8s", running rows, a
Cancel button that reaches nothing), and a saved notebook without the record.
So every build shown as a widget is :func:`track` ed until it ends; when the
kernel's interpreter exits (``atexit``: ipykernel ends a restart or a shutdown
so, and its own message channel closes after the handlers registered after
it), each one still running is stopped and its display becomes its record:
"interrupted by a kernel restart", its stages and its log kept. The exit waits
(at most :data:`STOP_AT_EXIT` s, inside jupyter_client's 5 s before it kills
a kernel) for each pipeline to stop, so that its log is saved as a cancelled
run's (``%flakebot logs NAME``): the pipeline runs on a daemon thread, which
the interpreter would otherwise drop mid-way. A kernel that is killed
(``kill -9``) runs nothing: its widget stays as it was.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Shown", "interrupt_all", "track", "untrack"]


class Shown(Protocol):
    """A build shown in a notebook (the magic's): its run, its widget, and ``refresh`` (the record replaces it)."""

    run: Any
    widget: Any

    def refresh(self) -> None: ...


#: seconds the exiting kernel waits, in all, for its cancelled builds to stop and save their logs
STOP_AT_EXIT = 3.0

_LIVE: dict[int, tuple[Shown, Callable[[], str]]] = {}
_LOCK = threading.Lock()
_REGISTERED = False


def track(build: Shown, reason: Callable[[], str]) -> None:
    """Remember ``build`` until :func:`untrack`; ``reason()`` says, at exit, why the kernel stopped."""
    global _REGISTERED
    with _LOCK:
        _LIVE[id(build)] = (build, reason)
        if not _REGISTERED:
            atexit.register(interrupt_all)
            _REGISTERED = True


def untrack(build: Shown) -> None:
    with _LOCK:
        _LIVE.pop(id(build), None)


def interrupt_all() -> None:
    """End every tracked build: its run cancelled, its widget a record that says why (the kernel is stopping)."""
    with _LOCK:
        live = list(_LIVE.values())
        _LIVE.clear()
    stopping = []
    for build, reason in live:
        try:
            why = reason()
            if build.run is not None:
                build.run.cancel(why)
            stopping.append((build, why))
        except Exception:  # the kernel is exiting: one build that cannot be stopped must not stop the others
            continue
    deadline = time.monotonic() + STOP_AT_EXIT
    for build, _why in stopping:  # their logs saved before the interpreter drops the pipelines' daemon threads
        join = getattr(build.run, "join", None)
        if join is not None:
            join(deadline - time.monotonic())
    for build, why in stopping:
        try:
            if build.widget is not None:
                build.widget.interrupt(why)
            build.refresh()
        except Exception:  # the kernel is exiting: one display that cannot be updated must not stop the others
            continue


def why_stopped(shell: Any) -> str:
    """Why the kernel of IPython's ``shell`` is exiting, as a stopped build's record says it (ipykernel keeps the
    reply to the shutdown request, which says whether it is a restart)."""
    reply = getattr(getattr(shell, "kernel", None), "_shutdown_message", None) or {}
    restart = (reply.get("content") or {}).get("restart") if isinstance(reply, dict) else None
    how = "a kernel restart" if restart else "the kernel's shutdown" if restart is False else "the kernel stopping"
    return f"interrupted by {how}: the build stopped with it; its log is kept below"
