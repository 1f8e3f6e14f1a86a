"""The live progress widget of ``%%flakebot`` (the only module using ipywidgets; the magic checks it is there).

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
HTML live in :mod:`flakebot_magic.views.rows`, the other parts' HTML in
:mod:`flakebot_magic.views.record`. The widget is for the build while it runs:
at the end :meth:`ProgressWidget.record` is what the cell keeps (static
HTML and text, no widget), and :meth:`ProgressWidget.close` lets the
widget's models go.
Every text it shows goes through :func:`flakebot_magic.untrusted.safe_html`
(or ``safe_text`` for the plain text): a log line, a notice, an error may
quote a crate or a model.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as widgets
import traitlets

from ..errors import Cancelled
from ..events import (
    INDEXING,
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
from ..untrusted import not_math
from .record import (
    RECORD_LOG_LINES,
    BuildRecord,
    RequestTitle,
    collapsed,
    counts_html,
    log_html,
    notices_html,
    stale_note,
    title_html,
    unfinished_html,
)
from .rows import (
    FINISHED,
    OPTIONAL_STAGES,
    STATES,
    CandidateTable,
    StageRow,
    SteerLine,
    SteerLog,
    UsageTotals,
    iteration_outcome,
    stage_table_html,
)

__all__ = ["OPTIONAL_STAGES", "STATES", "ProgressWidget", "StageRow", "TextHTML"]

_PASSED = re.compile(r"(?<!\d)(\d+) passed")
#: cargo's lines worth showing next to a running stage
_PROGRESS_LINE = re.compile(rf"^\s*(Compiling|Building|Running|Checking|Finished|Locking|Fresh|Doc-tests|{INDEXING})\b")
#: seconds between two renders of the log (cargo prints hundreds of lines a second)
_LOG_EVERY = 0.3


class TextHTML(widgets.HTML):
    """An HTML widget whose text MathJax leaves alone (:func:`~flakebot_magic.untrusted.not_math`): the front end
    typesets each HTML widget's content, so every value is wrapped, whoever sets it."""

    @traitlets.validate("value")
    def _not_math(self, proposal: dict[str, Any]) -> str:
        value = str(proposal["value"])
        return value if not value or value.startswith(not_math("")[:-6]) else not_math(value)


