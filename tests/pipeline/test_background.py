"""The background run: events reach the waiting thread, Ctrl-C and task cancellation stop the run cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from polling import wait_for_async

from flakebot_magic.errors import Cancelled, SearchError
from flakebot_magic.events import Event, LogLine, Notice, Observer, RunFinished, StageStarted
from flakebot_magic.host.process import CancelToken, ProcessRunner
from flakebot_magic.pipeline.background import BackgroundRun

#: how long the sleeper's command runs unless it is stopped
SLEEPS = 30.0


def sleeper(seconds: float = SLEEPS):  # type: ignore[no-untyped-def]
    """A target that runs a real child process the way the pipeline runs cargo."""

    def target(emit: Observer, cancel: CancelToken) -> str:
        emit(StageStarted("build"))
        runner = ProcessRunner(cancel)
        try:
            runner.run(
                [sys.executable, "-c", f"import time; print('working', flush=True); time.sleep({seconds})"],
                on_line=lambda stream, line: emit(LogLine("build", line)),
                timeout=60,
            )
        except BaseException as exc:
            emit(RunFinished(ok=False, error=exc))
            raise
        emit(RunFinished(ok=True, tool="done"))
        return "done"

    return target


def test_events_reach_observers_on_the_waiting_thread() -> None:
    seen: list[tuple[str, str]] = []

    def observer(event: Event) -> None:
        seen.append((type(event).__name__, threading.current_thread().name))

    result = BackgroundRun(sleeper(0.2)).start().wait([observer])
    assert result == "done"
    assert [kind for kind, _ in seen] == ["StageStarted", "LogLine", "RunFinished"]
    assert {thread for _, thread in seen} == {threading.current_thread().name}


def test_errors_are_raised_in_the_waiting_thread() -> None:
    def target(emit: Observer, cancel: CancelToken) -> None:
        raise SearchError("No crate matches 'x'.")

    with pytest.raises(SearchError, match="No crate"):
        BackgroundRun(target).start().wait()


def test_cancel_kills_the_process_group_and_raises_cancelled() -> None:
    run = BackgroundRun(sleeper()).start()
    seen: list[Event] = []
    threading.Timer(0.5, run.cancel, args=("cancelled from the widget",)).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        run.wait([seen.append])
    assert time.monotonic() - started < SLEEPS  # stopped, not waited out
    notices = [e for e in seen if isinstance(e, Notice)]
    assert notices and "cancelled from the widget" in notices[0].message


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
def test_ctrl_c_while_waiting_cancels_the_run() -> None:
    run = BackgroundRun(sleeper()).start()
    threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        run.wait()
    assert time.monotonic() - started < SLEEPS  # stopped, not waited out
    assert run.token.cancelled and run.cancel_reason == "interrupted"


def test_cancelling_the_awaiting_task_cancels_the_run() -> None:
    async def main() -> None:
        run = BackgroundRun(sleeper()).start()
        ticks: list[float] = []
        task = asyncio.ensure_future(run.wait_async([], tick=lambda: ticks.append(time.monotonic())))
        await wait_for_async(lambda: ticks, 10, "the awaiting task's first tick")
        task.cancel()  # what ipykernel does on a kernel interrupt
        with pytest.raises(Cancelled):
            await task
        assert run.token.cancelled and ticks

    asyncio.run(main())  # a test's own loop; the kernel's loop is already running


def test_the_loop_stays_free_while_awaiting() -> None:
    async def main() -> None:
        run = BackgroundRun(sleeper(1.0)).start()
        beats = 0

        async def heartbeat() -> None:
            nonlocal beats
            while True:
                await asyncio.sleep(0.05)
                beats += 1

        beat = asyncio.ensure_future(heartbeat())
        assert await run.wait_async([]) == "done"
        beat.cancel()
        assert beats >= 10  # the loop ran other work (a widget's click) all along

    asyncio.run(main())


def test_failed_build_keeps_its_log(tmp_path: Path) -> None:
    from flakebot_magic.config import Settings
    from flakebot_magic.pipeline.background import start_build
    from flakebot_magic.records.runlog import attempt_log_path, attempt_of

    registry = tmp_path / "empty"
    registry.mkdir()
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry))
    with pytest.raises(SearchError):
        start_build(settings, "render markdown", name="md").wait()
    text = attempt_log_path(settings, "md", "failed").read_text()
    assert "== search started" in text and "SearchError" in text
    attempt = attempt_of(settings, "md")  # what list, show and the dashboard say of it
    assert attempt is not None and (attempt.outcome, attempt.kind) == ("failed", "SearchError")
    assert attempt.request == "render markdown" and attempt.log == str(attempt_log_path(settings, "md", "failed"))
