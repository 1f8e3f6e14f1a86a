"""Running the pipeline on a background thread, so front ends stay live and can cancel it.

The pipeline thread only queues events; the front end's thread (the kernel's
main thread, the terminal's) takes them off the queue and hands them to its
observers, so widgets and printed progress are updated from the thread that
owns the cell. Stopping is always the same: the run's :class:`CancelToken` is
set, the process runner kills cargo's (or nix's) process group, and the
pipeline raises :class:`Cancelled` with the workspace kept.

Two ways to wait:

* :meth:`BackgroundRun.wait`: blocking, for the terminal, plain IPython and
  tests. Ctrl-C (``KeyboardInterrupt``) cancels the run.
* :meth:`BackgroundRun.wait_async`: awaited on the kernel's event loop, so the
  kernel keeps handling messages (a widget's Cancel button) while the
  pipeline works. A kernel interrupt cancels the awaiting task, which cancels
  the run. No ``asyncio.run`` anywhere: the kernel's loop is already running.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from ..clients.base import ToolClient
from ..config import Settings
from ..errors import Cancelled, FlakebotError
from ..events import Event, Notice, Observer
from ..host.process import CancelToken
from ..records.runlog import RunLog
from ..registry.base import Registry
from ..request import BuildRequest
from .run import Pipeline

__all__ = ["BackgroundRun", "start_build"]

T = TypeVar("T")

#: how long to wait for the pipeline to stop after a cancel before giving up on it
STOP_WAIT = 30.0


class BackgroundRun(Generic[T]):
    """Runs ``target(observer, cancel)`` on a daemon thread; the waiting thread gets its events.

    Parameters
    ----------
    target
        Does the work. It must send every event to ``observer`` and pass
        ``cancel`` to the process runner; its return value is the result.

    Examples
    --------
    >>> run = BackgroundRun(lambda emit, cancel: Pipeline(settings, observers=[emit], cancel=cancel).run(request))  # doctest: +SKIP
    >>> tool = run.start().wait([TextProgress()])                                                             # doctest: +SKIP
    """

    def __init__(self, target: Callable[[Observer, CancelToken], T], *, name: str = "flakebot-run") -> None:
        self.token = CancelToken()
        self._target = target
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None
        self._wake: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.cancel_reason = ""
        self._broken: set[int] = set()
        #: observers on the pipeline's side (the run's log) that should hear of a cancel too
        self.also_notify: list[Observer] = []

    # -- the pipeline's side --------------------------------------------------

    def _emit(self, event: Event) -> None:
        self._events.put(event)
        wake = self._wake
        if wake is not None:
            wake()

    def _main(self) -> None:
        try:
            self._result = self._target(self._emit, self.token)
        except BaseException as exc:  # handed to the waiting thread
            self._error = exc
        finally:
            self._done.set()
            wake = self._wake
            if wake is not None:
                wake()

    # -- the front end's side -------------------------------------------------

    def start(self) -> BackgroundRun[T]:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the pipeline's thread to end (its log saved); True when it has."""
        return self._done.wait(max(0.0, timeout))

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the run: kills the running cargo/nix process group; the pipeline raises ``Cancelled``."""
        if self.token.cancelled:
            return
        self.cancel_reason = reason
        self.token.cancel()
        notice = Notice("run", f"{reason}: stopping the running process; the workspace is kept", "warning")
        for observer in self.also_notify:
            observer(notice)
        self._emit(notice)

    def _deliver(self, observers: Sequence[Observer]) -> None:
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            for observer in observers:
                if id(observer) in self._broken:
                    continue
                try:
                    observer(event)
                except Exception as exc:  # progress must never break the run
                    self._broken.add(id(observer))
                    print(
                        f"flakebot: progress observer {observer!r} failed ({exc!r}); it gets no further events",
                        file=sys.stderr,
                    )

    def _outcome(self) -> T:
        if self._error is not None:
            error = self._error
            if isinstance(error, KeyboardInterrupt):
                raise Cancelled("The run was interrupted.") from None
            raise error
        return self._result  # type: ignore[return-value]

    def _ended(self, observers: list[Observer], stop_by: float) -> bool:
        """One turn of both waits: the queued events delivered; True when the run has ended (its last events
        delivered too); :meth:`_still_stopping` raised once a cancelled run is past ``stop_by``."""
        self._deliver(observers)
        if self.done:
            self._deliver(observers)
            return True
        if time.monotonic() > stop_by:
            raise self._still_stopping()
        return False

    def wait(
        self, observers: Iterable[Observer] = (), *, tick: Callable[[], None] | None = None, interval: float = 0.25
    ) -> T:
        """Block until the run ends, delivering events; Ctrl-C cancels the run cleanly.

        A second Ctrl-C stops waiting for a pipeline that does not stop.
        """
        observers = list(observers)
        interrupts = 0
        stop_by = float("inf")
        while True:
            try:
                if self._ended(observers, stop_by):
                    return self._outcome()
                self._done.wait(interval)
                if tick is not None:
                    tick()
            except KeyboardInterrupt:
                interrupts += 1
                if interrupts > 1:
                    raise self._still_stopping() from None
                self.cancel("interrupted")
                stop_by = time.monotonic() + STOP_WAIT

    async def wait_async(
        self, observers: Iterable[Observer] = (), *, tick: Callable[[], None] | None = None, interval: float = 0.25
    ) -> T:
        """Await the run on the running event loop, delivering events on it.

        Cancelling the awaiting task (a kernel interrupt does) cancels the run,
        waits for it to stop, and raises :class:`Cancelled`.
        """
        observers = list(observers)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # the loop closed under us
                pass

        self._wake = wake
        stop_by = float("inf")
        try:
            while True:
                woken.clear()
                if self._ended(observers, stop_by):
                    return self._outcome()
                try:
                    await asyncio.wait_for(woken.wait(), interval)
                except asyncio.TimeoutError:
                    pass
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    uncancel = getattr(task, "uncancel", None)
                    if uncancel is not None:
                        uncancel()  # we handle this cancel: stop the run, then report it
                    if self.token.cancelled:
                        raise self._still_stopping() from None
                    self.cancel("interrupted")
                    stop_by = time.monotonic() + STOP_WAIT
                if tick is not None:
                    tick()
        finally:
            self._wake = None

    def _still_stopping(self) -> Cancelled:
        return Cancelled(
            "The run was cancelled; its last step is still finishing in the background "
            "(no cargo or nix process is left running)."
        )


def start_build(
    settings: Settings,
    request: BuildRequest | str,
    *,
    name: str | None = None,
    crate: str | None = None,
    extra_observers: Iterable[Observer] = (),
    registry: Registry | None = None,
) -> BackgroundRun[ToolClient]:
    """Start ``Pipeline(settings).run(request)`` on a background thread; return the run.

    Every front door builds through here, so every build has its run log:
    every line of cargo's, git's and nix's output is kept under
    ``<cache>/logs/NAME.log`` and recorded in the tool inventory with the
    request, for ``%flakebot logs`` and ``%flakebot rebuild``.

    Parameters
    ----------
    request
        What to build: a :class:`~flakebot_magic.request.BuildRequest`, or its
        text with ``name`` and ``crate`` beside it.
    extra_observers
        Called on the pipeline's thread (keep them quick); front ends should
        pass their observers to :meth:`BackgroundRun.wait` instead.
    registry
        The registry to build from (default: opened from ``settings.registry``);
        an eval shares one between its tasks.
    """
    build = BuildRequest.of(request, name=name, crate=crate)
    log = RunLog(settings)

    def save(name: str | None, emit: Observer, **changes: Any) -> None:
        # the log is the run's record, not its result: a disk too full to keep it must not hide the result
        try:
            log.save(name, **changes)
        except (OSError, FlakebotError) as exc:
            emit(Notice("deploy", f"the run's log could not be saved: {exc}", "warning"))

    def target(emit: Observer, cancel: CancelToken) -> ToolClient:
        pipeline = Pipeline(settings, registry=registry, observers=[log, emit, *extra_observers], cancel=cancel)
        try:
            tool = pipeline.run(build)
        except FlakebotError as exc:
            kept = getattr(exc, "workspace", None)
            save(build.name or (kept.name if kept is not None else None), emit, request=build.text, error=exc)
            raise
        except BaseException as exc:
            save(build.name, emit, request=build.text, error=exc)
            raise
        save(tool.name, emit, request=build.text)
        return tool

    run: BackgroundRun[ToolClient] = BackgroundRun(target, name=f"flakebot-build-{build.label}")
    run.also_notify.append(log)
    return run.start()
