"""The record a build leaves in its cell: static HTML and text, no widget, every untrusted text escaped.

Headless, from synthetic pipeline events (as tests/test_ui.py); then a real
notebook run by nbclient in a real kernel, saved, and read back by
``jupyter nbconvert --to html`` without any kernel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hostile_text import typeset_as_math
from test_widget import fake_tool

from flakebot_magic.errors import BuildError, Cancelled
from flakebot_magic.events import (
    CandidateUpdate,
    IterationResult,
    LogLine,
    ModelUsage,
    Notice,
    RunFinished,
    StageFinished,
    StageStarted,
    SteeringMessage,
)
from flakebot_magic.records.provenance import WorkspaceDiff
from flakebot_magic.views.widget import ProgressWidget, TextHTML

#: crate output, a model's words, a path: each may be hostile
EVIL = "<img src=x onerror=alert(1)><script>alert(2)</script>&amp;'\"</pre></details>"
#: the markup a record is made of; anything else came from a text that was not escaped
ALLOWED_TAGS = {"div", "span", "b", "i", "code", "table", "tr", "td", "details", "summary", "pre", "br"}
STAGES = ("search", "fork", "build", "test", "flake", "deploy", "client")


class _Markup(HTMLParser):
    """Every tag and attribute of an HTML text, and its text as a reader sees it (styles ignored)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _markup(text: str) -> _Markup:
    parser = _Markup()
    parser.feed(text)
    parser.close()
    return parser


def _diff(body: str = "+added\n-removed\n", base: str = "published") -> WorkspaceDiff:
    return WorkspaceDiff(Path("/ws/md"), base, "c" * 40, " src/main.rs | 2 +-", body, 1, 1, 1)


def _built(widget: ProgressWidget, *, detail: str = "", log: str = "   Compiling md v0.1.0") -> None:
    for stage in STAGES:
        widget(StageStarted(stage))
        widget(LogLine(stage, log))
        found = "87 passed, 0 failed, 0 ignored" if stage == "test" else detail
        widget(StageFinished(stage, "done", found, 0.5))


def test_the_record_is_html_and_text_without_a_widget() -> None:
    widget = ProgressWidget("Render Markdown text to HTML.", name="md", diff=lambda tool: _diff())
    widget(Notice("deploy", "backend: cargo (asked for)"))
    widget(Notice("build", "dropped 3 dependencies the offline registry lacks", "warning"))
    _built(widget)
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=4.0))
    bundle = widget.record().bundle()
    assert set(bundle) == {"text/html", "text/plain"}  # no widget view: nothing needs the kernel
    page = bundle["text/html"]
    markup = _markup(page)
    rows = [dict(attrs) for tag, attrs in markup.tags if tag == "tr"]
    assert [row["data-stage"] for row in rows] == list(STAGES)
    assert {row["data-state"] for row in rows} == {"done"}
    folds = [text for text in markup.text if text.startswith(("Changes:", "Log ("))]
    assert folds == ["Changes: 1 file changed, +1 -1 against the published crate", "Log (7 lines)"]
    # folded: the changes, the log, and the notices in one line that opens (issue 37)
    assert page.count("<details") == 3 and "<details open" not in page
    assert "<details class='flakebot-notices'" in page
    assert "<style" not in page and "<script" not in page  # GitHub strips both; nothing depends on them
    text = " ".join(markup.text)
    assert "md is ready: pulldown-cmark 0.9.2 (87 tests passing · cargo)" in " ".join(text.split())
    assert "dropped 3 dependencies" in text and "Compiling md v0.1.0" in text
    plain = bundle["text/plain"]
    assert plain.startswith("flakebot md: Render Markdown text to HTML. — ready (")
    assert "`md` is ready" in plain and "✔ deploy" in plain


def _every_door(widget: ProgressWidget) -> None:
    """EVIL through every event a record shows text of."""
    widget(Notice("build", EVIL, "warning"))
    widget(Notice("deploy", EVIL))
    widget(StageStarted("search", EVIL))
    widget(StageFinished("search", "done", EVIL, 0.1))
    widget(StageStarted("fork"))
    widget(StageFinished("fork", "done", EVIL * 8, 0.1))  # cut: the whole text goes into the tooltip
    widget(StageStarted("edit"))
    widget(IterationResult(1, 0, 0, 1, summary=EVIL, first_error=EVIL, elapsed=1.0))
    widget(CandidateUpdate(0, "green", 1, score=EVIL, detail=EVIL, crate=EVIL))
    widget(ModelUsage(10, 1, candidate=0, final=False))
    widget(SteeringMessage(EVIL, source=EVIL))
    widget(LogLine("build", EVIL))
    widget(StageFinished("edit", "done", EVIL, 2.0))


