"""The progress widget's edit-session parts, headless: candidate rows, the model's usage, steering messages, the steer box.

Driven with synthetic pipeline events, as tests/test_ui.py does; assertions on the rendered HTML and ``text()``.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace

from flakebot_magic.errors import Cancelled, UsageError
from flakebot_magic.events import (
    CandidateUpdate,
    ModelUsage,
    Notice,
    RunFinished,
    StageFinished,
    StageStarted,
    SteeringMessage,
)
from flakebot_magic.views.progress import TextProgress
from flakebot_magic.views.rows import UsageTotals
from flakebot_magic.views.widget import ProgressWidget

SCORE = "contract ✓ · 3/3 examples · 12 tests · 0 clippy · 40 lines"


def fake_tool() -> SimpleNamespace:
    return SimpleNamespace(
        name="hexup",
        crate="tinyhex",
        version="0.1.0",
        backend="cargo",
        store_path=Path("/store/abc-tinyhex-0.1.0"),
        example=lambda: 'hexup("ff")',
    )


def candidate_states(widget: ProgressWidget) -> dict[int, str]:
    return {
        int(i): state for i, state in re.findall(r"data-candidate='(\d+)' data-state='([^']+)'", widget.table.value)
    }


def candidate_row(widget: ProgressWidget, index: int) -> str:
    found = re.search(rf"<tr class='flakebot-candidate' data-candidate='{index}'.*?</tr>", widget.table.value)
    assert found is not None, widget.table.value
    return found.group(0)


def to_edit(widget: ProgressWidget) -> None:
    for stage in ("search", "fork"):
        widget(StageStarted(stage))
        widget(StageFinished(stage, "done"))
    widget(StageStarted("edit"))


def to_end(widget: ProgressWidget, *, ok: bool = True) -> None:
    widget(StageFinished("edit", "done" if ok else "failed", "green"))
    if ok:
        for stage in ("build", "test", "flake", "deploy", "client"):
            widget(StageStarted(stage))
            widget(StageFinished(stage, "done"))
        widget(RunFinished(ok=True, tool=fake_tool(), elapsed=5.0))
    else:
        widget(RunFinished(ok=False, error=UsageError("no candidate went green"), elapsed=5.0))


def test_one_row_per_candidate_under_the_edit_stage_and_the_winner_starred() -> None:
    widget = ProgressWidget("uppercase hex")
    to_edit(widget)
    for i, crate in enumerate(("tinyhex", "tinyhex", "hexfmt")):
        widget(CandidateUpdate(i, "waiting", crate=crate))
    assert candidate_states(widget) == {0: "waiting", 1: "waiting", 2: "waiting"}
    widget(CandidateUpdate(0, "editing", iteration=1))
    widget(CandidateUpdate(1, "editing", iteration=2))
    widget(CandidateUpdate(2, "failed", iteration=3, detail="cargo build failed"))
    assert "#2 hexfmt" in candidate_row(widget, 2) and "#0 tinyhex" in candidate_row(widget, 0)
    assert "iteration 2" in candidate_row(widget, 1)
    assert "#cf222e" in candidate_row(widget, 2)  # no winner yet: a failed candidate is a failure
    # the candidates sit right after the edit row, before build
    table = widget.table.value
    assert table.index("data-stage='edit'") < table.index("data-candidate='0'") < table.index("data-stage='build'")

    widget(CandidateUpdate(0, "green", iteration=3, score=SCORE))
    widget(CandidateUpdate(0, "winner", iteration=3))  # a later update without a score keeps the score
    widget(CandidateUpdate(1, "cancelled", iteration=2, detail="candidate #0 cannot be beaten"))
    assert candidate_states(widget) == {0: "winner", 1: "cancelled", 2: "failed"}
    winner = candidate_row(widget, 0)
    assert "★" in winner and "font-weight:bold" in winner and "3/3 examples" in winner
    for loser in (1, 2):  # handled outcomes: dimmed, never red, and in the text's own colour (read on a dark theme)
        row = candidate_row(widget, loser)
        assert "opacity:0.72" in row and "color:" not in row and "★" not in row
    to_end(widget)
    assert "chosen: candidate #0 tinyhex of 3" in widget.summary.value and "3/3 examples" in widget.summary.value
    text = widget.text()
    assert "★ #0 tinyhex" in text and "winner" in text and "cancelled" in text
    lines = text.splitlines()
    edit = next(i for i, line in enumerate(lines) if " edit " in line)
    assert "#0 tinyhex" in lines[edit + 1] and "#2 hexfmt" in lines[edit + 3]
    assert "#cf222e" not in widget.table.value  # no red anywhere: the run succeeded


def test_a_plain_session_has_no_candidate_rows() -> None:
    widget = ProgressWidget("uppercase hex")
    to_edit(widget)
    to_end(widget)
    assert "flakebot-candidate" not in widget.table.value and "#0" not in widget.text()
    assert widget.text().count("\n") == len(widget.rows) + 1  # the header, the rows, the ready line


def test_candidates_still_running_when_the_run_ends_are_cancelled_not_failed() -> None:
    widget = ProgressWidget()
    to_edit(widget)
    widget(CandidateUpdate(0, "editing", iteration=1, crate="tinyhex"))
    widget(CandidateUpdate(1, "waiting", crate="tinyhex"))
    widget(Notice("run", "cancelled from the widget", "warning"))
    widget(RunFinished(ok=False, error=Cancelled("Stopped during the edit session."), elapsed=1.0))
    assert candidate_states(widget) == {0: "cancelled", 1: "cancelled"}
    assert "#cf222e" not in candidate_row(widget, 0)


def test_usage_sums_candidates_and_the_architect_running_totals_replaced_final_kept() -> None:
    widget = ProgressWidget()
    to_edit(widget)
    assert "token" not in widget.counts.value  # nothing spent yet, nothing shown
    widget(ModelUsage(1000, calls=1, cached_tokens=0, cost_usd=0.001, final=False, candidate=0))
    widget(ModelUsage(2500, calls=2, cached_tokens=400, cost_usd=0.0025, final=False, candidate=0))  # replaces
    widget(ModelUsage(3000, calls=2, cached_tokens=100, cost_usd=0.003, final=False, candidate=1))
    widget(ModelUsage(500, calls=1, cost_usd=0.0005, final=True, candidate=None, role="architect"))
    assert "6,000 tokens (500 cached) · $0.0060" in widget.counts.value
    widget(ModelUsage(2600, calls=3, cached_tokens=400, cost_usd=0.0026, final=True, candidate=0))
    widget(ModelUsage(9999, calls=9, cost_usd=1.0, final=False, candidate=3, role="engineer"))
    widget(ModelUsage(0, calls=0, cost_usd=0.0, final=True, candidate=3))  # its last word: it spent nothing
    assert "6,100 tokens (500 cached) · $0.0061" in widget.counts.value
    assert "2,600 tokens" not in widget.table.value  # per candidate only in the candidates' rows: none yet
    widget(CandidateUpdate(0, "editing", iteration=1, crate="tinyhex"))
    assert "2,600 tokens (400 cached)" in candidate_row(widget, 0)
    assert "model: 6,100 tokens (500 cached) · $0.0061" in widget.text()
    title = re.search(r"class='flakebot-usage' title='([^']*)'", widget.counts.value)
    assert title is not None and "6 model calls" in title.group(1)
    to_end(widget)
    assert "model: <span class='flakebot-usage'" in widget.summary.value and "$0.0061" in widget.summary.value


def test_a_follow_up_session_adds_to_what_the_first_spent() -> None:
    totals = UsageTotals()
    totals.add(ModelUsage(1234, calls=3))  # the first session's last word (a plain session: no candidate)
    totals.add(ModelUsage(40, calls=1, final=False))  # a follow-up in the same build, running
    assert totals.total().tokens == 1274
    totals.add(ModelUsage(66, calls=1))
    assert totals.total().tokens == 1300 and totals.total().calls == 4


def test_cost_is_shown_only_when_a_price_is_known() -> None:
    widget = ProgressWidget()
    to_edit(widget)
    widget(ModelUsage(12345, calls=2, cached_tokens=1000, final=False))
    assert "12,345 tokens (1,000 cached)" in widget.counts.value and "$" not in widget.counts.value
    assert "$" not in widget.text()
    widget(ModelUsage(100, calls=1, cost_usd=0.25, final=True, role="architect"))
    # one part priced, one not: the cost shown is a lower bound, and says so
    assert "12,445 tokens (1,000 cached) · ≥ $0.2500" in widget.counts.value
    assert "no price for a model" in widget.counts.value


def test_steering_messages_are_logged_and_marked_delivered() -> None:
    widget = ProgressWidget()
    to_edit(widget)
    widget(SteeringMessage("also accept --upper", source="cli"))
    assert widget.log.layout.display is None  # the log shows once it has a line
    widget._render_log(0.0)
    assert "edit| → you via cli: also accept --upper · queued" in widget.log_view.value
    assert "also accept --upper" in widget.steer_view.value
    widget(SteeringMessage("also accept --upper", source="cli", delivered=True))
    widget._render_log(0.0)
    assert widget.log_view.value.count("also accept --upper") == 1
    assert "also accept --upper · delivered" in widget.log_view.value
    assert "data-status='delivered'" in widget.steer_view.value
    assert "→ you via cli: also accept --upper · delivered" in widget.text()


def test_the_steer_box_sends_clears_and_shows_an_error_as_a_notice() -> None:
    sent: list[str] = []

    def on_steer(text: str) -> None:
        if "refuse" in text:
            raise UsageError("No edit session of `hexup` is running; start one with %%flakebot.")
        sent.append(text)

    widget = ProgressWidget(on_steer=on_steer)
    assert widget.steer_box.layout.display == "none"  # no edit stage yet
    to_edit(widget)
    assert widget.steer_box.layout.display is None and not widget.steer_button.disabled
    widget.steer_input.value = "  also accept --upper  "
    widget.steer_button.click()
    assert sent == ["also accept --upper"] and widget.steer_input.value == ""
    assert "→ you: also accept --upper · queued" in widget.steer_view.value
    widget(SteeringMessage("also accept --upper", source="widget"))  # the session took it: the same line
    widget(SteeringMessage("also accept --upper", source="widget", delivered=True))
    assert widget.steering.lines[0].status == "delivered" and len(widget.steering.lines) == 1
    widget.steer_input.value = ""
    widget.steer_button.click()  # nothing to send
    assert sent == ["also accept --upper"]
    widget.steer_input.value = "please refuse"
    widget.steer_button.click()
    assert sent == ["also accept --upper"] and widget.steer_input.value == "please refuse"  # kept, to send again
    assert "The message was not sent: No edit session of `hexup` is running" in widget.notice_view.value
    assert "Traceback" not in widget.notice_view.value
    widget(StageFinished("edit", "done", "green"))
    assert widget.steer_box.layout.display == "none" and widget.steer_button.disabled
    widget.steer_input.value = "too late"
    widget.steer_button.click()
    assert sent == ["also accept --upper"]


def test_the_steer_box_is_off_after_the_run_and_without_a_callback_or_an_edit_stage() -> None:
    sent: list[str] = []
    widget = ProgressWidget(on_steer=sent.append)
    to_edit(widget)
    widget(RunFinished(ok=False, error=UsageError("stopped"), elapsed=1.0))  # the edit stage never finished
    assert widget.steer_box.layout.display == "none" and widget.steer_button.disabled and widget.steer_input.disabled
    widget.steer_input.value = "after the end"
    widget.steer_button.click()
    assert sent == []

    widget = ProgressWidget(on_steer=sent.append)  # a run without a model: no edit stage, never a box
    for stage in ("search", "fork", "build", "test", "flake", "deploy", "client"):
        widget(StageStarted(stage))
        assert widget.steer_box.layout.display == "none"
        widget(StageFinished(stage, "done"))
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=1.0))
    assert widget.steer_box.layout.display == "none"

    widget = ProgressWidget()  # no callback: nowhere to send, no box
    to_edit(widget)
    assert widget.steer_box.layout.display == "none" and widget.steer_button.disabled

    widget = ProgressWidget(on_steer=sent.append)  # a cancel stops the run: no more messages
    to_edit(widget)
    widget.cancel_button.click()
    assert widget.steer_box.layout.display == "none"


def test_printed_progress_says_the_same() -> None:
    out = io.StringIO()
    progress = TextProgress(out)
    progress(StageStarted("edit"))
    progress(CandidateUpdate(0, "editing", iteration=1, crate="tinyhex"))
    progress(CandidateUpdate(0, "editing", iteration=2))  # the same state: no new line
    progress(ModelUsage(700, calls=1, cached_tokens=200, cost_usd=0.0123, final=True, candidate=0))
    progress(CandidateUpdate(0, "winner", iteration=2, score=SCORE))
    progress(SteeringMessage("also accept --upper", source="cli", delivered=True))
    progress(RunFinished(ok=True, elapsed=2.0))
    lines = [" ".join(line.split()) for line in out.getvalue().splitlines()]
    assert lines[0] == "flakebot: edit candidate #0 tinyhex editing iteration 1"
    assert lines[1].startswith("flakebot: edit candidate #0 tinyhex winner iteration 2 · contract ✓")
    assert lines[1].endswith("700 tokens (200 cached) · $0.0123")
    assert lines[2] == "flakebot: edit → you via cli: also accept --upper · delivered"
    assert lines[3] == "flakebot: model 700 tokens (200 cached) · $0.0123"
    assert lines[4] == "flakebot: done in 2.00s" and len(lines) == 5
