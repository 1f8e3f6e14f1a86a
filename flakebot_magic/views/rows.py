"""What the progress widget shows, as plain data: stage rows, candidate rows, the model's usage, steering messages.

No ipywidgets here (:mod:`flakebot_magic.views.widget` puts these in widgets): each
part reads events and renders itself as HTML and as plain text, so the
widget, its ``text()`` fallback and the printed progress
(:mod:`flakebot_magic.views.progress`) say the same thing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..events import CandidateUpdate, ModelUsage, SteeringMessage
from ..untrusted import safe_html

__all__ = [
    "AMBER",
    "BLUE",
    "DETAIL_CHARS",
    "FAINT",
    "FINISHED",
    "GREEN",
    "ICON",
    "OPTIONAL_STAGES",
    "RED",
    "STATES",
    "STATE_STYLE",
    "WRAP_CELL",
    "CandidateRow",
    "CandidateTable",
    "StageRow",
    "SteerLine",
    "SteerLog",
    "UsageSum",
    "UsageTotals",
    "detail_cell",
    "fmt_seconds",
    "iteration_outcome",
    "stage_table_html",
    "stage_text_lines",
    "tests_passing",
]

#: what a row can show; ``handled``: it failed, and the run carried on past it (a fallback)
STATES = ("pending", "running", "done", "failed", "handled", "skipped", "cached", "cancelled")
#: stages only some runs have (the edit loop needs a model): a row when they start, none before
OPTIONAL_STAGES = ("edit",)

FINISHED = ("done", "failed", "handled", "skipped", "cached", "cancelled")
ICON = {
    "pending": "○",
    "running": "◔",
    "done": "✔",
    "failed": "✘",
    "handled": "↷",
    "skipped": "–",
    "cached": "↺",
    "cancelled": "■",
}
#: theme colours: JupyterLab's own variables (so the light and the dark theme each get theirs), with
#: fallbacks for pages without them (nbconvert's HTML, GitHub); a page that strips styles shows plain text
GREEN = "var(--jp-success-color1,#1a7f37)"
RED = "var(--jp-error-color1,#cf222e)"
AMBER = "var(--jp-warn-color0,#9a6700)"
BLUE = "var(--jp-brand-color1,#0969da)"
#: secondary text: the text's own colour made fainter, never a fixed grey (unreadable on a dark background)
FAINT = "opacity:0.72"
#: what a state looks like: a colour, or fainter text for the states that need no attention
STATE_STYLE = {
    "pending": FAINT,
    "running": f"color:{BLUE}",
    "done": f"color:{GREEN}",
    "failed": f"color:{RED}",
    "handled": FAINT,
    "skipped": FAINT,
    "cached": f"color:{GREEN}",
    "cancelled": f"color:{AMBER}",
}
#: a cell's text wraps at spaces, and inside a word (a path) only when the word alone is wider than the cell
WRAP_CELL = "overflow-wrap:anywhere;word-break:normal;white-space:normal"
#: details longer than this are cut (with "…"); the whole text is the cell's tooltip
DETAIL_CHARS = 200
#: every cell: a page's own table style (JupyterLab right-aligns, centres and pads rendered tables, and stripes
#: their rows) must not make the record a different table from the widget's
CELL = "text-align:left;vertical-align:top;padding:1px 0.9em 1px 0;border:none;line-height:1.5"
#: the label, state and time columns take what they need (the detail, the rest)
TIGHT = "width:1%;white-space:nowrap"
#: every row: no stripes, no hover colour from the page
ROW = "background:none"


@dataclass
class StageRow:
    """One row of the widget: a stage, or one iteration of a repeated stage."""

    key: str
    stage: str
    label: str
    state: str = "pending"
    detail: str = ""
    started: float | None = None
    elapsed: float | None = None
    live: str = ""

    def seconds(self, now: float) -> float | None:
        if self.elapsed is not None and self.state in FINISHED:
            return self.elapsed
        if self.started is not None:
            return max(0.0, now - self.started)
        return None


def tests_passing(count: int) -> str:
    return f"{count} test{'' if count == 1 else 's'} passing"


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def iteration_outcome(event: Any) -> tuple[str, str]:
    """The state and detail of an edit iteration's row (``events.IterationResult``, read by duck typing)."""
    passed = getattr(event, "passed", None)
    failed = getattr(event, "failed", None)
    errors = getattr(event, "errors", None)
    reverted = bool(getattr(event, "reverted", False))
    green = getattr(event, "green", getattr(event, "ok", None))
    if reverted:
        state = "failed"
    elif green is not None:
        state = "done" if green else "failed"
    else:
        state = "failed" if (errors or failed) else "done"
    if state == "failed" and not reverted and getattr(event, "iteration", None) == 0:
        state = "handled"  # check run 0 is where the model starts (a library misses the contract): not a failure
    summary = getattr(event, "summary", "")
    parts = []
    if (passed is not None or failed is not None) and not summary:  # the summary says the counts itself
        parts.append(f"{passed or 0} passed, {failed or 0} failed")
    if errors and not summary:
        parts.append(f"{errors} compile errors")
    if reverted:
        parts.append(f"reverted: {getattr(event, 'reason', '')}".rstrip(": "))
    if summary:
        # the baseline is where a model starts: the contract not met yet is its job, said in plain words, no capitals
        met = "the tool contract is not met yet (the edits' job)" if state == "handled" else "contract not met"
        parts.append(str(summary).replace("contract NOT met", met))
    first_error = getattr(event, "first_error", "")
    if first_error:  # which error: the count alone does not say what to look at
        parts.append(str(first_error))
    return state, "; ".join(parts)


