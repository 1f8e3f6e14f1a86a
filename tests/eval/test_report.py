"""The report: a replay says so in the table, the HTML and the plot; text from tasks, models and tools is shown safely."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.eval.report import EvalResults, TerminalProgress, safe
from flakebot_magic.eval.results import REPLAY_LABEL, AttemptResult, HiddenResult, document
from flakebot_magic.eval.task import HiddenCheck, Suite, Task, TaskProblem
from flakebot_magic.untrusted import is_safe

EVIL = "\x1b[2J\x1b]0;owned\x07<script>alert(1)</script>"


def _doc(
    tmp_path: Path, *, replay: bool, models: list[dict[str, Any]], attempts: list[AttemptResult]
) -> dict[str, Any]:
    tasks = sorted({a.task for a in attempts})
    suite = Suite(tmp_path, tuple(Task(t, tmp_path, "x", "words", HiddenCheck("pytest", ())) for t in tasks))
    return document(
        suite=suite,
        models=models,
        attempts=attempts,
        config={"replay": replay, "attempts": 1},
        started="then",
        finished="now",
    )


def _replay(tmp_path: Path) -> dict[str, Any]:
    return _doc(
        tmp_path,
        replay=True,
        models=[{"model": "replay", "kind": "replay", "label": "replay (not a model)"}],
        attempts=[
            AttemptResult("hexenc", "replay", 1, True, True, True, HiddenResult(4, 4), seconds=3.0),
            AttemptResult("wrap", "replay", 1, True, False, False, failure="edit-stuck", message=EVIL),
        ],
    )


def _models(tmp_path: Path) -> dict[str, Any]:
    def attempt(model: str, task: str, passed: bool, cost: float | None) -> AttemptResult:
        return AttemptResult(
            task, model, 1, False, passed, passed, prompt_tokens=900, completion_tokens=100, calls=1, cost_usd=cost
        )

    return _doc(
        tmp_path,
        replay=False,
        models=[{"model": m, "kind": "model", "label": m} for m in ("small", "large")],
        attempts=[
            attempt("small", "a", True, 0.001),
            attempt("small", "b", False, 0.001),
            attempt("large", "a", True, 0.02),
            attempt("large", "b", True, 0.02),
        ],
    )


def test_a_replay_says_replay_in_the_table_and_the_html(tmp_path: Path) -> None:
    results = EvalResults(_replay(tmp_path))
    text = results.table()
    assert text.startswith(REPLAY_LABEL) and "replay (not a model)" in text
    page = results._repr_html_()
    assert "REPLAY" in page and "not a model" in page and "replay (not a model)" in page
    assert results.replay and results.summary["replay"]["pass_at_1"] == 0.5


def test_a_models_eval_does_not_say_replay(tmp_path: Path) -> None:
    results = EvalResults(_models(tmp_path))
    assert "replay" not in results.table().lower() and "replay" not in results._repr_html_().lower()
    assert results.summary["large"]["pass_at_1"] == 1.0 and results.summary["small"]["pass_at_1"] == 0.5


def test_untrusted_text_reaches_no_terminal_and_no_page_unescaped(tmp_path: Path) -> None:
    results = EvalResults(_replay(tmp_path))
    text = results.table()
    assert is_safe(text) and "\x1b" not in text and "[2J" not in text
    page = results._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page and "\x1b" not in page
    assert safe("a\rb\x00c") == "a\nb\ufffdc"


def test_progress_on_a_terminal_and_in_a_log(tmp_path: Path) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    result = AttemptResult("t", "m", 1, False, True, True, HiddenResult(2, 2), seconds=1.5)
    for stream, redrawn in ((Tty(), True), (io.StringIO(), False)):
        progress = TerminalProgress(stream, replay=True)
        progress.started(2, 1, [f"broken: {EVIL}"])
        progress.finished(result, resumed=True)
        progress.finished(result, resumed=False)
        progress.ended()
        out = stream.getvalue()
        assert REPLAY_LABEL in out and "(1 finished before)" in out and "2/2 hidden" in out
        assert ("\r\x1b[2K[" in out) is redrawn  # only a terminal gets the bar's own escape
        assert "\x1b]0;owned" not in out and "\x07" not in out


def test_results_load_from_the_out_directory(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps(_replay(tmp_path)))
    assert EvalResults.load(tmp_path).replay is True


def test_the_plot_of_a_replay_says_replay(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    svg = EvalResults(_replay(tmp_path)).plot().svg()
    assert "REPLAY" in svg and "not a model" in svg
    # tokens on the x axis: a replay has no price
    assert "tokens per task" in svg


def test_the_plot_of_priced_models_puts_one_point_per_model_at_its_cost(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plot = EvalResults(_models(tmp_path)).plot()
    assert "REPLAY" not in plot.svg() and "USD per task" in plot.svg()
    axes = plot.figure.axes[0]
    points = sorted(tuple(c.get_offsets()[0]) for c in axes.collections)
    assert points == [(pytest.approx(0.001), pytest.approx(50.0)), (pytest.approx(0.02), pytest.approx(100.0))]
    assert plot.save(tmp_path / "plot.svg").read_text().startswith("<?xml")


def test_no_plotting_library_is_loaded_before_a_plot_is_asked_for() -> None:
    code = "import sys, flakebot_magic, flakebot_magic.eval; print('matplotlib' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_without_matplotlib_the_plot_says_how_to_install_it(tmp_path: Path) -> None:
    code = (
        "import sys, json; sys.modules['matplotlib'] = None\n"
        "from flakebot_magic.eval.report import EvalResults\n"
        "from flakebot_magic.errors import ConfigError\n"
        "try:\n    EvalResults({'models': []}).plot()\n"
        "except ConfigError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'flakebot-magic[eval]'" in out


def test_attempts_a_feedback_eval_did_not_need_are_said_so() -> None:
    stream = io.StringIO()
    progress = TerminalProgress(stream)
    progress.started(4, 0, [])
    progress.finished(AttemptResult("t", "m", 1, False, True, True, HiddenResult(1, 1)), resumed=False)
    progress.ended()
    assert "3 attempt(s) not needed" in stream.getvalue()


def _one_model(tmp_path: Path, passed: bool, *, cost: float | None, label: str, unrunnable: int = 0) -> dict[str, Any]:
    """One model, one task, at 0% or 100%; ``unrunnable`` tasks the preflight kept out."""
    attempt = AttemptResult(
        "a",
        label,
        1,
        False,
        passed,
        True,
        HiddenResult(3 if passed else 0, 3, cause="" if passed else "tests/a.rs::x: assertion failed"),
        prompt_tokens=5000,
        completion_tokens=700,
        calls=2,
        cost_usd=cost,
        failure=None if passed else "hidden-tests-failed",
        message="" if passed else "3 of 3 hidden tests failed",
        cause="" if passed else "tests/a.rs::x: assertion failed",
    )
    task = Task("a", tmp_path, "x", "words", HiddenCheck("pytest", ()))
    left_out = tuple(
        TaskProblem(f"u{i}", tmp_path, "not runnable: dependency z ^0.5 missing") for i in range(unrunnable)
    )
    return document(
        suite=Suite(tmp_path, (task,), (), left_out) if left_out else Suite(tmp_path, (task,)),
        models=[{"model": label, "kind": "model", "label": label}],
        attempts=[attempt],
        config={"replay": False, "attempts": 1},
        started="then",
        finished="now",
    )


@pytest.mark.parametrize("passed", [False, True])
@pytest.mark.parametrize("cost", [None, 0.0, 0.42])
def test_one_model_at_zero_or_all_reads_right_its_point_and_label_inside_the_axes_the_legend_clear(
    tmp_path: Path, passed: bool, cost: float | None
) -> None:
    pytest.importorskip("matplotlib")
    label = "qwen2.5-coder:14b-instruct-q4_K_M"
    summary = {"tasks": 1, "pass_at_1": 1.0 if passed else 0.0, "cost_usd": cost, "tokens": 5700}
    plot = EvalResults({"replay": False, "models": [{"model": label, "label": label, "summary": summary}]}).plot()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = plot.figure
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    axes = figure.axes[0]
    box = axes.get_window_extent(renderer)
    (point,) = [c.get_offsets()[0] for c in axes.collections]
    assert tuple(point) == (pytest.approx(cost if cost is not None else 5700.0), 100.0 if passed else 0.0)
    x, y = axes.transData.transform(point)
    radius = 6  # the marker's, in pixels
    assert box.x0 < x - radius and x + radius < box.x1 and box.y0 < y - radius and y + radius < box.y1
    (text,) = [t for t in axes.texts if t.get_text() == label]
    extent = text.get_window_extent(renderer)
    assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1
    legends = [*figure.legends, *([axes.get_legend()] if axes.get_legend() else [])]
    for legend in legends:  # no legend covers the point
        area = legend.get_window_extent(renderer)
        assert not (area.x0 - radius < x < area.x1 + radius and area.y0 - radius < y < area.y1 + radius)


def test_the_report_says_whose_fault_a_failure_is_its_cause_and_what_was_left_out(tmp_path: Path) -> None:
    data = _one_model(tmp_path, False, cost=0.01, label="m", unrunnable=2)
    text = EvalResults(data).table()
    assert "a / m / try 1: hidden-tests-failed (model's): tests/a.rs::x: assertion failed" in text
    assert "tasks not runnable here (2 of 3, left out of the score" in text and "u0: not runnable" in text
    assert data["models"][0]["summary"]["tasks"] == 1 and data["suite"]["not_runnable"][1]["task"] == "u1"
    page = EvalResults(data)._repr_html_()
    assert "left out of the score" in page and "dependency z ^0.5 missing" in page
    full = EvalResults(_one_model(tmp_path, True, cost=0.01, label="m")).table()
    assert "failures:" not in full and "not runnable" not in full and "1/1" in full
