"""The record a build leaves in its cell: HTML and plain text that every front end shows without a kernel.

While a build runs, :class:`~flakebot_magic.views.widget.ProgressWidget` shows it live.
When it ends, the magic replaces the widget's display (by its display id)
with :meth:`BuildRecord.bundle`: ``text/html`` and ``text/plain``, and no
widget MIME type, so what the notebook keeps (the stage table, times,
notices, the changes and the log, folded) survives a kernel restart, a save
and reopen, ``jupyter nbconvert --to html`` and GitHub's viewer:

* no script, no ``<style>`` element, no class a page must define: inline
  styles only, and only as an enhancement. A viewer that strips them (GitHub
  strips ``<style>``, JupyterLab's sanitizer keeps only some properties in an
  untrusted notebook) still shows each state as a word and an icon, the
  table as a table, and the diff and the log as ``<details>`` folds.
* Colours are JupyterLab's theme variables with a fallback for light pages;
  secondary text is the theme's own text colour, fainter: readable on a
  light and a dark background alike.
* Every piece of text a run produced (the request, crate and compiler
  output, the model's words, paths) goes through
  :func:`flakebot_magic.untrusted.safe_html` (made safe to show, then escaped).

The live widget renders its parts with the functions here, so the widget,
the record and the plain text say the same thing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..stages.accept import words_only
from ..untrusted import not_math, safe_html, safe_line, safe_text, styled_html
from .rows import (
    AMBER,
    BLUE,
    FAINT,
    GREEN,
    RED,
    CandidateTable,
    StageRow,
    SteerLine,
    UsageTotals,
    fmt_seconds,
    stage_table_html,
    stage_text_lines,
    tests_passing,
)

__all__ = [
    "OUTCOMES",
    "RECORD_LOG_LINES",
    "TEXT",
    "WRAP",
    "BuildRecord",
    "RequestTitle",
    "collapsed",
    "counts_html",
    "log_html",
    "notices_html",
    "stale_note",
    "summary_html",
    "title_html",
    "unfinished_html",
]

#: how a run ended (``running`` while it runs): the word the title shows, and its colour
OUTCOMES = {
    "running": ("building…", BLUE),
    "success": ("ready", GREEN),
    "failed": ("failed", RED),
    "cancelled": ("cancelled", AMBER),
    "unfit": ("no crate fits", AMBER),
}
#: the log lines a record keeps (the whole log is ``%flakebot logs NAME``)
RECORD_LOG_LINES = 200
#: ipywidgets give HTML the line height of a widget row (28 px) and no wrapping: text needs its own
TEXT = "line-height:1.45;white-space:normal"
#: wrap at spaces; break inside a word only when the word alone is wider than the box
WRAP = "white-space:pre-wrap;word-break:normal;overflow-wrap:anywhere"


@dataclass(frozen=True)
class RequestTitle:
    """What the title says the build is for: the request's words, without its ``>>>`` examples.

    A cell of only examples (with ``--crate``) is titled by the crate, and
    the examples are counted, never shown as the request.

    >>> RequestTitle.of(">>> md('# a')\\n'<h1>a</h1>'", crate="pulldown-cmark").text
    'pulldown-cmark · 1 acceptance example'
    """

    words: str
    examples: int = 0
    crate: str = ""

    @classmethod
    def of(cls, request: str, *, crate: str = "") -> RequestTitle:
        words, examples = words_only(request)  # counted for the title, never read
        return cls(" ".join(words.split()), examples, crate or "")

    @property
    def text(self) -> str:
        parts = [self.words or self.crate]
        if self.examples:
            parts.append(f"{self.examples} acceptance example{'' if self.examples == 1 else 's'}")
        return " · ".join(part for part in parts if part)


def title_html(outcome: str, name: str, title: str, elapsed: float | None) -> str:
    """``flakebot md — Render Markdown text to HTML. · ready 26.9s``."""
    word, color = OUTCOMES[outcome]
    shown = f" <code>{safe_html(name)}</code>" if name else ""
    request = f" — {safe_html(title[:100])}{'…' if len(title) > 100 else ''}" if title else ""
    return (
        f"<div class='flakebot-title' data-outcome='{outcome}' style='font-size:14px;{TEXT}'>"
        f"<b>flakebot</b>{shown}{request} · "
        f"<span class='flakebot-outcome' style='color:{color};font-weight:bold'>{word}</span> "
        f"<span style='{FAINT}'>{fmt_seconds(elapsed)}</span></div>"
    )


def counts_html(iterations: int, tests: int | None, usage: UsageTotals, outcome: str = "running") -> str:
    """``iteration 2 · 5 tests passing · 4,800 tokens · $0.0144``; empty when there is nothing to count.

    The passing tests are a running build's progress and a ready tool's result; a run that was cancelled or
    failed proved nothing, so its header does not say "N tests passing" (its test row still says what ran).
    """
    counts = []
    if iterations:
        counts.append(f"iteration {iterations}")
    if tests is not None and outcome in ("running", "success"):
        counts.append(tests_passing(tests))
    if usage.total().spent:  # summed over candidates and roles
        counts.append(usage.html())
    return f"<div class='flakebot-counts' style='{FAINT};{TEXT}'>{' · '.join(counts)}</div>" if counts else ""


def notices_html(notices: Sequence[tuple[str, str]], last: int | None = None) -> str:
    """The notices folded into one line that opens (``<details>``): how many, how many warnings, and the first
    warning (else the latest notice), cut short; opened, each one, a warning marked ⚠. The live widget lists the
    ``last`` few, the record all. A run that says five things does not push its Cancel button a screen down."""
    shown = notices[-last:] if last else notices
    if not shown:
        return ""
    items = []
    for level, message in shown:
        look = f"color:{AMBER}" if level == "warning" else FAINT
        items.append(
            f"<div class='flakebot-notice' data-level='{level}' style='{look};margin:2px 0;overflow-wrap:anywhere'>"
            f"{'⚠ ' if level == 'warning' else ''}{safe_html(message)}</div>"
        )
    warnings = [message for level, message in notices if level == "warning"]
    headline = (warnings or [notices[-1][1]])[0]
    headline = " ".join(safe_line(headline).split())
    headline = headline if len(headline) <= 90 else headline[:89].rsplit(" ", 1)[0] + "…"
    count = f"{len(notices)} notice{'s' if len(notices) != 1 else ''}"
    if warnings:
        count += f", {len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
    look = f"color:{AMBER}" if warnings else FAINT
    return (
        f"<details class='flakebot-notices' style='font-size:12px;{TEXT};margin:2px 0'>"
        f"<summary class='flakebot-notices-line' style='cursor:pointer;{look};overflow-wrap:anywhere'>"
        f"{'⚠ ' if warnings else ''}{count}: {safe_html(headline)}</summary>{''.join(items)}</details>"
    )


#: seconds without a word from the kernel after which a running widget says its kernel may be gone
STALE_AFTER = 20


def stale_note(name: str) -> str:
    """What a live widget shows once its kernel is gone: restarted, stopped, or silent for :data:`STALE_AFTER` s.

    No JavaScript: ipywidgets marks a view whose kernel went away with the
    class ``jupyter-widgets-disconnected``, and a CSS rule here shows the note
    then (and hides the Cancel button, which reaches nothing). Where nothing
    marks it, a CSS timer does: the widget re-renders its table several times a
    second while its kernel lives, each render starting the timer again. (The
    kernel's last words, the record "interrupted by a kernel restart"
    (:mod:`.interrupted`), reach a front end that still reads the old kernel's
    messages; JupyterLab stops reading them when it asks for the restart.) Only
    the live widget carries it: the record has no ``<style>``.
    """
    logs = f"%flakebot logs {name}" if name else "%flakebot logs NAME"
    # once ipywidgets marks the view disconnected it reads as a record: no bar, no Cancel, no link icons,
    # "interrupted" for "building…" and "stopped" for each running stage (CSS text; the HTML stays as sent)
    gone = ".jupyter-widgets-disconnected"
    return (
        "<style>@keyframes flakebot-stale{to{visibility:visible;max-height:12em}}"
        f"{gone} .flakebot-stale{{visibility:visible!important;max-height:12em!important}}"
        f".flakebot-cancel{gone},.flakebot-bar{gone}{{display:none!important}}"
        f".flakebot-progress{gone}::before,.flakebot-progress {gone}::before{{display:none!important}}"
        f"{gone} .flakebot-title[data-outcome='running'] .flakebot-outcome,"
        f"{gone} tr.flakebot-row[data-state='running'] td:nth-child(-n+3):not(:nth-child(2)){{font-size:0}}"
        f"{gone} .flakebot-title[data-outcome='running'] .flakebot-outcome::after"
        f"{{content:'interrupted';font-size:14px;color:{AMBER}}}"
        f"{gone} tr.flakebot-row[data-state='running'] td:nth-child(3)::after{{content:'stopped';font-size:13px;"
        f"color:{AMBER}}}{gone} tr.flakebot-row[data-state='running'] td:nth-child(1)::after"
        f"{{content:'■';font-size:13px;color:{AMBER}}}</style>"
        f"<div class='flakebot-stale' style='visibility:hidden;max-height:0;overflow:hidden;color:{AMBER};{TEXT};"
        f"margin:4px 0;animation:flakebot-stale 0s linear {STALE_AFTER}s forwards'>"
        "⚠ <b>Interrupted</b>: the kernel was restarted or stopped (or has said nothing for "
        f"{STALE_AFTER} s), and this build stopped with it; its workspace and its log are kept "
        f"(<code>{safe_html(logs)}</code>). Run the cell again to build it.</div>"
    )


def unfinished_html(name: str, title: str) -> str:
    """The static record of a build that did not end in this display: what a notebook saved under its live
    widget keeps (:mod:`flakebot_magic.server.saved`), a notice, amber, that says where its log is."""
    logs = f"%flakebot logs {name}" if name else "%flakebot logs NAME"
    return (
        f"<div class='flakebot-record' data-outcome='cancelled' style='max-width:960px;{TEXT}'>"
        + title_html("cancelled", name, title, None).replace(">cancelled<", ">did not end here<")
        + f"<div class='flakebot-notice' data-level='warning' style='color:{AMBER};{TEXT};overflow-wrap:anywhere'>"
        "⚠ This build did not end in this cell: its kernel was restarted or stopped under it (or the page that "
        "showed it was closed). Its workspace is kept; how it ended, and its log, are in "
        f"<code>{safe_html(logs)}</code>. Run the cell again to build it.</div></div>"
    )


def log_html(lines: Iterable[str], count: int, *, name: str = "") -> str:
    """The log's kept lines as a ``<pre>``; the earlier ones are counted, and where to read them said."""
    lines = list(lines)
    more = count - len(lines)
    where = f"%flakebot logs {name}" if name else "%flakebot logs NAME"
    head = f"… {more} earlier lines in the saved log ({where})\n" if more > 0 else ""
    text = head + "\n".join(lines)
    return (
        f"<pre class='flakebot-log' style='max-height:320px;overflow:auto;font-size:12px;margin:0;{WRAP}'>"
        f"{styled_html(text) or '(no output yet)'}</pre>"
    )