# -- the model's usage -----------------------------------------------------------------


@dataclass(frozen=True)
class UsageSum:
    """Tokens, calls and cost added up over sessions, candidates and roles.

    ``cost_usd`` adds the costs that are known; None when no part had a
    price. ``unpriced``: some part had none, so a shown cost is a lower bound.
    """

    tokens: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None
    unpriced: bool = False

    @classmethod
    def of(cls, event: ModelUsage) -> UsageSum:
        return cls(
            event.tokens,
            event.calls,
            event.prompt_tokens,
            event.completion_tokens,
            event.cached_tokens,
            event.cost_usd,
            event.cost_usd is None,
        )

    def __add__(self, other: UsageSum) -> UsageSum:
        costs = [c for c in (self.cost_usd, other.cost_usd) if c is not None]
        return UsageSum(
            self.tokens + other.tokens,
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
            sum(costs) if costs else None,
            self.unpriced or other.unpriced,
        )

    @property
    def spent(self) -> bool:
        """Anything to show: a session that never called the model has nothing to say."""
        return bool(self.tokens or self.calls)

    def text(self) -> str:
        """``12,345 tokens (1,000 cached) · $0.0123``; the cost only when a price is known."""
        words = f"{self.tokens:,} token{'' if self.tokens == 1 else 's'}"
        if self.cached_tokens:
            words += f" ({self.cached_tokens:,} cached)"
        if self.cost_usd is not None:
            words += f" · {'≥ ' if self.unpriced else ''}{_usd(self.cost_usd)}"
        return words

    def breakdown(self) -> str:
        """The parts, for a tooltip: prompt, completion, calls, and why a cost is missing or a lower bound."""
        calls = f"{self.calls:,} model call{'' if self.calls == 1 else 's'}"
        parts = [f"prompt {self.prompt_tokens:,}", f"completion {self.completion_tokens:,}", calls]
        if self.unpriced:
            parts.append("no price for a model (set `prices`)")
        return " · ".join(parts)


def _usd(cost: float) -> str:
    return f"${cost:.4f}" if cost < 1 else f"${cost:,.2f}"


class UsageTotals:
    """The usage of a run, summed over candidates and roles from :class:`~flakebot_magic.events.ModelUsage` events.

    Each ``(candidate, role)`` sends running totals (``final=False``) after
    each reply, each replacing the one before, and its session's last word
    once (``final=True``). A later session of the same pair (a follow-up in
    the same build) starts its running totals afresh, added to what the
    earlier sessions spent.
    """

    def __init__(self) -> None:
        self._closed: dict[tuple[int | None, str], UsageSum] = {}
        self._open: dict[tuple[int | None, str], UsageSum] = {}

    def add(self, event: ModelUsage) -> None:
        key = (event.candidate, event.role)
        if event.final:
            self._open.pop(key, None)
            self._closed[key] = self._closed.get(key, UsageSum()) + UsageSum.of(event)
        else:
            self._open[key] = UsageSum.of(event)

    def total(self) -> UsageSum:
        return sum((*self._closed.values(), *self._open.values()), UsageSum())

    def of_candidate(self, index: int) -> UsageSum:
        parts = [s for (c, _), s in (*self._closed.items(), *self._open.items()) if c == index]
        return sum(parts, UsageSum())

    def html(self) -> str:
        total = self.total()
        if not total.spent:
            return ""
        return f"<span class='flakebot-usage' title='{safe_html(total.breakdown())}'>{safe_html(total.text())}</span>"


# -- candidates ------------------------------------------------------------------------

#: a candidate's icon and its look: a colour, or fainter text (a loser, a cancelled one: no attention needed)
_CANDIDATE_LOOK = {
    "waiting": ("○", FAINT),
    "editing": ("◔", f"color:{BLUE}"),
    "green": ("✔", f"color:{GREEN}"),
    "failed": ("✘", f"color:{RED}"),
    "cancelled": ("■", FAINT),
    "lost": ("–", FAINT),
    "winner": ("★", f"color:{GREEN}"),
}


