"""How an eval shows: a progress bar and tables on the terminal, an HTML table in a notebook, ``EvalResults``.

Everything shown comes from ``results.json`` (:func:`~.results.document`), so
the terminal, the notebook, the JSON and the plot say the same, and a replay
says "replay" in each. Text that came from a task, a model or a tool (task
names, failure messages) is made safe before it is shown: control characters
never reach a terminal, and HTML is escaped.
"""

from __future__ import annotations

import html
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..host.fsutil import load_json
from ..untrusted import safe_html, safe_text
from .outcome import headline
from .results import FAULTS, REFERENCE_LABEL, REPLAY_LABEL, AttemptResult

if TYPE_CHECKING:
    from .plot import PassCostPlot

__all__ = ["EvalResults", "TerminalProgress", "attempts_table", "safe", "summary_table"]

_BAR = 24


def safe(text: object, limit: int = 0) -> str:
    """``text`` for a terminal (:func:`~flakebot_magic.untrusted.safe_text`), cut to ``limit``."""
    shown = safe_text(str(text))
    if limit and len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return shown


def _labels(data: Mapping[str, Any]) -> dict[str, str]:
    return {str(m["model"]): str(m.get("label") or m["model"]) for m in data.get("models", [])}


def _tokens(a: Mapping[str, Any]) -> str:
    return f"{a.get('prompt_tokens', 0):,}/{a.get('completion_tokens', 0):,}"


def _money(value: Any) -> str:
    return "-" if value is None else f"${value:.4f}"


def _seconds(value: Any) -> str:
    seconds = float(value or 0)
    return f"{seconds:.1f}s" if seconds < 120 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def _hidden(a: Mapping[str, Any]) -> str:
    hidden = a.get("hidden")
    if not hidden:
        return "-"
    if hidden.get("compile") and not hidden.get("total"):
        return "no build"  # the tests did not compile against the code: nothing ran to count
    return f"{hidden['passed']}/{hidden['total']}" + (" error" if hidden.get("error") else "")


