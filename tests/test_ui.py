"""The progress widget, headless: feed it pipeline events, assert on its state (as tqdm.notebook's tests do)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from flakebot_magic.errors import BuildError, Cancelled
from flakebot_magic.events import LogLine, Notice, RunFinished, StageFinished, StageStarted
from flakebot_magic.ui import ProgressWidget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_tool(name: str = "md") -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        crate="pulldown-cmark",
        version="0.9.2",
        backend="cargo",
        store_path=Path("/store/abc-pulldown-cmark-0.9.2"),
        example=lambda: f'{name}("some input text")',
    )


def states(widget: ProgressWidget) -> dict[str, str]:
    return {key: row.state for key, row in widget.rows.items()}


def rendered_states(widget: ProgressWidget) -> dict[str, str]:
    return dict(re.findall(r"data-stage='([^']+)' data-state='([^']+)'", widget.table.value))


def test_rows_follow_the_stages() -> None:
    clock = Clock()
    widget = ProgressWidget("render markdown", clock=clock)
    assert set(states(widget).values()) == {"pending"}
    assert widget.bar.bar_style == "info" and widget.bar.value == 0
    widget(StageStarted("search", at=100.0))
    clock.now = 101.5
    widget.tick()
    assert widget.rows["search"].state == "running"
    assert "1.5s" in widget.table.value
    widget(StageFinished("search", "done", "pulldown-cmark 0.9.2", 1.5, at=101.5))
    widget(StageStarted("build", at=102.0))
    widget(StageStarted("test", at=102.0))
    assert rendered_states(widget)["search"] == "done"
    assert rendered_states(widget)["build"] == "running"
    assert widget.bar.value == 1


def test_live_detail_and_log_are_throttled_and_collapsed() -> None:
    clock = Clock()
    widget = ProgressWidget(clock=clock)
    assert widget.log.selected_index is None  # collapsed by default
    widget(StageStarted("build", at=100.0))
    for i in range(500):
        widget(LogLine("build", f"   Compiling crate{i} v0.1.0"))
    assert widget.rows["build"].live == "Compiling crate499 v0.1.0"
    assert "crate499" not in widget.log_view.value  # not rendered per line
    clock.now = 101.0
    widget.tick()
    assert "crate499" in widget.log_view.value
    assert widget.log.titles[0] == "Log (500 lines)"
    assert "earlier lines" in widget.log_view.value  # only the tail is kept in the view


def test_success_summary_counts_and_diff() -> None:
    clock = Clock()
    diffs = []

    def diff(tool: object) -> SimpleNamespace:
        diffs.append(tool)
        return SimpleNamespace(
            summary="3 files changed, +10 -2 against the published crate", to_html=lambda: "<pre>+x</pre>"
        )

    widget = ProgressWidget("render markdown", diff=diff, clock=clock)
    for stage in ("search", "fork", "build", "test", "flake", "deploy", "client"):
        widget(StageStarted(stage, at=clock.now))
        detail = "87 passed, 0 failed, 0 ignored" if stage == "test" else ""
        widget(StageFinished(stage, "done", detail, 0.5, at=clock.now + 0.5))
    tool = fake_tool()
    widget(RunFinished(ok=True, tool=tool, elapsed=4.0, at=104.0))
    assert widget.outcome == "success"
    assert widget.bar.bar_style == "success" and widget.bar.value == widget.bar.max
    assert widget.tests_passing == 87 and "87 tests passing" in widget.counts.value
    assert all(state == "done" for key, state in states(widget).items() if key != "edit")
    assert states(widget).get("edit", "skipped") == "skipped"  # no model: the edit loop never ran
    assert widget.cancel_button.layout.display == "none"
    assert (
        "data-outcome='success'" in widget.summary.value and "md(&quot;some input text&quot;)" in widget.summary.value
    )
    assert diffs == [tool]
    assert widget.diff_box.layout.display is None and "3 files changed" in widget.diff_box.titles[0]
    assert "+x" in widget.diff_view.value
    text = widget.text()
    assert "ready" in text and "`md` is ready" in text and "test" in text
    bundle = widget.mimebundle()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.widget.model_id
    assert bundle["text/plain"] == text


def test_failure_keeps_the_message() -> None:
    widget = ProgressWidget()
    widget(StageStarted("build"))
    widget(StageFinished("build", "failed", "cargo build failed", 2.0))
    error = BuildError("cargo build failed for x:\nerror[E0308]: mismatched types", workspace=Path("/ws/x"))
    widget(RunFinished(ok=False, error=error, elapsed=3.0))
    assert widget.outcome == "failed" and widget.bar.bar_style == "danger"
    assert states(widget)["build"] == "failed" and states(widget)["deploy"] == "skipped"
    assert "E0308" in widget.summary.value and "/ws/x" in widget.summary.value


def test_cancel_button_calls_back_once_and_rows_show_cancelled() -> None:
    calls = []
    widget = ProgressWidget(on_cancel=lambda: calls.append(1))
    widget(StageStarted("build"))
    widget(StageStarted("test"))
    widget.cancel_button.click()
    widget.cancel_button.click()
    assert calls == [1]
    assert widget.cancel_button.disabled and widget.cancel_button.description == "Cancelling…"
    widget(Notice("run", "cancelled from the widget: stopping the running process; the workspace is kept", "warning"))
    widget(StageFinished("build", "failed", "Cancelled while running `cargo build`", 0.4))
    widget(RunFinished(ok=False, error=Cancelled("Cancelled while running cargo"), elapsed=1.0))
    assert widget.outcome == "cancelled" and widget.bar.bar_style == "warning"
    assert states(widget)["build"] == "cancelled" and states(widget)["test"] == "cancelled"
    assert "data-outcome='cancelled'" in widget.title.value
    assert "workspace is kept" in widget.notice_view.value


def test_repeated_stages_and_iterations_get_rows_of_their_own() -> None:
    widget = ProgressWidget()
    iteration = pytest.importorskip("flakebot_magic.events").__dict__.get("IterationResult")
    widget(StageStarted("edit"))
    if iteration is None:  # the edit loop's event is not there yet: a stand-in with its fields

        def iteration(**fields: object) -> object:
            return type("IterationResult", (), fields)()

    widget(iteration(iteration=0, passed=3, failed=1, errors=0, green=False, summary="baseline"))
    widget(iteration(iteration=1, passed=2, failed=0, errors=0, reverted=True, reason="fewer tests pass", run=2))
    widget(iteration(iteration=2, passed=5, failed=0, errors=0, green=True, run=3))
    widget(StageFinished("edit", "done", "green after 2 iterations", 9.0))
    widget(StageStarted("build"))
    widget(StageFinished("build", "done", "", 1.0))
    widget(StageStarted("build"))  # a stage run again is a new row, after the first
    keys = list(widget.rows)
    assert (
        keys.index("edit")
        < keys.index("iteration-0")
        < keys.index("iteration-2")
        < keys.index("iteration-3")
        < keys.index("build")
    )
    assert keys.index("build-2") == keys.index("build") + 1
    assert widget.rows["iteration-2"].state == "failed" and "reverted" in widget.rows["iteration-2"].detail
    assert widget.rows["iteration-3"].state == "done"
    assert widget.iterations == 2 and widget.tests_passing == 5
    assert "iteration 2" in widget.counts.value and "5 tests passing" in widget.counts.value
    assert widget.bar.max == len(widget.rows)