@dataclass
class CandidateRow:
    """One candidate of a speculative session: its latest state, iteration and score."""

    index: int
    state: str = "waiting"
    iteration: int = 0
    score: str = ""
    detail: str = ""
    crate: str = ""

    @property
    def label(self) -> str:
        return f"#{self.index} {self.crate}".rstrip()

    @property
    def running(self) -> bool:
        return self.state in ("waiting", "editing")


class CandidateTable:
    """The candidates of a run, from :class:`~flakebot_magic.events.CandidateUpdate` events, by index."""

    def __init__(self) -> None:
        self.rows: dict[int, CandidateRow] = {}

    def __bool__(self) -> bool:
        return bool(self.rows)

    def update(self, event: CandidateUpdate) -> CandidateRow:
        row = self.rows.get(event.index)
        if row is None:
            row = self.rows[event.index] = CandidateRow(event.index)
            self.rows = dict(sorted(self.rows.items()))
        row.state = event.state if event.state in _CANDIDATE_LOOK else "waiting"
        row.iteration = max(row.iteration, event.iteration)
        row.score = event.score or row.score  # a later update without a score keeps the judge's last word
        row.detail = event.detail
        row.crate = event.crate or row.crate
        return row

    def stop(self) -> None:
        """The run ended: a candidate still waiting or editing was stopped with it."""
        for row in self.rows.values():
            if row.running:
                row.state = "cancelled"

    @property
    def winner(self) -> CandidateRow | None:
        return next((row for row in self.rows.values() if row.state == "winner"), None)

    def _look(self, row: CandidateRow, settled: bool) -> tuple[str, str, bool]:
        """Icon, style, dimmed: a loser, a cancelled one and (once another won) a failed one are handled, not red."""
        icon, look = _CANDIDATE_LOOK[row.state]
        if row.state == "failed" and settled:
            return icon, FAINT, True
        return icon, look, row.state in ("lost", "cancelled")

    def html(self, usage: UsageTotals, *, settled: bool = False) -> str:
        """The candidates as rows of the stage table (its five columns); ``settled``: the run has its tool.

        A dimmed row is fainter as a whole (its own text colour, so it reads on a dark theme too).
        """
        settled = settled or self.winner is not None
        cells = []
        for row in self.rows.values():
            icon, look, dim = self._look(row, settled)
            style = f"{FAINT};" if dim else "font-weight:bold;" if row.state == "winner" else ""
            look = "" if dim else f"{look};"  # the row is faint already: its cells keep the text's colour
            detail = self.line(row, usage, label=False)
            cells.append(
                f"<tr class='flakebot-candidate' data-candidate='{row.index}' data-state='{row.state}' "
                f"style='{ROW};font-size:12px;{style}'>"
                f"<td style='{CELL};{look}text-align:center'>{icon}</td>"
                f"<td style='{CELL};{TIGHT};padding-left:0.8em'>{safe_html(row.label)}</td>"
                f"<td style='{CELL};{TIGHT};{look}'>{row.state}</td><td style='{CELL}'></td>"
                f"{detail_cell(detail)}</tr>"
            )
        return "".join(cells)

    @staticmethod
    def line(row: CandidateRow, usage: UsageTotals, *, label: bool = True) -> str:
        """One candidate as plain text: ``#1 tinyhex  winner  iteration 3 · contract ✓ · … · 1,200 tokens``.

        ``label=False``: only what follows the label and the state (the widget has columns for those).
        """
        parts = [f"iteration {row.iteration}"] if row.iteration else []
        parts += [part for part in (row.score, row.detail) if part]
        spent = usage.of_candidate(row.index)
        if spent.spent:
            parts.append(spent.text())
        rest = " · ".join(parts)
        return f"{row.label:<16} {row.state:<9} {rest}".rstrip() if label else rest

    def lines(self, usage: UsageTotals) -> list[str]:
        """The table as plain text, one line per candidate, with its icon."""
        return [f"{_CANDIDATE_LOOK[row.state][0]} {self.line(row, usage)}" for row in self.rows.values()]


# -- steering ----------------------------------------------------------------------------

#: how far a message got: the widget handed it over, the session took it, it went out to the model
_STEER_RANK = {"sent": 0, "queued": 1, "delivered": 2}


@dataclass
class SteerLine:
    """A steering message as the session's log shows it: ``→ you: also accept --upper · delivered``."""

    text: str
    source: str = "widget"
    status: str = "sent"
    stage: str = "edit"

    def __str__(self) -> str:
        who = "you" if self.source in ("widget", "") else f"you via {self.source}"
        status = "delivered" if self.status == "delivered" else "queued for the model's next request"
        return f"→ {who}: {self.text} · {status}"