@pytest.mark.parametrize("ok", [True, False])
def test_no_text_of_a_run_reaches_the_record_unescaped(ok: bool) -> None:
    """The invariant, over every door: the record's markup is the record's own; a run's text is only text."""
    widget = ProgressWidget(EVIL, name="md", crate=EVIL, diff=lambda tool: _diff(f"+{EVIL}\n"), show_error=True)
    _every_door(widget)
    if ok:
        widget(RunFinished(ok=True, tool=fake_tool(), elapsed=1.0))
    else:
        widget(RunFinished(ok=False, error=BuildError(EVIL, workspace=Path(f"/ws/{EVIL}")), elapsed=1.0))
    page = widget.record().html()
    markup = _markup(page)
    assert {tag for tag, _ in markup.tags} <= ALLOWED_TAGS
    names = {name for _, attrs in markup.tags for name, _ in attrs}
    assert names <= {"class", "style", "title", "data-stage", "data-state", "data-outcome", "data-level"} | {
        "data-candidate",
        "data-status",
    }
    # and the hostile text is there, as text a reader sees
    assert "".join(markup.text).count(EVIL) >= 5


def test_without_styles_the_record_still_says_everything() -> None:
    """What a viewer that strips styles (GitHub) shows: states as words and icons, times, notices, the folds."""
    widget = ProgressWidget("render markdown", name="md", diff=lambda tool: _diff())
    widget(Notice("build", "cargo runs in a sandbox"))
    _built(widget)
    widget(RunFinished(ok=True, tool=fake_tool(), elapsed=4.0))
    stripped = re.sub(r"\sstyle='[^']*'", "", widget.record().html())
    assert "style=" not in stripped
    text = " ".join(" ".join(_markup(stripped).text).split())
    for expected in ("✔ search done 0.5s", "✔ test done 0.5s 87 passed", "cargo runs in a sandbox", "md is ready"):
        assert expected in text, expected


def test_no_fixed_grey_or_clipping_in_a_record() -> None:
    """Secondary text is the theme's own colour, fainter (a fixed grey is unreadable on a dark theme);
    a long detail wraps and is cut only past 200 characters, with the whole text as its tooltip."""
    widget = ProgressWidget("x", name="md")
    long = "/tmp/cache/workspaces/" + "deep/" * 60 + "md"
    widget(StageStarted("fork"))
    widget(StageFinished("fork", "done", long, 0.1))
    widget(CandidateUpdate(0, "lost", 1, score="green · tests 4 passed", detail="$0.00012345 spent"))
    widget(RunFinished(ok=False, error=Cancelled("Stopped during `cargo build`."), elapsed=1.0))
    page = widget.record().html()
    for grey in ("#57606a", "#8c959f", "opacity:0.6;"):
        assert grey not in page
    assert "nowrap;max-width" not in page and "text-overflow:ellipsis" not in page
    cell = re.search(r"<td class='flakebot-detail'[^>]*title='([^']*)'>([^<]*)</td>", page)
    assert cell is not None and cell.group(1) == long and cell.group(2).endswith("…") and len(cell.group(2)) == 200
    assert "$0.00012345 spent" in page  # short: shown whole, nothing cut


def test_the_title_keeps_the_tool_name_however_the_run_ends() -> None:
    widget = ProgressWidget("hex-encode standard input")  # no --name: the name is known only from the run
    widget(StageStarted("build"))
    error = Cancelled("Stopped during `cargo build`.", workspace=Path("/cache/workspaces/.next/hex2-1-2/hex2"))
    widget(RunFinished(ok=False, error=error, elapsed=1.0))
    assert "<code>hex2</code>" in widget.title.value and "cancelled" in widget.title.value
    assert widget.record().text().startswith("flakebot hex2: hex-encode standard input — cancelled")
    named = ProgressWidget("hex it", name="hexer")
    named(StageStarted("search"))
    named(RunFinished(ok=False, error=Cancelled("Stopped during `cargo build`."), elapsed=1.0))
    assert "<code>hexer</code>" in named.record().html()


def test_a_cell_of_only_examples_is_titled_by_its_crate() -> None:
    widget = ProgressWidget(">>> md('# Hi')\n'<h1>Hi</h1>\\n'\n>>> md('*a*')\n'<p><em>a</em></p>\\n'\n", crate="md")
    assert widget.heading.text == "md · 2 acceptance examples"
    assert ">>>" not in widget.title.value and "md(" not in widget.title.value
    words = ProgressWidget("Render Markdown.\n>>> md('# Hi')\n'<h1>Hi</h1>\\n'\n")
    assert words.heading.text == "Render Markdown. · 1 acceptance example"