def _rows(data: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    labels = _labels(data)
    head = ["task", "model", "try", "passed", "hidden", "green", "iter", "tokens in/out", "cost", "time", "failure"]
    rows = [
        [
            str(a["task"]),
            labels.get(str(a["model"]), str(a["model"])),
            str(a["attempt"]),
            "yes" if a["passed"] else "no",
            _hidden(a),
            "yes" if a["green"] else "no",
            str(a.get("iterations", 0)),
            _tokens(a),
            _money(a.get("cost_usd")),
            _seconds(a.get("seconds")),
            str(a.get("failure") or ""),
        ]
        for a in data.get("attempts", [])
    ]
    return head, rows


def _summary_rows(data: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    attempts = int(data.get("config", {}).get("attempts", 1))
    head = ["model", "pass@1"] + ([f"pass@{attempts}"] if attempts > 1 else [])
    head += ["solved", "median iter", "tokens/solved", "cost/solved", "cost", "time", "failed: whose fault"]
    rows = []
    for model in data.get("models", []):
        s = model["summary"]
        row = [str(model.get("label") or model["model"]), _ratio(s.get("pass_at_1"))]
        if attempts > 1:
            row.append(_ratio(s["pass_at_k"].get(str(attempts))))
        median = s.get("median_iterations_to_green")
        row += [
            f"{s['solved']}/{s['tasks']}",
            "-" if median is None else f"{median:g}",
            "-" if s.get("tokens_per_solved") is None else f"{s['tokens_per_solved']:,.0f}",
            _money(s.get("cost_per_solved_usd")),
            _money(s.get("cost_usd")),
            _seconds(s.get("seconds")),
            ", ".join(f"{fault} {n}" for fault, n in (s.get("faults") or {}).items()) or "-",
        ]
        rows.append(row)
    return head, rows


def _text_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = [[safe(c, 48) for c in row] for row in [head, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def attempts_table(data: Mapping[str, Any]) -> str:
    """Every attempt, one line each."""
    return _text_table(*_rows(data))


def summary_table(data: Mapping[str, Any]) -> str:
    """One line per model: pass@1 (and pass@k), solved tasks, iterations, tokens and cost per solved task."""
    return _text_table(*_summary_rows(data))


def _notice(data: Mapping[str, Any]) -> str:
    """What a run of a test double says first (an older results.json has no notice: a replay's is known)."""
    if not data.get("replay"):
        return ""
    return str(data.get("notice") or (REFERENCE_LABEL if data.get("reference") else REPLAY_LABEL))


def _failures(data: Mapping[str, Any], limit: int = 200) -> list[str]:
    """One line per failed attempt: which, its class and whose fault, and its cause (the first error or assertion)."""
    labels = _labels(data)
    lines = []
    for a in data.get("attempts", []):
        if a.get("failure"):
            first = a.get("cause") or headline(str(a.get("message", "")))
            fault = a.get("fault") or FAULTS.get(str(a["failure"]), "harness")
            who = f"{a['task']} / {labels.get(str(a['model']), a['model'])} / try {a['attempt']}"
            lines.append(safe(f"{who}: {a['failure']} ({fault}'s): {first}", limit))
    return lines


def _left_out(data: Mapping[str, Any]) -> list[str]:
    """The suite's tasks that did not count: wrong as written, or needing what this machine lacks."""
    suite = data.get("suite", {})
    lines = []
    problems = suite.get("problems", [])
    if problems:
        lines.append(f"tasks that are wrong as written ({len(problems)}, left out of the score):")
        lines += [f"  {safe(p['task'])}: {safe(p['problem'], 300)}" for p in problems]
    unrunnable = suite.get("not_runnable", [])
    if unrunnable:
        scored = len(suite.get("tasks", []))
        lines.append(
            f"tasks not runnable here ({len(unrunnable)} of {scored + len(unrunnable)}, left out of the score: "
            "the registry lacks what they need):"
        )
        lines += [f"  {safe(p['task'])}: {safe(p['problem'], 300)}" for p in unrunnable]
    return lines


def text_report(data: Mapping[str, Any]) -> str:
    """The whole report for a terminal: the replay notice, the attempts, the failures, the summary."""
    parts = []
    if _notice(data):
        parts.append(_notice(data))
    parts.append(attempts_table(data))
    failures = _failures(data)
    if failures:
        parts.append("failures:\n" + "\n".join(f"  {line}" for line in failures))
    left_out = _left_out(data)
    if left_out:
        parts.append("\n".join(left_out))
    parts.append(summary_table(data))
    if not data.get("complete"):
        parts.append("(incomplete: some attempts have not finished; --resume carries on)")
    return "\n\n".join(parts)


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]], caption: str) -> str:
    esc = safe_html
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f'<table class="flakebot-eval"><caption>{esc(caption)}</caption>'
        f"<thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"
    )