class SteerLog:
    """The steering messages of a run, each once: a later event about the same text moves it on."""

    def __init__(self) -> None:
        self.lines: list[SteerLine] = []

    def sent(self, text: str) -> SteerLine:
        """The widget's Send handed ``text`` over (before the session says it took it)."""
        line = SteerLine(text, "widget", "sent")
        self.lines.append(line)
        return line

    def record(self, event: SteeringMessage) -> tuple[SteerLine, bool]:
        """The line this event is about, and whether it is new (else an earlier line moved on)."""
        status = "delivered" if event.delivered else "queued"
        rank = _STEER_RANK[status]
        for line in self.lines:
            if line.text == event.text and _STEER_RANK[line.status] < rank:
                line.status = status
                return line, False
        line = SteerLine(event.text, event.source, status, event.stage)
        self.lines.append(line)
        return line, True

    def html(self, last: int = 5) -> str:
        items = [
            f"<div class='flakebot-steer' data-status='{line.status}' style='margin:2px 0'>{safe_html(str(line))}</div>"
            for line in self.lines[-last:]
        ]
        if not items:
            return ""
        return f"<div class='flakebot-steering' style='font-size:12px;{FAINT};line-height:1.45'>{''.join(items)}</div>"


# -- the table of stages, with the candidates under the edit stage ----------------------------------


def _candidates_after(rows: list[StageRow]) -> int:
    """The index of the row the candidates go under: the edit stage's last row (its iterations), else the last."""
    under = [i for i, row in enumerate(rows) if row.stage in ("edit", "iteration")]
    return under[-1] if under else len(rows) - 1


def detail_cell(detail: str, *, extra: str = "") -> str:
    """The last cell of a row: the detail, faint, wrapping; cut past :data:`DETAIL_CHARS` with its whole text as the tooltip."""
    shown = detail if len(detail) <= DETAIL_CHARS else detail[: DETAIL_CHARS - 1] + "…"
    tooltip = f" title='{safe_html(detail)}'" if shown != detail else ""
    return f"<td class='flakebot-detail' style='{CELL};{FAINT};{WRAP_CELL}{extra}'{tooltip}>{safe_html(shown)}</td>"


def stage_table_html(
    rows: Iterable[StageRow], now: float, candidates: CandidateTable, usage: UsageTotals, *, settled: bool = False
) -> str:
    """The widget's table: one row per stage, and a row per candidate under the edit stage when there are any.

    It takes the width it is given: a long detail wraps (a narrow window clips nothing), the label,
    state and time never do.
    """
    rows = list(rows)
    at = _candidates_after(rows)
    cells = []
    for i, row in enumerate(rows):
        look = STATE_STYLE[row.state]
        detail = row.live if row.state == "running" and row.live else row.detail
        cells.append(
            f"<tr class='flakebot-row' data-stage='{safe_html(row.key)}' data-state='{row.state}' style='{ROW}'>"
            f"<td style='{CELL};{look};width:1.5em;text-align:center;padding-right:0.3em'>{ICON[row.state]}</td>"
            f"<td style='{CELL};{TIGHT}'><b>{safe_html(row.label)}</b></td>"
            f"<td style='{CELL};{TIGHT};{look}'>{row.state}</td>"
            f"<td style='{CELL};{TIGHT};text-align:right;font-variant-numeric:tabular-nums'>"
            f"{fmt_seconds(row.seconds(now))}</td>"
            f"{detail_cell(detail)}</tr>"
        )
        if i == at:
            cells.append(candidates.html(usage, settled=settled))
    if not rows:
        cells.append(candidates.html(usage, settled=settled))
    return (
        "<table class='flakebot-stages' style='border-collapse:collapse;font-size:13px;width:100%;margin:2px 0;"
        "table-layout:auto'>" + "".join(cells) + "</table>"
    )


def stage_text_lines(rows: Iterable[StageRow], now: float, candidates: CandidateTable, usage: UsageTotals) -> list[str]:
    """The same table as plain text: a line per stage, the candidates indented under the edit stage."""
    rows = list(rows)
    at = _candidates_after(rows)
    lines = []
    for i, row in enumerate(rows):
        detail = f"  {row.detail}" if row.detail else ""
        lines.append(f"  {ICON[row.state]} {row.label:<12} {row.state:<9} {fmt_seconds(row.seconds(now)):>7}{detail}")
        if i == at:
            lines += [f"      {line}" for line in candidates.lines(usage)]
    if not rows:
        lines += [f"      {line}" for line in candidates.lines(usage)]
    return lines