def test_a_follow_up_shows_its_changes_since_the_previous_version_too() -> None:
    since = _diff("+also --upper\n", base="d" * 40)
    widget = ProgressWidget("also accept --upper", name="sha", diff=lambda tool: [_diff(), since])
    _built(widget)
    widget(RunFinished(ok=True, tool=fake_tool("sha"), elapsed=1.0))
    folds = [text for text in _markup(widget.record().html()).text if text.startswith("Changes:")]
    assert folds == [
        "Changes: 1 file changed, +1 -1 against the published crate",
        f"Changes: 1 file changed, +1 -1 against the previous version ({'d' * 12})",
    ]
    assert widget.diff_box.titles == tuple(folds)


# -- a real notebook, executed, saved, converted ------------------------------------------


@pytest.mark.kernel
@pytest.mark.cargo
def test_a_saved_notebook_keeps_the_record_for_nbconvert(tmp_path: Path) -> None:
    """nbclient runs a %%flakebot cell in a real kernel; the saved file has no widget; nbconvert's HTML has the
    stage table and the tool's line, with no kernel anywhere."""
    import nbformat
    from nbclient import NotebookClient
    from tinycrates import write_registry

    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("%load_ext flakebot_magic"),
        nbformat.v4.new_code_cell(f"%%flakebot --registry {registry} --crate tinyecho --name te\nshout the words"),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(tmp_path / "cache"), "FLAKEBOT_BACKEND": "cargo"}
    # the kernel's environment (execute passes it to the kernel manager's start)
    NotebookClient(notebook, timeout=600, kernel_name="python3", store_widget_state=True).execute(env=env)
    saved = tmp_path / "built.ipynb"
    nbformat.write(notebook, saved)
    outputs: list[dict[str, Any]] = json.loads(saved.read_text())["cells"][1]["outputs"]
    mimes = {mime for output in outputs for mime in output.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" not in mimes
    [record] = [o for o in outputs if "flakebot-record" in "".join(o.get("data", {}).get("text/html", ""))]
    assert record["output_type"] == "display_data"
    converted = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", str(saved), "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert converted.returncode == 0, converted.stderr
    page = (tmp_path / "built.html").read_text()
    rows = re.findall(r"<tr class='flakebot-row' data-stage='(\w+)' data-state='(\w+)'", page)
    assert [stage for stage, _ in rows] == list(STAGES)
    assert all(state in ("done", "cached") for _, state in rows), rows
    assert re.search(r"<code>te</code></b> is ready: tinyecho 0\.2\.0", page)
    assert "Error displaying widget" not in page and "model not found" not in page


def test_no_text_of_a_run_is_typeset_as_math() -> None:
    """Two dollar signs in a notice or a log ($HOME and $PATH) are text in the live widget's every HTML view and in
    the record: JupyterLab's MathJax typesets ``$...$`` in both unless told not to."""
    widget = ProgressWidget("echo $HOME and $PATH", name="md", diff=lambda tool: _diff("+$a$\n"))
    widget(Notice("search", "semantic search is turned off ($FLAKEBOT_EMBEDDING_MODEL=off). To turn it on: unset $X"))
    _built(widget, detail="$1 and $2", log="cost $5 or $6")
    widget(RunFinished(ok=False, error=BuildError("needs $CC and $LD"), elapsed=4.0))
    views = [child for child in _walk(widget.widget) if isinstance(child, TextHTML)]
    assert len(views) >= 6 and any("$FLAKEBOT_EMBEDDING_MODEL" in view.value for view in views)
    for view in views:
        assert typeset_as_math(view.value) == [], view.value
    page = widget.record().bundle()["text/html"]
    assert "$FLAKEBOT_EMBEDDING_MODEL=off" in page and typeset_as_math(page) == []


def _walk(box: Any) -> list[Any]:
    return [box, *(grand for child in getattr(box, "children", ()) for grand in _walk(child))]


def test_notices_fold_into_one_line_that_opens() -> None:
    """Issue 37: five to seven notices stood above the Cancel button on every build; now one line says how many,
    how many warnings and the first warning, and opens to all of them."""
    from flakebot_magic.views.record import notices_html

    notices = [("info", f"note {i}") for i in range(5)] + [("warning", "backend: cargo (auto is falling back)")]
    page = notices_html(notices)
    assert page.count("<details") == 1 and "<details open" not in page
    summary = page[page.index("<summary") : page.index("</summary>")]
    assert "6 notices, 1 warning: backend: cargo (auto is falling back)" in summary
    assert page.count("class='flakebot-notice'") == 6  # all of them inside
    assert notices_html([]) == ""
    assert "1 notice: just one" in notices_html([("info", "just one")])
