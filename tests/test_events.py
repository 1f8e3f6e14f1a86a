"""A cancelled run is called cancelled wherever it shows, never a failure; the outcome is decided once.

The invariant, over every door a run's end shows through: the stage rows,
the run log (and the attempt ``list``/``logs`` name), the printed progress,
the live widget and the record a cell keeps (HTML and text). Each is fed the
events a real :class:`~flakebot_magic.stages.state.Stage` emits when a cancel
(each kind: the Cancel button's :class:`Cancelled`, Ctrl-C, a kernel
interrupt's ``asyncio.CancelledError``) stops it mid-build, after the tests
of an earlier stage passed.
"""

from __future__ import annotations

import asyncio
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.errors import BuildError, Cancelled
from flakebot_magic.events import Event, EventBus, LogLine, RunFinished, StageFinished, outcome_of
from flakebot_magic.manage import tools
from flakebot_magic.records.runlog import RunLog, attempt_log_path, attempt_of
from flakebot_magic.stages.state import Stage
from flakebot_magic.views.progress import TextProgress
from flakebot_magic.views.widget import ProgressWidget

CANCELS = {
    "Cancel button": lambda: Cancelled("Stopped during `cargo build`.", workspace=Path("/ws/.next/x-1/flip")),
    "Ctrl-C": KeyboardInterrupt,
    "kernel interrupt": asyncio.CancelledError,
}
FAILURES = {"build error": lambda: BuildError("cargo build did not compile"), "a bug": lambda: RuntimeError("boom")}
#: a word that calls the run (or a stage of it) a failure
FAILURE_WORD = re.compile(r"fail", re.IGNORECASE)


@pytest.mark.parametrize("kind", list(CANCELS))
def test_every_kind_of_cancel_is_cancelled(kind: str) -> None:
    assert outcome_of(CANCELS[kind]()) == "cancelled"
    assert RunFinished(ok=False, error=CANCELS[kind]()).outcome == "cancelled"


@pytest.mark.parametrize("kind", list(FAILURES))
def test_a_failure_is_failed_and_success_is_success(kind: str) -> None:
    assert outcome_of(FAILURES[kind]()) == "failed"
    assert RunFinished(ok=False, error=FAILURES[kind]()).outcome == "failed"
    assert RunFinished(ok=False).outcome == "failed"  # ended without saying why: not a success
    assert RunFinished(ok=True, tool=object()).outcome == "success"


@dataclass
class _Viewed:
    """A run stopped by ``error`` as its views saw it: the run log (saved), the printed progress, the widget."""

    settings: Settings
    seen: list[Event]
    printed: io.StringIO
    widget: ProgressWidget
    outcome: str  # the saved attempt's


def _stopped_run(tmp_path: Path, error: BaseException) -> _Viewed:
    """A run's events, through real Stages: search, fork, build and test done (87 passing), stopped in deploy."""
    settings = Settings(cache_dir=tmp_path / "cache")
    log, printed = RunLog(settings), io.StringIO()
    widget = ProgressWidget("flip its arguments", name="flip", show_error=True)
    seen: list[Event] = []
    bus = EventBus([seen.append, log, TextProgress(printed), widget])
    for stage in ("search", "fork", "build", "test"):
        with Stage(bus, stage) as row:
            bus.emit(LogLine(stage, f"   {stage} output"))
            row.detail = "87 passed, 0 ignored" if stage == "test" else ""
    with pytest.raises(type(error)), Stage(bus, "deploy"):
        raise error
    bus.emit(RunFinished(ok=False, error=error, elapsed=3.0))
    log.save("flip", request="flip its arguments", error=error)
    attempt = attempt_of(settings, "flip")
    assert attempt is not None
    return _Viewed(settings, seen, printed, widget, attempt.outcome)