def summary_html(
    outcome: str,
    tool: Any,
    *,
    tests: int | None,
    candidates: CandidateTable,
    usage: UsageTotals,
    error: BaseException | None,
    show_error: bool,
    collapsed: bool,
) -> str:
    """The end of a run: the tool and how to call it; or, when the caller does not raise it, the error."""
    if outcome == "running":
        return ""
    if outcome == "success" and tool is not None:
        example = safe_html(tool.example()) if hasattr(tool, "example") else ""
        counted = f"{tests_passing(tests)} · " if tests is not None else ""
        extra = ""
        winner = candidates.winner
        if winner is not None:
            score = f": {safe_html(winner.score)}" if winner.score else ""
            extra += f"chosen: candidate {safe_html(winner.label)} of {len(candidates.rows)}{score}<br>"
        if usage.total().spent:
            extra += f"model: {usage.html()}<br>"
        return (
            "<div class='flakebot-summary' data-outcome='success' "
            f"style='border-left:3px solid {GREEN};padding-left:8px;margin:4px 0;{TEXT};overflow-wrap:anywhere'>"
            f"<b><code>{safe_html(tool.name)}</code></b> is ready: "
            f"{safe_html(tool.crate)} {safe_html(tool.version)} "
            f"({counted}{safe_html(getattr(tool, 'backend', ''))})<br>"
            f"call it: <code>{example}</code><br>{extra}"
            f"<span style='{FAINT}'>store: <code>{safe_html(str(tool.store_path))}</code></span></div>"
        )
    if not show_error:  # the caller raises it: IPython shows it below, once
        return ""
    message = str(error) if error is not None else "the run failed"
    lines = message.splitlines()
    # "no crate fits" is the search's answer, headed as one; a failure is named by its kind
    kind = "No crate fits" if outcome == "unfit" else type(error).__name__ if error is not None else "Error"
    color = OUTCOMES[outcome][1] if outcome in OUTCOMES else RED
    if collapsed:
        return (
            f"<div class='flakebot-summary' data-outcome='{outcome}' style='color:{color};{TEXT}'>"
            f"<b>flakebot</b>: {safe_html(kind)}: {safe_html(' '.join(lines[:3]))}</div>"
        )
    return (
        f"<div class='flakebot-summary' data-outcome='{outcome}' "
        f"style='border-left:3px solid {color};padding-left:8px;{TEXT}'>"
        f"<b>{safe_html(kind)}</b><pre style='{WRAP};margin:0'>"
        f"{safe_html(chr(10).join(lines[:40]))}</pre></div>"
    )