class EvalResults:
    """An eval's ``results.json``, for a notebook: an HTML table, a plot, the numbers.

    Examples
    --------
    >>> results = flakebot_magic.eval.run("starter", replay=True)  # doctest: +SKIP
    >>> results                      # an HTML table in a notebook, text in a terminal   # doctest: +SKIP
    >>> results.plot()               # pass rate against cost, one point per model         # doctest: +SKIP
    >>> results.summary["replay"]["pass_at_1"]                                             # doctest: +SKIP
    1.0
    """

    def __init__(self, data: Mapping[str, Any], path: Path | None = None) -> None:
        self.data = dict(data)
        self.path = path

    @classmethod
    def load(cls, path: str | Path) -> EvalResults:
        """Read a ``results.json`` (or the ``--out`` directory holding one)."""
        target = Path(path)
        if target.is_dir():
            target = target / "results.json"
        return cls(load_json(target.read_text(encoding="utf-8")), target)

    @property
    def replay(self) -> bool:
        """True for a replay of solution scripts: these are not a model's results."""
        return bool(self.data.get("replay"))

    @property
    def summary(self) -> dict[str, dict[str, Any]]:
        """Each model's summary, by model name (``replay`` for a replay)."""
        return {str(m["model"]): dict(m["summary"]) for m in self.data.get("models", [])}

    @property
    def attempts(self) -> list[AttemptResult]:
        return [AttemptResult.from_json(a) for a in self.data.get("attempts", [])]

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)

    def table(self) -> str:
        """The report as text (what the command prints)."""
        return text_report(self.data)

    def __repr__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        notice = (
            f'<p class="flakebot-eval-replay" style="font-weight:bold">{html.escape(_notice(self.data))}</p>'
            if self.replay
            else ""
        )
        failures = _failures(self.data, limit=300)
        listed = (
            "<details><summary>failures</summary><ul>"
            + "".join(f"<li>{safe_html(line)}</li>" for line in failures)
            + "</ul></details>"
            if failures
            else ""
        )
        left_out = _left_out(self.data)
        skipped = (
            "<details><summary>left out of the score</summary><pre>"
            + safe_html("\n".join(left_out))
            + "</pre></details>"
            if left_out
            else ""
        )
        kind = "reference, not a model" if self.data.get("reference") else "replay, not a model"
        title = f"flakebot eval ({kind})" if self.replay else "flakebot eval"
        return (
            notice
            + _html_table(*_summary_rows(self.data), caption=f"{title}: per model")
            + _html_table(*_rows(self.data), caption=f"{title}: per task and attempt")
            + listed
            + skipped
        )

    def plot(self) -> PassCostPlot:
        """Pass rate against cost (USD per task, or tokens per task when a model has no price), one point per model.

        Needs matplotlib: ``pip install 'flakebot-magic[eval]'``.
        """
        from .plot import pass_rate_vs_cost

        return pass_rate_vs_cost(self.data)


class TerminalProgress:
    """The eval's progress on a terminal: a bar redrawn in place (or a line per attempt when not a terminal)."""

    def __init__(self, stream: TextIO | None = None, *, replay: bool = False, reference: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.replay = replay or reference
        self.reference = reference
        self.total = 0
        self.done = 0
        self.passed = 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def started(self, total: int, already: int, problems: list[str]) -> None:
        self.total = total
        if self.replay:
            self._write(f"flakebot eval: {REFERENCE_LABEL if self.reference else REPLAY_LABEL}\n")
        resumed = f" ({already} finished before)" if already else ""
        self._write(f"flakebot eval: {total} attempt{'s' if total != 1 else ''}{resumed}\n")
        for problem in problems:
            self._write(f"flakebot eval: left out of the score: {safe(problem, 300)}\n")

    def finished(self, result: AttemptResult, *, resumed: bool) -> None:
        self.done += 1
        self.passed += int(result.passed)
        who = result.model  # "replay" or "reference" for a test double
        hidden = _hidden({"hidden": result.hidden.to_json()}) + " hidden, " if result.hidden else ""
        verdict = "passed" if result.passed else f"FAILED ({result.failure})"
        line = safe(
            f"{result.task} · {who} · try {result.attempt}: {verdict}, {hidden}{result.seconds:.1f}s"
            + (" (finished before)" if resumed else ""),
            160,
        )
        if self.tty:
            filled = int(_BAR * self.done / max(self.total, 1))
            bar = "#" * filled + "-" * (_BAR - filled)
            self._write(f"\r\x1b[2K[{bar}] {self.done}/{self.total} passed {self.passed}  {line}")
        else:
            self._write(f"[{self.done}/{self.total}] {line}\n")

    def ended(self) -> None:
        if self.tty:
            self._write("\n")
        if self.done < self.total:
            self._write(
                f"flakebot eval: {self.total - self.done} attempt(s) not needed: with --feedback a task that "
                "passed gets no more tries\n"
            )