class ProgressWidget:
    """Live progress of one run, as ipywidgets.

    Parameters
    ----------
    request
        The request, for the title (its ``>>>`` examples are counted, not shown).
    name, crate
        The tool's name and crate when the magic knows them (``--name``,
        ``--crate``): the title keeps the name whatever the outcome.
    on_cancel
        Called when the Cancel button is clicked (``BackgroundRun.cancel``).
    diff
        Called with the tool at the end; returns a
        :class:`~flakebot_magic.records.provenance.WorkspaceDiff`, a list of them
        (a follow-up's: against the published crate and against the tool's
        previous version), or None.
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
        name: str | None = None,
        crate: str | None = None,
        on_cancel: Callable[[], None] | None = None,
        diff: Callable[[Any], Any] | None = None,
        stages: Iterable[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        log_limit: int = 400,
        show_error: bool = False,
        on_steer: Callable[[str], None] | None = None,
    ) -> None:
        self.heading = RequestTitle.of(request, crate=crate or "")
        self.name = name or ""
        self.on_cancel = on_cancel
        self.diff_provider = diff
        self.clock = clock
        self.show_error = show_error
        self.on_steer = on_steer
        self.started = clock()
        self.rows: dict[str, StageRow] = {}
        #: per running row: [cargo units compiled so far, units at most] (the progress bar counts them)
        self.units: dict[str, list[int]] = {}
        if stages is None:
            stages = [stage for stage in STAGES if stage not in OPTIONAL_STAGES]
        for stage in stages:
            self.rows[stage] = StageRow(stage, stage, stage)
        self.log_lines: deque[str | SteerLine] = deque(maxlen=log_limit)
        self.log_count = 0
        self.notices: list[tuple[str, str]] = []
        self.iterations = 0
        self.tests_passing: int | None = None
        self.outcome = "running"  # running | success | failed | cancelled | unfit
        self.finished_at: float | None = None
        self.tool: Any = None
        self.error: BaseException | None = None
        self.diffs: list[Any] = []
        self.cancel_requested = False
        self.candidates = CandidateTable()
        self.usage = UsageTotals()
        self.steering = SteerLog()
        self._log_dirty = False
        self._log_rendered_at = 0.0

        self.title = TextHTML()
        # width auto: the box stretches it; 100% plus ipywidgets' 2 px margins overflowed by 4 px
        self.bar = widgets.IntProgress(
            value=0, min=0, max=100 * len(self.rows), bar_style="info", layout=widgets.Layout(width="auto")
        ).add_class("flakebot-bar")
        self.counts = TextHTML()
        self.table = TextHTML()
        self.notice_view = TextHTML()
        self.cancel_button = widgets.Button(
            description="Cancel",
            button_style="danger",
            icon="stop",
            tooltip="Stop the run: kills the running cargo/nix processes and keeps the workspace",
        )
        self.cancel_button.add_class("flakebot-cancel")
        self.cancel_button.on_click(self._cancel_clicked)
        self.steer_view = TextHTML()
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
        self.log_view = TextHTML()
        # shown once there is output: a cache hit has none, and "Log (0 lines)" says nothing
        self.log = widgets.Accordion(
            children=[self.log_view], selected_index=None, layout=widgets.Layout(display="none")
        )
        self.log.set_title(0, "Log")
        self.summary = TextHTML()
        # one fold per diff (a follow-up has two), made at the end
        self.diff_box = widgets.Accordion(children=[], selected_index=None, layout=widgets.Layout(display="none"))
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
            self.units[row.key] = [0, event.units]  # cargo's compiled units, of at most this many
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
        self.bar.max = 100 * len(self.rows)
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
                if event.line.lstrip().startswith("Compiling") and row.key in self.units:
                    self.units[row.key][0] += 1

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
            self.bar.max = 100 * len(self.rows)
        row.state, row.detail = iteration_outcome(event)
        row.elapsed = getattr(event, "elapsed", None)
        self._render_table()
        self._render_title(self.clock())

    # -- the end ------------------------------------------------------------------

    def _finish(self, event: RunFinished) -> None:
        self.finished_at = event.at
        self.tool, self.error = event.tool, event.error
        self.outcome = event.outcome  # events.outcome_of decides: a cancel is never called a failure
        # the title keeps the tool's name however the run ended: the tool's, else the kept workspace's
        kept = getattr(event.error, "workspace", None)
        self.name = getattr(event.tool, "name", "") or self.name or (kept.name if kept is not None else "")
        for row in self.rows.values():
            if row.state == "running":
                row.state = "cancelled" if self.outcome == "cancelled" else "failed"
                row.elapsed = event.at - row.started if row.started is not None else None
            elif row.state == "pending":
                row.state = "skipped"
        self.candidates.stop()
        self._show_steer(False)
        self.bar.value = self.bar.max
        self.bar.bar_style = {"success": "success", "cancelled": "warning", "unfit": "warning"}.get(
            self.outcome, "danger"
        )
        self.cancel_button.layout.display = "none"
        if self.collapsed:  # one line, or none when the caller shows the error itself
            for part in self.widget.children:
                if part is not self.summary:
                    part.layout.display = "none"
            if not self.show_error:
                self.widget.layout.display = "none"
        if event.ok and self.diff_provider is not None:
            try:
                found = self.diff_provider(event.tool)
                self.diffs = [d for d in (found if isinstance(found, (list, tuple)) else [found]) if d is not None]
            except Exception as exc:  # a missing diff must not hide the result
                self.notices.append(("warning", f"could not compute the diff: {exc}"))
        if self.diffs:
            self.diff_box.children = [TextHTML(diff.to_html()) for diff in self.diffs]
            for index, diff in enumerate(self.diffs):
                self.diff_box.set_title(index, f"Changes: {diff.summary}")
            self.diff_box.layout.display = None
        self._render_all(self.finished_at)

    def interrupt(self, reason: str) -> None:
        """The kernel stops while the build runs: it ends here, cancelled for ``reason`` (said in its record)."""
        if self.outcome != "running":
            return
        self.show_error = True  # no cell raises it now: the record says it
        self._finish(RunFinished(ok=False, error=Cancelled(reason), elapsed=self.clock() - self.started))

    @property
    def collapsed(self) -> bool:
        """The run failed before any stage started (a bad argument): one line says it all."""
        return collapsed(self.outcome, self.rows.values())

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
        self.summary.value = self.record(now).summary()
        self._render_log(now)

    def progress(self) -> int:
        """The bar's value: a step per finished stage, and a running stage's share of its cargo units (by
        ``Compiling`` lines, at most 95% of a step until it ends), in hundredths of a step."""
        done = 100 * sum(1 for row in self.rows.values() if row.state in FINISHED)
        for row in self.rows.values():
            compiled, units = self.units.get(row.key, (0, 0))
            if row.state == "running" and units:
                done += min(95, 100 * compiled // units)
        return done

    def _render_title(self, now: float) -> None:
        end = self.finished_at if self.finished_at is not None else now
        self.title.value = title_html(self.outcome, self.name, self.heading.text, end - self.started)
        self.counts.value = counts_html(self.iterations, self.tests_passing, self.usage, self.outcome)

    def _render_table(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        stale = ""
        if self.outcome == "running":
            self.bar.value = min(self.progress(), self.bar.max)
            stale = stale_note(self.name)
        self.table.value = (
            stage_table_html(self.rows.values(), now, self.candidates, self.usage, settled=self.outcome == "success")
            + stale
        )

    def _render_notices(self) -> None:
        self.notice_view.value = notices_html(self.notices, last=8)

    def _log_text(self) -> list[str]:
        return [line if isinstance(line, str) else f"{line.stage}| {line}" for line in self.log_lines]

    def _render_log(self, now: float) -> None:
        self._log_dirty = False
        self._log_rendered_at = now
        self.log_view.value = log_html(self._log_text(), self.log_count, name=self.name)
        count = self.log_count
        self.log.set_title(0, f"Log ({count} line{'' if count == 1 else 's'})" if count else "Log")

    # -- the record, and plain text ---------------------------------------------------

    def record(self, now: float | None = None) -> BuildRecord:
        """What the run shows, as a :class:`~flakebot_magic.views.record.BuildRecord` (static HTML and text)."""
        if now is None:
            now = self.finished_at if self.finished_at is not None else self.clock()
        end = self.finished_at if self.finished_at is not None else now
        return BuildRecord(
            title=self.heading.text,
            outcome=self.outcome,
            elapsed=end - self.started,
            rows=list(self.rows.values()),
            now=now,
            name=self.name,
            candidates=self.candidates,
            usage=self.usage,
            notices=list(self.notices),
            steering=list(self.steering.lines),
            log=self._log_text()[-RECORD_LOG_LINES:],
            log_count=self.log_count,
            diffs=list(self.diffs),
            tool=self.tool,
            error=self.error,
            tests=self.tests_passing,
            iterations=self.iterations,
            show_error=self.show_error,
        )

    def text(self) -> str:
        """The same progress as plain text (for front ends without a widget manager)."""
        return self.record().text()

    def __repr__(self) -> str:
        return self.text()

    def mimebundle(self) -> dict[str, Any]:
        """The display data while the build runs: the widget view, and the plain text for front ends without widgets."""
        return {
            "application/vnd.jupyter.widget-view+json": {
                "version_major": 2,
                "version_minor": 0,
                "model_id": self.widget.model_id,
            },
            "text/plain": self.text(),
            # what a notebook saved under this widget keeps (flakebot_magic.server.saved): the view needs the kernel
            "text/html": unfinished_html(self.name, self.heading.text),
        }

    def close(self) -> None:
        """Let the widget's models go (the cell shows the record now); the plain attributes stay readable."""
        parts = [self.widget, *self.widget.children, self.steer_input, self.steer_button, self.log_view]
        parts += [*self.diff_box.children]
        for part in parts:
            part.close()