def collapsed(outcome: str, rows: Iterable[StageRow]) -> bool:
    """The run failed before any stage started (a bad argument): one line says it all."""
    return outcome not in ("running", "success") and all(row.started is None for row in rows)


def _fold(kind: str, title: str, body: str) -> str:
    """A ``<details>`` fold: closed, its title the summary line."""
    return (
        f"<details class='flakebot-{kind}-fold' style='margin:4px 0'>"
        f"<summary style='cursor:pointer'>{safe_html(title)}</summary>{body}</details>"
    )


@dataclass
class BuildRecord:
    """Everything a finished (or running) build shows, as plain data; rendered as HTML and as text.

    ``diffs`` are :class:`~flakebot_magic.records.provenance.WorkspaceDiff` objects
    (against the published crate, and for a follow-up against the tool's
    previous version); ``log`` the last lines of the run's log, of
    ``log_count`` in all.
    """

    title: str
    outcome: str
    elapsed: float | None
    rows: list[StageRow]
    now: float
    name: str = ""
    candidates: CandidateTable = field(default_factory=CandidateTable)
    usage: UsageTotals = field(default_factory=UsageTotals)
    notices: list[tuple[str, str]] = field(default_factory=list)
    steering: list[SteerLine] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    log_count: int = 0
    diffs: list[Any] = field(default_factory=list)
    tool: Any = None
    error: BaseException | None = None
    tests: int | None = None
    iterations: int = 0
    show_error: bool = False

    @property
    def collapsed(self) -> bool:
        return collapsed(self.outcome, self.rows)

    def summary(self) -> str:
        return summary_html(
            self.outcome,
            self.tool,
            tests=self.tests,
            candidates=self.candidates,
            usage=self.usage,
            error=self.error,
            show_error=self.show_error,
            collapsed=self.collapsed,
        )

    def html(self) -> str:
        """The record as one ``<div>``: what the cell keeps once the build is over."""
        if self.collapsed:
            return self.summary()
        steering = "".join(
            f"<div class='flakebot-steer' data-status='{line.status}'>{safe_html(str(line))}</div>"
            for line in self.steering
        )
        parts = [
            title_html(self.outcome, self.name, self.title, self.elapsed),
            counts_html(self.iterations, self.tests, self.usage, self.outcome),
            stage_table_html(self.rows, self.now, self.candidates, self.usage, settled=self.outcome == "success"),
            notices_html(self.notices),
            f"<div class='flakebot-steering' style='font-size:12px;{FAINT}'>{steering}</div>" if steering else "",
            self.summary(),
        ]
        for diff in self.diffs:
            parts.append(_fold("diff", f"Changes: {diff.summary}", diff.to_html()))
        if self.log_count:
            count = self.log_count
            parts.append(
                _fold(
                    "log", f"Log ({count} line{'' if count == 1 else 's'})", log_html(self.log, count, name=self.name)
                )
            )
        return (
            f"<div class='flakebot-record' data-outcome='{self.outcome}' "
            f"style='max-width:960px;{TEXT}'>{''.join(parts)}</div>"
        )

    def text(self) -> str:
        """The same as plain text (for front ends that show no HTML, and ``repr``)."""
        first = str(self.error).splitlines()[0] if self.error is not None and str(self.error) else ""
        error = f"{type(self.error).__name__}: {first}"
        if self.collapsed:
            return safe_text(f"flakebot: {error}") if self.show_error else ""
        word = OUTCOMES[self.outcome][0]
        name = f" {self.name}" if self.name else ""
        lines = [f"flakebot{name}: {self.title[:80]} — {word} ({fmt_seconds(self.elapsed)})"]
        if self.usage.total().spent:
            lines.append(f"  model: {self.usage.total().text()}")
        lines += stage_text_lines(self.rows, self.now, self.candidates, self.usage)
        lines += [f"  {'warning: ' if level == 'warning' else ''}{message}" for level, message in self.notices]
        lines += [f"  {line}" for line in self.steering]
        if self.outcome == "success" and self.tool is not None and hasattr(self.tool, "example"):
            lines.append(f"  `{self.tool.name}` is ready: {self.tool.example()}")
        elif self.error is not None and self.show_error:
            lines.append(f"  {error}")
        lines += [f"  {diff.summary}" for diff in self.diffs]
        return safe_text("\n".join(lines))

    def bundle(self) -> dict[str, Any]:
        """The display data of the record: HTML and plain text, no widget."""
        return {"text/html": not_math(self.html()), "text/plain": self.text()}
