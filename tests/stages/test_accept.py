"""Acceptance examples in the request: split from the search words, run against the deployed tool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.events import Notice, StageFinished
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.stages.accept import run_examples, split_request

CELL = """Render Markdown text to HTML.
>>> md("# Hi")
<h1>Hi</h1>
>>> md("# Hi")
'<h1>Hi</h1>\\n'
>>> out = md("*x*")
>>> print(out)
<p><em>x</em></p>
>>> md("*x*")
'<p>...'
>>> md("oops")
<p>nope</p>
>>> md(None)
Traceback (most recent call last):
  ...
TypeError: no input
>>> undefined()
1
"""


def _md(text: object) -> str:
    if text is None:
        raise TypeError("no input")
    return {"# Hi": "<h1>Hi</h1>\n", "*x*": "<p><em>x</em></p>\n"}.get(str(text), f"<p>{text}</p>\n")


def test_split_request_keeps_the_words_and_takes_the_examples() -> None:
    request, examples = split_request(CELL)
    assert request == "Render Markdown text to HTML."
    assert [e.code for e in examples][:2] == ['md("# Hi")', 'md("# Hi")']
    assert examples[0].want == "<h1>Hi</h1>\n" and examples[0].lineno == 1
    assert split_request("no examples here") == ("no examples here", [])


def test_each_example_passes_or_fails_on_its_own() -> None:
    _, examples = split_request(CELL)
    report = run_examples(examples, {"md": _md})
    assert [r.passed for r in report.results] == [True, True, True, True, True, False, True, False]
    assert (report.passed, report.failed, report.ok) == (6, 2, False)
    assert report.summary() == "2 of 8 examples FAIL"
    oops, undefined = report.failures
    assert oops.describe() == "line 11: >>> md(\"oops\")\n    expected: <p>nope</p>\n    got:      '<p>oops</p>\\n'"
    assert "raised:   NameError: name 'undefined' is not defined" in undefined.describe()
    instructions = report.as_request("Render Markdown text to HTML.")
    assert instructions.startswith(
        "Render Markdown text to HTML.\n\nThe tool is deployed, but these acceptance examples"
    )
    assert '>>> md("oops")' in instructions and "undefined()" in instructions


@pytest.mark.cargo
def test_the_pipeline_runs_the_examples_against_the_deployed_tool(session_registry: Any, tmp_path: Path) -> None:
    events: list[object] = []
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(session_registry.path), backend="cargo")
    cell = (
        "shout standard input\n"
        ">>> te(input='quiet')\n'QUIET'\n"
        ">>> te('loud')\nLOUD\n"
        ">>> te('two', 'words')\nTWO WORDS\n"
    )
    tool = Pipeline(settings, observers=[events.append]).run(cell, crate="tinyecho", name="te")
    report = tool.acceptance
    assert [r.passed for r in report.results] == [True, True, False]
    accept = [e for e in events if isinstance(e, StageFinished) and e.stage == "accept"]
    assert accept and accept[0].detail == "1 of 3 examples FAIL"
    (notice,) = [e for e in events if isinstance(e, Notice) and e.stage == "accept"]
    assert (
        notice.level == "warning"
        and ">>> te('two', 'words')" in notice.message
        and "got:      'words\\n'" in notice.message
    )


def test_examples_run_by_threads_leave_stdout_as_it_was() -> None:
    # two threads (eval --jobs 2) each redirect the process's stdout for an example: interleaved, the last to
    # restore put back the other's buffer, and every later print of the process vanished into it
    import sys
    import threading

    from flakebot_magic.stages.accept import Example, run_one

    before = sys.stdout
    example = Example("import time; print('x'); time.sleep(0.001)", "x\n", 0, None)
    results: list[bool] = []

    def work() -> None:
        for _ in range(200):
            results.append(run_one(example, {}).passed)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sys.stdout is before
    assert results == [True] * 800  # each example saw its own output, and only it