@pytest.mark.parametrize("kind", list(CANCELS))
def test_a_cancelled_run_is_cancelled_in_every_view(kind: str, tmp_path: Path) -> None:
    run = _stopped_run(tmp_path, CANCELS[kind]())
    settings, widget, printed = run.settings, run.widget, run.printed
    [deploy] = [e for e in run.seen if isinstance(e, StageFinished) and e.stage == "deploy"]
    assert deploy.status == "cancelled" and run.outcome == "cancelled"
    record = widget.record()
    shown = {
        "run log": attempt_log_path(settings, "flip", "cancelled").read_text(),
        "the run log's name": attempt_of(settings, "flip").log,  # type: ignore[union-attr]
        "logs NAME": tools.logs(settings, "flip", last=None),
        "list": tools.table(settings).text,
        "printed progress": printed.getvalue(),
        "widget title": widget.title.value,
        "widget rows": widget.table.value,
        "record html": record.html(),
        "record text": record.text(),
    }
    for door, text in shown.items():  # the log's own file name too: NAME.cancelled.log
        assert "cancelled" in text, door
        assert not FAILURE_WORD.search(text), (door, text)
    assert not attempt_log_path(settings, "flip", "failed").exists()
    assert widget.outcome == "cancelled" and widget.bar.bar_style == "warning"
    assert "== run cancelled: " in shown["run log"] and "== deploy cancelled" in shown["run log"]
    # the header claims no passing tests for a run that never finished (its test row still says what ran)
    assert "tests passing" not in widget.counts.value and "tests passing" not in record.html()
    assert "87 passed" in record.html()


@pytest.mark.parametrize("kind", list(FAILURES))
def test_a_failed_run_is_still_failed(kind: str, tmp_path: Path) -> None:
    run = _stopped_run(tmp_path, FAILURES[kind]())
    widget = run.widget
    assert run.outcome == "failed"
    assert "== run failed: " in attempt_log_path(run.settings, "flip", "failed").read_text()
    assert "deploy  FAILED" in run.printed.getvalue()
    assert widget.outcome == "failed" and "cancelled" not in widget.record().html()
    assert "tests passing" not in widget.counts.value


def test_a_ready_run_shows_its_passing_tests_in_the_header() -> None:
    widget = ProgressWidget("flip its arguments", name="flip")
    bus = EventBus([widget])
    with Stage(bus, "test") as row:
        row.detail = "87 passed, 0 ignored"
    widget.tick()
    assert "87 tests passing" in widget.counts.value  # while it runs: progress
    widget(RunFinished(ok=True, tool=None, elapsed=1.0))
    assert "87 tests passing" in widget.counts.value


def test_a_request_no_crate_fits_is_answered_in_every_view_not_failed(tmp_path: Path) -> None:
    """The search's honest answer that no crate does the request as published (``NeedsModelError``) is ``unfit``:
    the search row done, the title "no crate fits", amber; no door calls it a failure, and the way on is said."""
    from tinycrates import write_registry

    from flakebot_magic.errors import NeedsModelError
    from flakebot_magic.pipeline.background import start_build

    assert outcome_of(NeedsModelError("No crate does 'x' as published")) == "unfit"
    registry = write_registry(tmp_path / "registry", ["tinylib"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), embedding_model="off")
    printed = io.StringIO()
    widget = ProgressWidget("uppercase text", name="up", show_error=True)
    with pytest.raises(NeedsModelError) as refused:
        start_build(settings, "uppercase text", name="up", extra_observers=[TextProgress(printed), widget]).wait()
    assert "tinylib" in str(refused.value) and "--model" in str(refused.value)  # the way on
    attempt = attempt_of(settings, "up")
    assert attempt is not None and attempt.outcome == "unfit" and attempt.crate == ""  # it chose none
    assert attempt.log == str(attempt_log_path(settings, "up", "unfit"))
    record = widget.record()
    # the refusal itself (its reasons may quote a crate's own words) is not what is checked: how the run is named is
    said = str(refused.value)
    shown = {
        "run log's name": attempt.log,
        "run log": Path(attempt.log).read_text().replace(said.splitlines()[0], ""),
        "logs NAME": tools.logs(settings, "up", last=None).replace(said.splitlines()[0], ""),
        "list": tools.table(settings).text,
        "printed progress": printed.getvalue().replace(said.splitlines()[0], ""),
        "widget title": widget.title.value,
        "record title": record.html().split("</div>", 1)[0],
    }
    for door, text in shown.items():
        assert not FAILURE_WORD.search(text), (door, text)
    assert "no crate fits" in widget.title.value and "no crate fits" in record.text()
    assert "unfit" in shown["list"] and "found no crate that fits" in shown["logs NAME"]
    [listed] = tools.table(settings).rows()
    assert listed[:3] == ("up", "-", "-"), listed  # no crate chosen: none listed (not the refusal's words)
    assert widget.outcome == "unfit" and widget.bar.bar_style == "warning"
    assert widget.rows["search"].state == "done"
    assert {row.state for name, row in widget.rows.items() if name != "search"} <= {"skipped"}
