"""After deploy: the acceptance examples written in the cell, run against the deployed tool.

A request may carry doctest-style examples::

    %%flakebot --name md
    Render Markdown text to HTML.
    >>> md("# Hi")
    <h1>Hi</h1>

The lines from ``>>>`` on are not part of the search: :func:`split_request`
takes them out. After deploying, :func:`run_examples` runs each one with the
tool in scope and compares what it gives with the expected lines the way
doctest does (the ``repr`` of the value, ``...`` as a wildcard, an expected
exception by its last line). A ``str`` result also matches its own text, so
``<h1>Hi</h1>`` above matches ``'<h1>Hi</h1>\\n'``; trailing whitespace does
not count. Each failure is reported on its own; with a model configured they
go back to the edit loop (see :meth:`AcceptanceReport.as_request`).

flakebot runs the examples on its own initiative, on a binary a model may have
written, so the tools in scope run CONFINED while they do (see
:meth:`~flakebot_magic.clients.base.ToolClient.confined`): in the sandbox,
with a scratch dir as the only writable place and the store entry read-only.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import threading
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clients import ToolClient

__all__ = ["AcceptanceReport", "Example", "ExampleResult", "run_examples", "split_request"]

_FLAGS = doctest.ELLIPSIS
#: one example's stdout redirect at a time: ``sys.stdout`` is the process's, and two redirects interleaved by
#: threads (``flakebot eval --jobs 2``) restore it out of order, leaving a finished example's buffer as everyone's
#: stdout for good (a kernel's later prints vanished)
_STDOUT = threading.RLock()  # re-entrant: an example that runs examples nests its redirects in order


@dataclass(frozen=True)
class Example:
    """One ``>>>`` example: its source, the expected output, its line in the cell."""

    source: str
    want: str
    lineno: int
    exc_msg: str | None = None

    @property
    def code(self) -> str:
        return self.source.rstrip("\n")


@dataclass(frozen=True)
class ExampleResult:
    """How one example went."""

    example: Example
    passed: bool
    got: str
    error: str = ""

    def describe(self) -> str:
        """A failure, as a person (or a model) reads it."""
        ex = self.example
        lines = [f"line {ex.lineno + 1}: >>> {ex.code}"]
        lines.append(f"    expected: {ex.want.rstrip() or '(nothing)'}")
        if self.error:
            lines.append(f"    raised:   {self.error.rstrip()}")
        else:
            lines.append(f"    got:      {self.got.rstrip() or '(nothing)'}")
        return "\n".join(lines)


@dataclass
class AcceptanceReport:
    """Every example's result."""

    results: list[ExampleResult] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    @property
    def ok(self) -> bool:
        return self.failed == 0

    @property
    def failures(self) -> list[ExampleResult]:
        return [r for r in self.results if not r.passed]

    def summary(self) -> str:
        if not self.results:
            return "no examples"
        if self.ok:
            return f"{self.passed} of {len(self.results)} examples pass"
        return f"{self.failed} of {len(self.results)} examples FAIL"

    def as_request(self, request: str) -> str:
        """New instructions for the edit loop: the request and the failing examples as checks."""
        failing = "\n".join(r.describe() for r in self.failures)
        return (
            f"{request.strip()}\n\nThe tool is deployed, but these acceptance examples from the request fail "
            "(each calls the deployed tool from Python and compares the result; a str result may match "
            f"its own text):\n{failing}\nChange the tool so that every example gives the expected output."
        )

    def __repr__(self) -> str:
        return f"<AcceptanceReport {self.summary()}>"

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(r.describe() for r in self.failures)])


def split_request(text: str) -> tuple[str, list[Example]]:
    """The request without its ``>>>`` examples, and the examples."""
    if ">>>" not in text:
        return text, []
    parser = doctest.DocTestParser()
    try:
        parts = parser.parse(text)
    except ValueError:  # a malformed example (bad indentation): keep the text as the request
        return text, []
    words: list[str] = []
    examples: list[Example] = []
    for part in parts:
        if isinstance(part, doctest.Example):
            examples.append(Example(part.source, part.want, part.lineno, part.exc_msg))
        else:
            words.append(part)
    return "".join(words).strip(), examples


def _matches(want: str, got: str) -> bool:
    checker = doctest.OutputChecker()
    return checker.check_output(want.rstrip() + "\n", got.rstrip() + "\n", _FLAGS)


def run_one(example: Example, namespace: dict[str, Any]) -> ExampleResult:
    """Run ``example`` in ``namespace``; compare with its expected output."""
    out = io.StringIO()
    value: Any = None
    try:
        with _STDOUT, contextlib.redirect_stdout(out):
            try:
                code = compile(example.source, f"<example line {example.lineno + 1}>", "eval")
            except SyntaxError:
                exec(compile(example.source, f"<example line {example.lineno + 1}>", "exec"), namespace)
            else:
                value = eval(code, namespace)
    except Exception as exc:
        last = traceback.format_exception_only(type(exc), exc)[-1]
        if example.exc_msg is not None:
            passed = _matches(example.exc_msg, last) or _matches(example.exc_msg, f"{type(exc).__name__}: {exc}")
            return ExampleResult(example, passed, last)
        return ExampleResult(example, False, out.getvalue(), error=last.strip())
    printed = out.getvalue()
    got = printed + (repr(value) + "\n" if value is not None else "")
    passed = example.exc_msg is None and (
        _matches(example.want, got) or (isinstance(value, str) and not printed and _matches(example.want, value))
    )
    return ExampleResult(example, passed, got)


@contextlib.contextmanager
def _confined(namespace: Mapping[str, Any]) -> Iterator[None]:
    """Every deployed tool in ``namespace`` runs in the sandbox within the block."""
    with contextlib.ExitStack() as stack:
        for value in namespace.values():
            if isinstance(value, ToolClient):
                stack.enter_context(value.confined())
        yield


def run_examples(examples: list[Example], namespace: Mapping[str, Any], *, confine: bool = True) -> AcceptanceReport:
    """Run every example in one shared namespace (later examples see earlier assignments).

    With ``confine`` (the default), the tools in ``namespace`` run in the
    sandbox meanwhile.
    """
    scope: dict[str, Any] = {"Path": Path, **namespace}
    with _confined(namespace) if confine else contextlib.nullcontext():
        return AcceptanceReport([run_one(example, scope) for example in examples])
