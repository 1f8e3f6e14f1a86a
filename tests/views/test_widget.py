"""The progress widget, headless: feed it pipeline events, assert on its state (as tqdm.notebook's tests do)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from flakebot_magic.errors import BuildError, Cancelled, ForkError, UsageError
from flakebot_magic.events import LogLine, Notice, RunFinished, StageFinished, StageStarted
from flakebot_magic.views.widget import ProgressWidget


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
    assert widget.bar.value == 100  # a step per stage, in hundredths


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
    assert "+x" in widget.diff_box.children[0].value
    text = widget.text()
    assert "ready" in text and "`md` is ready" in text and "test" in text
    bundle = widget.mimebundle()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.widget.model_id
    assert bundle["text/plain"] == text


def test_failure_keeps_the_message() -> None:
    widget = ProgressWidget(show_error=True)  # a caller that does not raise the error (an agent's tool call)
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
    # the pipeline's Stage says a stopped stage is cancelled (events.outcome_of), the widget shows what it says
    widget(StageFinished("build", "cancelled", "Stopped during `cargo build`.\nThe workspace is kept at /ws/x", 0.4))
    widget(
        RunFinished(
            ok=False, error=Cancelled("Stopped during `cargo build`.\nThe workspace is kept at /ws/x"), elapsed=1.0
        )
    )
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
    assert widget.bar.max == 100 * len(widget.rows)


def test_a_raised_failure_is_shown_once_by_the_caller_not_repeated_in_the_widget() -> None:
    widget = ProgressWidget()  # %%flakebot raises the error; IPython shows it right below
    widget(StageStarted("build"))
    widget(StageFinished("build", "failed", "cargo build failed for x:", 2.0))
    widget(RunFinished(ok=False, error=BuildError("cargo build failed for x:\nerror[E0308]: mismatched"), elapsed=3.0))
    assert widget.outcome == "failed" and "data-outcome='failed'" in widget.title.value
    assert widget.summary.value == "" and "E0308" not in widget.text()
    assert widget.rows["build"].detail == "cargo build failed for x:"  # the row still says which stage


def test_the_error_box_wraps_at_spaces_not_inside_words() -> None:
    widget = ProgressWidget(show_error=True)
    widget(StageStarted("build"))
    widget(RunFinished(ok=False, error=BuildError("word " * 60), elapsed=1.0))
    pre = re.search(r"<pre style='([^']*)'", widget.summary.value)
    assert pre is not None
    style = pre.group(1)
    assert "white-space:pre-wrap" in style and "word-break:normal" in style and "overflow-wrap:anywhere" in style
    assert "break-all" not in widget.summary.value


def test_wrapped_notices_and_summary_are_not_double_spaced() -> None:
    # ipywidgets give HTML the line height of a widget row (28 px); wrapped lines need their own
    widget = ProgressWidget()
    widget(Notice("build", "cargo runs in a sandbox: " + "a long explanation " * 20, "info"))
    assert "line-height:1.45" in widget.notice_view.value
    for stage in ("search", "client"):
        widget(StageStarted(stage))
        widget(StageFinished(stage, "done"))
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=1.0))
    assert "line-height:1.45" in widget.summary.value


def test_no_row_waits_for_a_stage_that_only_runs_with_a_model() -> None:
    widget = ProgressWidget()
    assert "edit" not in widget.rows and "pending" not in rendered_states(widget).get("edit", "")
    assert list(widget.rows) == ["search", "fork", "build", "test", "flake", "deploy", "client"]
    widget(StageStarted("search"))
    widget(StageFinished("search", "done"))
    widget(StageStarted("fork"))
    widget(StageFinished("fork", "done"))
    widget(StageStarted("edit"))  # with a model: its row appears, in pipeline order
    keys = list(widget.rows)
    assert keys.index("fork") + 1 == keys.index("edit") < keys.index("build")
    assert widget.rows["edit"].state == "running" and widget.bar.max == 100 * len(widget.rows)


def test_a_handled_fallback_is_not_a_failed_stage() -> None:
    widget = ProgressWidget()
    widget(StageStarted("search"))
    widget(StageFinished("search", "done", "tinyfoo 0.1.0"))
    widget(StageStarted("fork"))
    widget(StageFinished("fork", "failed", "tinyfoo 0.1.0 cannot be resolved offline", 0.2))
    assert widget.rows["fork"].state == "failed"  # nothing has carried on yet
    widget(Notice("search", "tinyfoo 0.1.0 cannot be built as published; trying the next candidate", "warning"))
    widget(StageStarted("fork"))  # the next candidate: the run got past the failure
    assert widget.rows["fork"].state == "handled" and widget.rows["fork-2"].state == "running"
    widget(StageFinished("fork", "done", "/ws/tinybar"))
    for stage in ("build", "test", "flake", "deploy", "client"):
        widget(StageStarted(stage))
        widget(StageFinished(stage, "done"))
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=2.0))
    assert "failed" not in states(widget).values()
    assert "data-state='handled'" in widget.table.value and "#cf222e" not in widget.table.value
    assert widget.bar.bar_style == "success"


def test_the_log_is_hidden_until_there_is_output_and_counts_in_words() -> None:
    widget = ProgressWidget()
    assert widget.log.layout.display == "none"
    for stage in ("search", "fork", "build", "test", "flake", "deploy"):  # a cache hit prints nothing
        widget(StageStarted(stage))
        widget(StageFinished(stage, "cached"))
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=0.3))
    assert widget.log.layout.display == "none" and "Log (0 lines)" not in widget.log.titles
    widget = ProgressWidget()
    widget(StageStarted("build"))
    widget(LogLine("build", "   Compiling x v0.1.0"))
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=0.3))
    assert widget.log.layout.display is None and widget.log.titles[0] == "Log (1 line)"
    widget(LogLine("build", "    Finished release"))
    widget._render_log(0.0)
    assert widget.log.titles[0] == "Log (2 lines)"


@pytest.mark.parametrize("show_error", [False, True])
def test_an_error_before_any_stage_is_one_line(show_error: bool) -> None:
    widget = ProgressWidget("Echo words", show_error=show_error)
    error = UsageError("--name '1bad' is not a valid Python identifier; try '_1bad'.")
    widget(RunFinished(ok=False, error=error, elapsed=0.0))
    assert widget.collapsed and "skipped" not in widget.text()
    shown = [part for part in widget.widget.children if part.layout.display != "none"]
    if show_error:  # the one line is the widget's
        assert shown == [widget.summary] and widget.widget.layout.display is None
        assert "1bad" in widget.summary.value and "<table" not in widget.summary.value
        assert widget.text() == "flakebot: UsageError: --name '1bad' is not a valid Python identifier; try '_1bad'."
    else:  # the one line is the UsageError the magic raises: the widget draws nothing
        assert widget.widget.layout.display == "none" and widget.text() == ""


def test_a_run_that_started_is_not_collapsed() -> None:
    widget = ProgressWidget()
    widget(StageStarted("search"))
    widget(StageFinished("search", "failed", "No crate matches"))
    widget(RunFinished(ok=False, error=ForkError("x"), elapsed=0.1))
    assert not widget.collapsed and widget.widget.layout.display is None and widget.table.layout.display is None


def test_the_bar_does_not_overflow_its_box() -> None:
    # width 100% plus ipywidgets' 2 px margins made a permanent horizontal scrollbar (tests/browser measures it)
    assert ProgressWidget().bar.layout.width == "auto"


def test_one_test_passing_is_singular() -> None:
    widget = ProgressWidget()
    widget(StageStarted("test"))
    widget(StageFinished("test", "done", "1 passed, 0 failed, 0 ignored", 0.5))
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=1.0))
    assert "1 test passing" in widget.counts.value and "1 test passing" in widget.summary.value
    assert "1 tests" not in widget.counts.value + widget.summary.value


def test_an_iteration_row_says_which_error_and_how_long() -> None:
    from flakebot_magic.events import IterationResult

    widget = ProgressWidget()
    widget(StageStarted("edit"))
    error = "error[E0308] src/bin/sha256.rs:8:5: mismatched types"
    widget(
        IterationResult(
            1, 0, 0, 1, run=1, summary="build FAILED: 1 error(s), 0 warning(s)", first_error=error, elapsed=2.5
        )
    )
    row = widget.rows["iteration-1"]
    assert row.state == "failed" and error in row.detail and "build FAILED" in row.detail
    assert "2.5s" in re.search(r"data-stage='iteration-1'.*?</tr>", widget.table.value).group(0)  # type: ignore[union-attr]
    assert "2.5s" in widget.text() and error in widget.text()


def test_a_cached_test_row_gives_the_tools_own_count() -> None:
    """Check run 0 counted 3 tests; the deployed tool has 4: the header and the summary say 4 (issue 21)."""
    from flakebot_magic.backends.base import cached_rows
    from flakebot_magic.events import EventBus, IterationResult

    widget = ProgressWidget()
    widget(StageStarted("edit"))
    widget(IterationResult(0, 3, 0, 0, summary="contract NOT met: 3 passed"))
    widget(StageFinished("edit", "done", "candidate #1 of 3 won", 1.0))
    store = SimpleNamespace(manifest={"tests": {"passed": 4, "failed": 0, "ignored": 0}})
    cached_rows(EventBus([widget]), ("build", "test"), store)  # type: ignore[arg-type]
    assert widget.rows["test"].detail == "4 passed, 0 failed, 0 ignored"
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=1.0))
    assert "4 tests passing" in widget.counts.value and "4 tests passing" in widget.summary.value


def test_the_bar_counts_cargos_compiled_units_within_a_stage() -> None:
    """Issue 37: the bar moved only between stages (about 28% through the whole build stage); now a running
    stage adds its share of cargo's units, by its ``Compiling`` lines against the Cargo.lock's packages."""
    widget = ProgressWidget("Render Markdown text to HTML.", clock=lambda: 100.0)
    widget(StageStarted("search", at=100.0))
    widget(StageFinished("search", "done", "", 1.0, at=101.0))
    widget(StageStarted("build", at=101.0, units=20))
    widget.tick()
    before = widget.bar.value
    for i in range(10):
        widget(LogLine("build", f"   Compiling dep{i} v1.0.0"))
    widget.tick()
    assert widget.bar.value == before + 50  # half of the build stage's step
    for i in range(30):  # more lines than the lock's packages: never past 95% of the step before it ends
        widget(LogLine("build", f"   Compiling more{i} v1.0.0"))
    widget.tick()
    assert widget.bar.value == before + 95
    widget(StageFinished("build", "done", "", 5.0, at=106.0))
    widget.tick()
    assert widget.bar.value == 200


def test_a_baseline_that_misses_the_contract_does_not_read_as_a_failure() -> None:
    """Issue 37: "baseline handled — contract NOT met" in capitals read as a failure."""
    from flakebot_magic.events import IterationResult

    widget = ProgressWidget()
    widget(StageStarted("edit"))
    widget(IterationResult(0, 3, 0, 0, summary="contract NOT met: 3 passed, 0 failed, 0 ignored; 0 warning(s)"))
    row = next(r for r in widget.rows.values() if r.state == "handled")
    assert "NOT" not in row.detail and "not met yet" in row.detail
    assert "NOT" not in widget.table.value


def test_a_widget_whose_kernel_is_gone_says_so_without_javascript() -> None:
    """Issue 37: a kernel restarted under a build left the widget at "building…" with a dead Cancel button.
    JupyterLab reads no message of the old kernel once it asks for a restart, so the live widget carries a note
    that CSS shows when ipywidgets marks the view disconnected (or after a silence); the record never has it."""
    widget = ProgressWidget("Render Markdown text to HTML.", name="md")
    widget(StageStarted("search"))
    widget.tick()
    table = widget.table.value
    assert "class='flakebot-stale'" in table and "visibility:hidden" in table
    assert ".jupyter-widgets-disconnected .flakebot-stale{visibility:visible" in table
    assert (
        ".flakebot-cancel.jupyter-widgets-disconnected,.flakebot-bar.jupyter-widgets-disconnected{display:none" in table
    )
    assert "flakebot-bar" in widget.bar._dom_classes
    # and it reads as a record: "interrupted" for "building…", "stopped" for a running stage, no link icons
    assert "content:'interrupted'" in table and "content:'stopped'" in table
    assert ".flakebot-progress .jupyter-widgets-disconnected::before{display:none" in table
    assert "%flakebot logs md" in table and "<script" not in table
    widget(RunFinished(ok=False, error=RuntimeError("x"), elapsed=1.0))
    assert "flakebot-stale" not in widget.table.value  # ended: nothing to say
    assert "flakebot-stale" not in widget.record().bundle()["text/html"]  # the record needs no kernel and no style


def test_no_crate_fits_is_headed_as_the_answer_it_is_not_as_an_exception_class() -> None:
    """Issue 37, second trial: the record of a refusal was headed "NeedsModelError" in bold, a class name that
    reads as a failure to a newcomer; it is headed "No crate fits", amber, and the message follows escaped."""
    from flakebot_magic.errors import NeedsModelError

    widget = ProgressWidget("Count the words in a text.", name="wc", show_error=True)
    widget(StageStarted("search"))
    widget(RunFinished(ok=False, error=NeedsModelError("No crate does <it> as published."), elapsed=1.0))
    page = widget.record().bundle()["text/html"]
    assert "data-outcome='unfit'" in page
    assert "<b>No crate fits</b>" in page and "NeedsModelError" not in page
    assert "No crate does &lt;it&gt; as published." in page
