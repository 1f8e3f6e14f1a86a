"""The live progress widget of ``%%flakebot`` (the only module importing ipywidgets).

:class:`ProgressWidget` is a pipeline observer: it only reads events. One row
per stage (search, fork, each edit/check iteration, build, test, flake,
deploy, client) with its state and elapsed time, the iteration and
passing-test counts, the model's tokens and cost, a live log (collapsed,
shown once there is output), a Cancel button, and at the end a summary with
the diff against the published crate. A stage only some runs have (``edit``,
with a model) gets its row when it starts; under it, one row per candidate
of a speculative edit (the winner starred), and while it runs a box to send
the model a steering message. A failed stage the run got past (a fallback)
is ``handled``, not a red failure. A run that fails before any stage started
(a bad argument) collapses to one line. Its state is plain attributes
(``rows``, ``candidates``, ``usage``, ``bar.bar_style``, ``log_lines``), so
tests assert on it without a browser; ``text()`` is the same progress as
plain text, for front ends that cannot render widgets. The rows' data and
HTML live in :mod:`flakebot_magic.ui_rows`. Every text it shows goes through
:func:`flakebot_magic.untrusted.safe_html` (or ``safe_text`` for the plain
text): a log line, a notice, an error may quote a crate or a model.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as widgets

from .errors import Cancelled
from .events import (
    STAGES,
    CandidateUpdate,
    Event,
    LogLine,
    ModelUsage,
    Notice,
    RunFinished,
    StageFinished,
    StageStarted,
    SteeringMessage,
)
from .ui_rows import (
    FINISHED,
    OPTIONAL_STAGES,
    STATES,
    CandidateTable,
    StageRow,
    SteerLine,
    SteerLog,
    UsageTotals,
    fmt_seconds,
    iteration_outcome,
    stage_table_html,
    stage_text_lines,
    tests_passing,
)
from .untrusted import safe_html, safe_text

__all__ = ["OPTIONAL_STAGES", "STATES", "ProgressWidget", "StageRow"]

_PASSED = re.compile(r"(\d+) passed")
#: cargo's lines worth showing next to a running stage
_PROGRESS_LINE = re.compile(r"^\s*(Compiling|Building|Running|Checking|Finished|Locking|Fresh|Doc-tests)\b")
#: seconds between two renders of the log (cargo prints hundreds of lines a second)
_LOG_EVERY = 0.3
#: ipywidgets give HTML a line height of one widget row (28 px): wrapped text needs its own
_TEXT = "line-height:1.45;white-space:normal"
#: wrap at spaces; break inside a word only when the word alone is wider than the box
_WRAP = "white-space:pre-wrap;word-break:normal;overflow-wrap:anywhere"


class ProgressWidget:
    """Live progress of one run, as ipywidgets.

    Parameters
    ----------
    request
        The request, for the title.
    on_cancel
        Called when the Cancel button is clicked (``BackgroundRun.cancel``).
    diff
        Called with the tool at the end; returns a
        :class:`~flakebot_magic.provenance.WorkspaceDiff` or None.
    stages
        The rows shown as pending from the start (the stages of
        :data:`~flakebot_magic.events.STAGES` but :data:`OPTIONAL_STAGES`);
        any other stage gets its row, in pipeline order, when it starts.
    clock
        ``time.monotonic`` (events carry monotonic times).
    show_error
        Write the error's whole message in the widget at the end. The
        ``%%flakebot`` magic raises the error, and IPython shows it right
        below the widget, so there the widget does not repeat it (the failed
        row carries its first line); a caller that does not raise it (an
        agent's tool call, which gives the error to the model) passes True.
    on_steer
        Called with the text of a steering message when Send is clicked
        (the magic passes ``steering.send`` for the tool). The text box and
        Send show only while the edit stage runs and only when this is
        given; what it raises is shown as a notice, and the text stays in the
        box to send again.

    Examples
    --------
    >>> progress = ProgressWidget("render markdown", on_cancel=run.cancel)  # doctest: +SKIP
    >>> tool = run.wait([progress], tick=progress.tick)                     # doctest: +SKIP
    """

    def __init__(
        self,
        request: str = "",
        *,
        on_cancel: Callable[[], None] | None = None,
        diff: Callable[[Any], Any] | None = None,
        stages: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        log_limit: int = 400,
        show_error: bool = False,
        on_steer: Callable[[str], None] | None = None,
    ) -> None:
        self.request = " ".join(request.split())
        self.on_cancel = on_cancel
        self.diff_provider = diff
        self.clock = clock
        self.show_error = show_error
        self.on_steer = on_steer
        self.started = clock()
        self.rows: dict[str, StageRow] = {}
        if stages is None:
            stages = [stage for stage in STAGES if stage not in OPTIONAL_STAGES]
        for stage in stages:
            self.rows[stage] = StageRow(stage, stage, stage)
        self.log_lines: deque[str | SteerLine] = deque(maxlen=log_limit)
        self.log_count = 0
        self.notices: list[tuple[str, str]] = []
        self.iterations = 0
        self.tests_passing: int | None = None
        self.outcome = "running"  # running | success | failed | cancelled
        self.finished_at: float | None = None
        self.tool: Any = None
        self.error: BaseException | None = None
        self.diff: Any = None
        self.cancel_requested = False
        self.candidates = CandidateTable()
        self.usage = UsageTotals()
        self.steering = SteerLog()
        self._log_dirty = False
        self._log_rendered_at = 0.0

        self.title = widgets.HTML()
        # width auto: the box stretches it; 100% plus ipywidgets' 2 px margins overflowed by 4 px
        self.bar = widgets.IntProgress(
            value=0, min=0, max=len(self.rows), bar_style="info", layout=widgets.Layout(width="auto")
        )
        self.counts = widgets.HTML()
        self.table = widgets.HTML()
        self.notice_view = widgets.HTML()
        self.cancel_button = widgets.Button(
            description="Cancel",
            button_style="danger",
            icon="stop",
            tooltip="Stop the run: kills the running cargo/nix processes and keeps the workspace",
        )
        self.cancel_button.add_class("flakebot-cancel")
        self.cancel_button.on_click(self._cancel_clicked)
        self.steer_view = widgets.HTML()
        self.steer_input = widgets.Text(
            placeholder="Tell the model something (it reads it in its next request)",
            layout=widgets.Layout(flex="1 1 auto", width="auto"),
        )
        self.steer_button = widgets.Button(
            description="Send", icon="paper-plane", tooltip="Send this to the model while it edits"
        )
        self.steer_button.on_click(self._steer_clicked)
        # only while the edit stage runs, and only when there is somewhere to send it
        self.steer_box = widgets.HBox(
            [self.steer_input, self.steer_button], layout=widgets.Layout(display="none", width="100%")
        )
        self.steer_box.add_class("flakebot-steer-box")
        self.log_view = widgets.HTML()
        # shown once there is output: a cache hit has none, and "Log (0 lines)" says nothing
        self.log = widgets.Accordion(
            children=[self.log_view], selected_index=None, layout=widgets.Layout(display="none")
        )
        self.log.set_title(0, "Log")
        self.summary = widgets.HTML()
        self.diff_view = widgets.HTML()
        self.diff_box = widgets.Accordion(
            children=[self.diff_view], selected_index=None, layout=widgets.Layout(display="none")
        )
        self.diff_box.set_title(0, "Changes against the published crate")
        self.widget = widgets.VBox(
            [
                self.title,
                self.bar,
                self.counts,
                self.table,
                self.notice_view,
                self.steer_view,
                self.steer_box,
                self.cancel_button,
                self.summary,
                self.diff_box,
                self.log,
            ],
            layout=widgets.Layout(width="100%", max_width="960px"),
        )
        self.widget.add_class("flakebot-progress")
        self._render_all()

    # -- observing --------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        if isinstance(event, LogLine):
            self._on_log(event)
        elif isinstance(event, StageStarted):
            self._carried_on()
            row = self._row_to_start(event.stage)
            row.state, row.started, row.elapsed, row.live = "running", event.at, None, ""
            row.detail = event.detail
            if event.stage == "edit":
                self._show_steer(True)
            self._render_table()
        elif isinstance(event, StageFinished):
            row = self._row_to_finish(event.stage)
            row.state = event.status if event.status in STATES else "done"
            row.elapsed, row.live = event.elapsed, ""
            if row.started is None:
                row.started = event.at - event.elapsed
            row.detail = event.detail or row.detail
            if self.cancel_requested and row.state == "failed":
                row.state = "cancelled"
            if event.stage == "test":
                found = _PASSED.search(event.detail)
                if found:
                    self.tests_passing = int(found.group(1))
            elif event.stage == "edit":
                self._show_steer(False)
            self._render_table()
        elif isinstance(event, Notice):
            if event.stage == "run" and event.level == "warning":
                self.cancel_requested = True
            self.notices.append((event.level, event.message))
            self._render_notices()
        elif isinstance(event, RunFinished):
            self._finish(event)
        elif isinstance(event, CandidateUpdate):
            self.candidates.update(event)
            self._render_table()
        elif isinstance(event, ModelUsage):
            self.usage.add(event)
            self._render_title(self.clock())
            if self.candidates:
                self._render_table()
        elif isinstance(event, SteeringMessage):
            self._on_steering(event)
        elif type(event).__name__ == "IterationResult":
            self._on_iteration(event)

    def tick(self) -> None:
        """Refresh the running rows' elapsed time and the log; call it a few times a second."""
        now = self.clock()
        if self.outcome == "running":
            self._render_table()
            self._render_title(now)
        if self._log_dirty and now - self._log_rendered_at >= _LOG_EVERY:
            self._render_log(now)

    # -- rows ---------------------------------------------------------------------

    def _latest(self, stage: str) -> StageRow | None:
        found = None
        for row in self.rows.values():
            if row.stage == stage:
                found = row
        return found

    def _new_row(self, stage: str) -> StageRow:
        count = sum(1 for row in self.rows.values() if row.stage == stage)
        key = stage if count == 0 else f"{stage}-{count + 1}"
        row = StageRow(key, stage, stage if count == 0 else f"{stage} {count + 1}")
        keys = list(self.rows)
        previous = [i for i, k in enumerate(keys) if self.rows[k].stage == stage]
        if previous:  # a repeated stage (edit, check) goes right after its previous row
            at = previous[-1] + 1
        elif stage in STAGES:  # a first row in pipeline order: before the rows of later stages
            later = set(STAGES[STAGES.index(stage) + 1 :])
            at = next((i for i, k in enumerate(keys) if self.rows[k].stage in later), len(keys))
        else:
            at = len(keys)
        keys.insert(at, key)
        rows = dict(self.rows)
        rows[key] = row
        self.rows = {k: rows[k] for k in keys}
        self.bar.max = len(self.rows)
        return row

    def _carried_on(self) -> None:
        """A stage starts after another failed: the run got past that failure (a fallback), so it was handled."""
        for row in self.rows.values():
            if row.state == "failed" and row.stage != "iteration":
                row.state = "handled"

    def _row_to_start(self, stage: str) -> StageRow:
        row = self._latest(stage)
        if row is None or row.state != "pending":
            row = self._new_row(stage)
        return row

    def _row_to_finish(self, stage: str) -> StageRow:
        row = self._latest(stage)
        if row is None or row.state in FINISHED:
            row = self._new_row(stage)
        return row

    def _on_log(self, event: LogLine) -> None:
        self.log_lines.append(f"{event.stage}| {event.line}")
        self.log_count += 1
        self._log_dirty = True
        if self.log_count == 1:
            self.log.layout.display = None
        if _PROGRESS_LINE.match(event.line):
            row = self._latest(event.stage)
            if row is not None and row.state == "running":
                row.live = event.line.strip()[:90]

    # -- steering -------------------------------------------------------------------

    def _show_steer(self, shown: bool) -> None:
        """The steer box shows while the edit stage runs, when there is somewhere to send (``on_steer``)."""
        shown = shown and self.on_steer is not None and self.outcome == "running" and not self.cancel_requested
        self.steer_box.layout.display = None if shown else "none"
        self.steer_input.disabled = self.steer_button.disabled = not shown

    def _steer_clicked(self, _button: Any = None) -> None:
        text = self.steer_input.value.strip()
        if not text or self.on_steer is None or self.steer_button.disabled:
            return
        try:
            self.on_steer(text)
        except Exception as exc:  # the reason, as a notice; the text stays in the box to send again
            self.notices.append(("warning", f"The message was not sent: {exc}"))
            self._render_notices()
            return
        self.steer_input.value = ""
        self._add_steer_line(self.steering.sent(text))

    def _on_steering(self, event: SteeringMessage) -> None:
        line, new = self.steering.record(event)
        if new:
            self._add_steer_line(line)
        else:
            self._log_dirty = True
            self.steer_view.value = self.steering.html()

    def _add_steer_line(self, line: SteerLine) -> None:
        self.log_lines.append(line)
        self.log_count += 1
        self._log_dirty = True
        self.log.layout.display = None
        self.steer_view.value = self.steering.html()

    def _on_iteration(self, event: Any) -> None:
        """An edit/check iteration of the edit loop (``events.IterationResult``), read by duck typing."""
        number = int(getattr(event, "iteration", self.iterations + 1) or 0)
        run = int(getattr(event, "run", 0) or 0)
        self.iterations = max(self.iterations, number)
        passed = getattr(event, "passed", None)
        if passed is not None and not getattr(event, "reverted", False):
            self.tests_passing = int(passed)
        key = f"iteration-{run or number}"
        row = self.rows.get(key)
        if row is None:
            label = "baseline" if number == 0 and not run else f"iteration {number}"
            if run and sum(1 for r in self.rows.values() if r.stage == "iteration" and r.label.startswith(label)):
                label = f"{label} (run {run})"
            row = StageRow(key, "iteration", label)
            keys = list(self.rows)
            # iterations go after the edit row (and the iterations before them)
            after = [i for i, k in enumerate(keys) if self.rows[k].stage in ("edit", "iteration")]
            keys.insert(after[-1] + 1 if after else len(keys), key)
            rows = dict(self.rows)
            rows[key] = row
            self.rows = {k: rows[k] for k in keys}
            self.bar.max = len(self.rows)
        row.state, row.detail = iteration_outcome(event)
        row.elapsed = getattr(event, "elapsed", None)
        self._render_table()
        self._render_title(self.clock())

    # -- the end ------------------------------------------------------------------

    def _finish(self, event: RunFinished) -> None:
        self.finished_at = event.at
        self.tool, self.error = event.tool, event.error
        cancelled = isinstance(event.error, (Cancelled, KeyboardInterrupt))
        self.outcome = "success" if event.ok else "cancelled" if cancelled else "failed"
        for row in self.rows.values():
            if row.state == "running":
                row.state = "cancelled" if cancelled else "failed"
                row.elapsed = event.at - row.started if row.started is not None else None
            elif row.state == "pending":
                row.state = "skipped"
        self.candidates.stop()
        self._show_steer(False)
        self.bar.value = self.bar.max
        self.bar.bar_style = {"success": "success", "cancelled": "warning"}.get(self.outcome, "danger")
        self.cancel_button.layout.display = "none"
        if self.collapsed:  # one line, or none when the caller shows the error itself
            for part in self.widget.children:
                if part is not self.summary:
                    part.layout.display = "none"
            if not self.show_error:
                self.widget.layout.display = "none"
        if event.ok and self.diff_provider is not None:
            try:
                self.diff = self.diff_provider(event.tool)
            except Exception as exc:  # a missing diff must not hide the result
                self.notices.append(("warning", f"could not compute the diff: {exc}"))
        if self.diff is not None:
            self.diff_view.value = self.diff.to_html()
            self.diff_box.set_title(0, f"Changes: {self.diff.summary}")
            self.diff_box.layout.display = None
        self._render_all(self.finished_at)

    @property
    def collapsed(self) -> bool:
        """The run failed before any stage started (a bad argument): one line says it all."""
        return self.outcome in ("failed", "cancelled") and all(row.started is None for row in self.rows.values())

    def _cancel_clicked(self, _button: Any = None) -> None:
        if self.outcome != "running" or self.cancel_button.disabled:
            return
        self.cancel_requested = True
        self.cancel_button.disabled = True
        self.cancel_button.description = "Cancelling…"
        self._show_steer(False)
        if self.on_cancel is not None:
            self.on_cancel()

    # -- rendering ------------------------------------------------------------------

    def _render_all(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        self._render_title(now)
        self._render_table(now)
        self._render_notices()
        self._render_summary(now)
        self._render_log(now)

    def _render_title(self, now: float) -> None:
        end = self.finished_at if self.finished_at is not None else now
        elapsed = fmt_seconds(end - self.started)
        word = {
            "running": "building…",
            "success": "ready",
            "failed": "failed",
            "cancelled": "cancelled",
        }[self.outcome]
        color = {"running": "#0969da", "success": "#1a7f37", "failed": "#cf222e", "cancelled": "#9a6700"}[self.outcome]
        name = f" <code>{safe_html(self.tool.name)}</code>" if self.tool is not None else ""
        request = f" — {safe_html(self.request[:100])}" if self.request else ""
        self.title.value = (
            f"<div class='flakebot-title' data-outcome='{self.outcome}' style='font-size:14px'>"
            f"<b>flakebot</b>{name}{request} · "
            f"<span class='flakebot-outcome' style='color:{color};font-weight:bold'>{word}</span> "
            f"<span style='color:#57606a'>{elapsed}</span></div>"
        )
        counts = []
        if self.iterations:
            counts.append(f"iteration {self.iterations}")
        if self.tests_passing is not None:
            counts.append(tests_passing(self.tests_passing))
        if self.usage.total().spent:  # summed over candidates and roles, live
            counts.append(self.usage.html())
        self.counts.value = (
            f"<div class='flakebot-counts' style='color:#57606a'>{' · '.join(counts)}</div>" if counts else ""
        )

    def _render_table(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        finished = sum(1 for row in self.rows.values() if row.state in FINISHED)
        if self.outcome == "running":
            self.bar.value = min(finished, self.bar.max)
        self.table.value = stage_table_html(
            self.rows.values(), now, self.candidates, self.usage, settled=self.outcome == "success"
        )

    def _render_notices(self) -> None:
        items = []
        for level, message in self.notices[-8:]:
            color = "#9a6700" if level == "warning" else "#57606a"
            items.append(
                f"<div class='flakebot-notice' data-level='{level}' style='color:{color};margin:2px 0'>"
                f"{'⚠ ' if level == 'warning' else ''}{safe_html(message)}</div>"
            )
        self.notice_view.value = (
            f"<div class='flakebot-notices' style='font-size:12px;{_TEXT}'>{''.join(items)}</div>" if items else ""
        )

    def _render_log(self, now: float) -> None:
        self._log_dirty = False
        self._log_rendered_at = now
        shown = "\n".join(line if isinstance(line, str) else f"{line.stage}| {line}" for line in self.log_lines)
        more = self.log_count - len(self.log_lines)
        head = f"… {more} earlier lines in the saved log (%flakebot logs NAME)\n" if more > 0 else ""
        self.log_view.value = (
            f"<pre class='flakebot-log' style='max-height:320px;overflow:auto;font-size:12px;margin:0;{_WRAP}'>"
            f"{safe_html(head + shown) or '(no output yet)'}</pre>"
        )
        count = self.log_count
        self.log.set_title(0, f"Log ({count} line{'' if count == 1 else 's'})" if count else "Log")

    def _render_summary(self, now: float) -> None:
        if self.outcome == "running":
            self.summary.value = ""
            return
        if self.outcome == "success" and self.tool is not None:
            tool = self.tool
            example = safe_html(tool.example()) if hasattr(tool, "example") else ""
            tests = f"{tests_passing(self.tests_passing)} · " if self.tests_passing is not None else ""
            extra = ""
            winner = self.candidates.winner
            if winner is not None:
                score = f": {safe_html(winner.score)}" if winner.score else ""
                extra += f"chosen: candidate {safe_html(winner.label)} of {len(self.candidates.rows)}{score}<br>"
            if self.usage.total().spent:
                extra += f"model: {self.usage.html()}<br>"
            self.summary.value = (
                "<div class='flakebot-summary' data-outcome='success' "
                f"style='border-left:3px solid #1a7f37;padding-left:8px;{_TEXT}'>"
                f"<b><code>{safe_html(tool.name)}</code></b> is ready: {safe_html(tool.crate)} {safe_html(tool.version)} "
                f"({tests}{safe_html(getattr(tool, 'backend', ''))})<br>"
                f"call it: <code>{example}</code><br>{extra}"
                f"<span style='color:#57606a'>store: <code>{safe_html(str(tool.store_path))}</code></span></div>"
            )
            return
        error = self.error
        message = str(error) if error is not None else "the run failed"
        lines = message.splitlines()
        kind = type(error).__name__ if error is not None else "Error"
        color = "#9a6700" if self.outcome == "cancelled" else "#cf222e"
        if not self.show_error:  # the caller raises it: IPython shows it below, once
            self.summary.value = ""
            return
        if self.collapsed:
            self.summary.value = (
                f"<div class='flakebot-summary' data-outcome='{self.outcome}' style='color:{color};{_TEXT}'>"
                f"<b>flakebot</b>: {safe_html(kind)}: {safe_html(' '.join(lines[:3]))}</div>"
            )
            return
        self.summary.value = (
            f"<div class='flakebot-summary' data-outcome='{self.outcome}' "
            f"style='border-left:3px solid {color};padding-left:8px;{_TEXT}'>"
            f"<b>{safe_html(kind)}</b><pre style='{_WRAP};margin:0'>"
            f"{safe_html(chr(10).join(lines[:40]))}</pre></div>"
        )

    # -- plain text ---------------------------------------------------------------

    def text(self) -> str:
        """The same progress as plain text (for front ends without a widget manager)."""
        now = self.finished_at if self.finished_at is not None else self.clock()
        error = f"{type(self.error).__name__}: {str(self.error).splitlines()[0] if str(self.error) else ''}"
        if self.collapsed:
            return f"flakebot: {error}" if self.show_error else ""
        lines = []
        head = {"running": "building…", "success": "ready", "failed": "failed", "cancelled": "cancelled"}[self.outcome]
        lines.append(f"flakebot: {self.request[:80]} — {head} ({fmt_seconds(now - self.started)})")
        if self.usage.total().spent:
            lines.append(f"  model: {self.usage.total().text()}")
        lines += stage_text_lines(self.rows.values(), now, self.candidates, self.usage)
        for level, message in self.notices:
            lines.append(f"  {'warning: ' if level == 'warning' else ''}{message}")
        lines += [f"  {line}" for line in self.steering.lines]
        if self.outcome == "success" and self.tool is not None and hasattr(self.tool, "example"):
            lines.append(f"  `{self.tool.name}` is ready: {self.tool.example()}")
        elif self.error is not None and self.show_error:
            lines.append(f"  {error}")
        if self.diff is not None:
            lines.append(f"  {self.diff.summary}")
        return safe_text("\n".join(lines))

    def __repr__(self) -> str:
        return self.text()

    def mimebundle(self) -> dict[str, Any]:
        """The display data: the widget view, and the plain text for front ends without widgets."""
        return {
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2,
                "version_minor": 0,
                "model_id": self.widget.model_id,
            },
            "text/plain": self.text(),
        }
