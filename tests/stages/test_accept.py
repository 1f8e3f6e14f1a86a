"""Acceptance examples in the request: split from the search words, read as data, run against the deployed tool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flakebot_magic.config import Settings
from flakebot_magic.errors import UsageError
from flakebot_magic.events import Notice, StageFinished
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.request import PersonText, UntrustedText
from flakebot_magic.stages.accept import ALLOWED_FORM, Call, read_call, run_examples, split_request, words_only

CELL = PersonText(
    """Render Markdown text to HTML.
>>> md("# Hi")
<h1>Hi</h1>
>>> md("# Hi")
'<h1>Hi</h1>\\n'
>>> md(text="*x*")
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
>>> md(["a", 1, (2.5, None)], flag=True)
"<p>['a', 1, (2.5, None)]</p>\\n"
"""
)


def _md(text: object = None, **flags: object) -> str:
    if text is None and not flags:
        raise TypeError("no input")
    text = text if text is not None else flags.get("text")
    return {"# Hi": "<h1>Hi</h1>\n", "*x*": "<p><em>x</em></p>\n"}.get(str(text), f"<p>{text}</p>\n")


def test_split_request_keeps_the_words_and_reads_each_example_as_a_call() -> None:
    request, examples = split_request(CELL)
    assert request == "Render Markdown text to HTML."
    assert [e.code for e in examples][:2] == ['md("# Hi")', 'md("# Hi")']
    assert examples[0].want == "<h1>Hi</h1>\n" and examples[0].lineno == 1
    assert examples[0].call == Call("md", None, ("# Hi",))
    assert examples[2].call == Call("md", None, (), (("text", "*x*"),))
    assert examples[-1].call == Call("md", None, (["a", 1, (2.5, None)],), (("flag", True),))
    assert split_request(PersonText("no examples here")) == ("no examples here", [])


def test_each_example_passes_or_fails_on_its_own() -> None:
    _, examples = split_request(CELL)
    report = run_examples(examples, {"md": _md})
    assert [r.passed for r in report.results] == [True, True, True, True, False, True, False, True]
    assert (report.passed, report.failed, report.ok) == (6, 2, False)
    assert report.summary() == "2 of 8 examples FAIL"
    oops, undefined = report.failures
    assert oops.describe() == "line 10: >>> md(\"oops\")\n    expected: <p>nope</p>\n    got:      '<p>oops</p>\\n'"
    assert "raised:   'undefined' is not the tool these examples check (the tools: md)" in undefined.describe()
    instructions = report.as_request("Render Markdown text to HTML.")
    assert isinstance(instructions, UntrustedText)  # it quotes what the tool printed
    assert instructions.startswith(
        "Render Markdown text to HTML.\n\nThe tool is deployed, but these acceptance examples"
    )
    assert '>>> md("oops")' in instructions and "undefined()" in instructions


def test_an_expected_literal_equal_to_the_result_passes() -> None:
    _, examples = split_request(PersonText(">>> f()\n{'b': [1, 2], 'a': 1}\n>>> f()\n{'a': 2}\n"))
    report = run_examples(examples, {"f": lambda: {"a": 1, "b": [1, 2]}})
    assert [r.passed for r in report.results] == [True, False]


#: what an example may not be: each is refused before anything runs, and the refusal shows the allowed form
REFUSED = [
    "import os",
    "out = md('x')",
    "print(md('x'))",
    "md(open('/etc/passwd').read())",
    "__import__('os').system('id')",
    "md.__class__",
    "md.__init__(1)",
    "md('x').strip()",
    "md(*['x'])",
    "md(**{'a': 1})",
    "md(x)",
    "md(lambda: 1)",
    "md([i for i in range(3)])",
    "md('x') + 'y'",
    "md(f'{1}')",
    "exec('1')",  # a call of a name, but it names no tool: refused when the tool is named
    "md('x'); md('y')",
    "md(" * 200 + ")" * 200,
]


@pytest.mark.parametrize("source", REFUSED)
def test_anything_but_a_call_with_literal_arguments_is_refused_showing_the_allowed_form(source: str) -> None:
    cell = PersonText(f"Render Markdown.\n>>> {source}\n'x'\n")
    with pytest.raises(UsageError) as caught:
        split_request(cell, name="md")
    message = str(caught.value)
    assert ALLOWED_FORM.splitlines()[0] in message and '>>> md("# Hi")' in message
    assert "Traceback" not in message


@given(st.text(max_size=80))
def test_any_example_is_a_call_of_literals_or_refused_never_run(source: str) -> None:
    """A property over any text after ``>>>``: reading it runs nothing, and what is read is only data."""
    try:
        call = read_call(source)
    except UsageError:
        return
    assert call.name.isidentifier() and not call.name.startswith("_")
    assert call.function is None or (call.function.isidentifier() and not call.function.startswith("_"))
    allowed = (str, bytes, int, float, complex, bool, type(None), tuple, list, dict, set, frozenset)

    def data(value: Any) -> bool:
        if isinstance(value, dict):
            return all(data(k) and data(v) for k, v in value.items())
        if isinstance(value, (tuple, list, set, frozenset)):
            return all(data(v) for v in value)
        return isinstance(value, allowed)

    assert all(data(a) for a in call.args) and all(data(v) for _, v in call.kwargs)


def test_only_the_persons_words_carry_examples() -> None:
    text = "Render Markdown.\n>>> md('x')\n'x'\n"
    with pytest.raises(TypeError, match="PersonText"):
        split_request(text)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="PersonText"):
        split_request(UntrustedText(text))  # type: ignore[arg-type]
    assert words_only(UntrustedText(text)) == ("Render Markdown.", 1)


@pytest.mark.cargo
def test_the_pipeline_runs_the_examples_against_the_deployed_tool(session_registry: Any, tmp_path: Path) -> None:
    events: list[object] = []
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(session_registry.path), backend="cargo")
    cell = PersonText(
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
