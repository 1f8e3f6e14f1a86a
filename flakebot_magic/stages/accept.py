"""After deploy: the acceptance examples written in the cell, run against the deployed tool, as data.

A request may carry doctest-style examples::

    %%flakebot --name md
    Render Markdown text to HTML.
    >>> md("# Hi")
    <h1>Hi</h1>

The lines from ``>>>`` on are not part of the search: :func:`split_request`
takes them out. An example is **data, never code**: each is read with
:mod:`ast` into its one allowed form (:class:`Call`), a call of the tool by
its name (or of one of its functions, ``calc.add(a=1, b=2)``) with literal
arguments, each read by :func:`ast.literal_eval` (strings, bytes, numbers,
``True``/``False``/``None``, and tuples, lists, sets and dicts of them).
Anything else (an assignment, ``print``, an import, a name, an attribute
that is not a function of the tool) is refused with a message that shows the
allowed form (:data:`ALLOWED_FORM`), before anything runs. Nothing of an
example is ever evaluated: :func:`run_examples` calls the tool client with the
arguments read, and compares the result with the expected lines as text the
way doctest does (the ``repr`` of the value, ``...`` as a wildcard, an
expected exception by its last line), or as a literal equal to the value. A
``str`` result also matches its own text, so ``<h1>Hi</h1>`` above matches
``'<h1>Hi</h1>\\n'``; trailing whitespace does not count. Each failure is
reported on its own; with a model configured they go back to the edit loop
(see :meth:`AcceptanceReport.as_request`).

Only the person's own words carry examples: :func:`split_request` takes a
:class:`~flakebot_magic.request.PersonText` (mypy refuses any other text), and
:func:`words_only` reads anyone else's (a model's plan, an agent's request, a
recorded request, a tool's output) as words, its ``>>>`` lines counted, never
run.

flakebot runs the examples on its own initiative, on a binary a model may have
written, so the tools in scope run CONFINED while they do (see
:meth:`~flakebot_magic.clients.base.ToolClient.confined`): in the sandbox,
with a scratch dir as the only writable place and the store entry read-only.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..clients import ToolClient
from ..errors import UsageError
from ..request import PersonText, UntrustedText

__all__ = [
    "ALLOWED_FORM",
    "AcceptanceReport",
    "Call",
    "Example",
    "ExampleResult",
    "read_call",
    "run_examples",
    "split_request",
    "words_only",
]

_FLAGS = doctest.ELLIPSIS

#: what an example may be, as every refusal shows it
ALLOWED_FORM = (
    "An acceptance example is one call of the tool by its name with literal arguments (strings, bytes, numbers, "
    "True/False/None, and lists, tuples, dicts and sets of them), then the expected result on the next lines:\n"
    '    >>> md("# Hi")\n'
    "    <h1>Hi</h1>\n"
    '    >>> md(input="*x*")\n'
    "    '<p><em>x</em></p>\\n'\n"
    "or one of its functions (an MCP or HTTP tool): >>> calc.add(a=1, b=2). The expected result is text (a str "
    "result matches its own text), a Python literal, or an exception by its last line. Nothing else runs: an "
    "example is data, never code."
)


class ExampleRefused(UsageError):
    """An example that is not of the allowed form (:data:`ALLOWED_FORM`); the message says which and why."""


@dataclass(frozen=True)
class Call:
    """An example's call, read as data: the tool's name, maybe one of its functions, the literal arguments."""

    name: str
    function: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def callee(self) -> str:
        return f"{self.name}.{self.function}" if self.function else self.name


@dataclass(frozen=True)
class Example:
    """One ``>>>`` example: its source as written, the expected output, its line in the cell, and its call."""

    source: str
    want: str
    lineno: int
    exc_msg: str | None = None
    call: Call | None = None

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

    def as_request(self, request: str) -> UntrustedText:
        """New instructions for the edit loop: the request and the failing examples as checks.

        Untrusted: it quotes what the tool printed. Its ``>>>`` lines are words
        for the model, never examples, and it is never recorded as the person's
        request.
        """
        failing = "\n".join(r.describe() for r in self.failures)
        return UntrustedText(
            f"{request.strip()}\n\nThe tool is deployed, but these acceptance examples from the request fail "
            "(each calls the deployed tool from Python and compares the result; a str result may match "
            f"its own text):\n{failing}\nChange the tool so that every example gives the expected output."
        )

    def __repr__(self) -> str:
        return f"<AcceptanceReport {self.summary()}>"

    def __str__(self) -> str:
        return "\n".join([self.summary(), *(r.describe() for r in self.failures)])


def _parts(text: str) -> list[str | doctest.Example] | None:
    """doctest's reading of ``text`` into words and examples (text only: nothing runs); None when malformed."""
    if ">>>" not in text:
        return [text]
    try:
        return list(doctest.DocTestParser().parse(text))
    except ValueError:  # a malformed example (bad indentation)
        return None


def words_only(text: str) -> tuple[str, int]:
    """Any text's words without its ``>>>`` examples, and how many there were: nothing of them is read or run."""
    parts = _parts(text)
    if parts is None:
        return text, 0
    words = "".join(p for p in parts if isinstance(p, str))
    return words.strip(), sum(isinstance(p, doctest.Example) for p in parts)


def split_request(text: PersonText, *, name: str | None = None) -> tuple[str, list[Example]]:
    """The person's request without its ``>>>`` examples, and the examples, each read into its :class:`Call`.

    Only the person's words carry examples (a :class:`~flakebot_magic.request.PersonText`;
    anything else is a ``TypeError`` here, and a type error for mypy). An
    example not of the allowed form is an :class:`ExampleRefused` (a
    ``UsageError``) that shows the form; with ``name`` (the tool's, when the
    request gives it), so is an example that calls another name.
    """
    if not isinstance(text, PersonText):
        raise TypeError(f"examples come only from the person's own words (a PersonText), not a {type(text).__name__}")
    parts = _parts(text)
    if parts is None:  # a malformed example: keep the text as the request
        return str(text), []
    words: list[str] = []
    examples: list[Example] = []
    for part in parts:
        if isinstance(part, doctest.Example):
            call = read_call(part.source, lineno=part.lineno)
            if name is not None and call.name != name:
                raise ExampleRefused(
                    f"line {part.lineno + 1}: >>> {part.source.strip()}\ncalls {call.name!r}, but the tool is "
                    f"named {name!r}: an example calls the tool it checks.\n{ALLOWED_FORM}"
                )
            examples.append(Example(part.source, part.want, part.lineno, part.exc_msg, call))
        else:
            words.append(part)
    return "".join(words).strip(), examples


def read_call(source: str, *, lineno: int = 0) -> Call:
    """``source`` (one example's ``>>>`` lines) as its :class:`Call`, or :class:`ExampleRefused` saying why.

    Parsed with :func:`ast.parse` (a parse, nothing evaluated); each argument
    read with :func:`ast.literal_eval`.

    >>> read_call('md("# Hi", input=b"x")')
    Call(name='md', function=None, args=('# Hi',), kwargs=(('input', b'x'),))
    >>> read_call("calc.add(a=1, b=[2, 3])").callee
    'calc.add'
    >>> read_call("__import__('os').system('id')")
    Traceback (most recent call last):
    ...
    flakebot_magic.stages.accept.ExampleRefused: line 1: >>> __import__('os').system('id')
    its callee is not a name or a name's function (...
    """
    shown = f"line {lineno + 1}: >>> {source.strip()}"

    def refuse(why: str) -> ExampleRefused:
        return ExampleRefused(f"{shown}\n{why}\n{ALLOWED_FORM}")

    try:
        tree = ast.parse(source.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise refuse(
            f"it is not one expression ({type(exc).__name__}): an assignment, a statement or an import is never run"
        ) from None
    node = tree.body
    if not isinstance(node, ast.Call):
        raise refuse(f"it is a {type(node).__name__}, not a call of the tool")
    callee = node.func
    if isinstance(callee, ast.Name):
        name, function = callee.id, None
    elif isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name):
        name, function = callee.value.id, callee.attr
    else:
        raise refuse(f"its callee is not a name or a name's function (a {type(callee).__name__})")
    for word in (name, function):
        if word is not None and word.startswith("_"):
            raise refuse(f"{word!r} begins with '_': a tool's name or function never does")
    args: list[Any] = []
    for arg in node.args:
        if isinstance(arg, ast.Starred):
            raise refuse("it unpacks an argument (*...): write each argument out")
        args.append(_literal(arg, refuse))
    kwargs: list[tuple[str, Any]] = []
    for keyword in node.keywords:
        if keyword.arg is None:
            raise refuse("it unpacks keyword arguments (**...): write each one out")
        kwargs.append((keyword.arg, _literal(keyword.value, refuse)))
    return Call(name, function, tuple(args), tuple(kwargs))


def _literal(node: ast.expr, refuse: Callable[[str], ExampleRefused]) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise refuse(f"an argument is not a literal: {_shown(node)}") from None


def _shown(node: ast.expr) -> str:
    try:
        text = ast.unparse(node)
    except (ValueError, RecursionError):
        text = type(node).__name__
    return text if len(text) <= 80 else text[:77] + "..."


def _matches(want: str, got: str) -> bool:
    checker = doctest.OutputChecker()
    return checker.check_output(want.rstrip() + "\n", got.rstrip() + "\n", _FLAGS)


def _equal_literal(want: str, value: Any) -> bool:
    """Whether the expected text is a Python literal equal to ``value`` (read as data, never evaluated)."""
    try:
        expected = ast.literal_eval(want.strip())
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return False
    try:
        return bool(expected == value) and type(expected) is type(value)
    except Exception:  # an odd value's __eq__
        return False


def _callee(call: Call, namespace: Mapping[str, Any]) -> Callable[..., Any]:
    """The tool client's function an example calls; a ``LookupError`` saying why when it names none."""
    if call.name not in namespace:
        names = ", ".join(sorted(namespace)) or "none"
        raise LookupError(f"{call.name!r} is not the tool these examples check (the tools: {names})")
    tool = namespace[call.name]
    if call.function is None:
        if not callable(tool):
            raise LookupError(f"{call.name!r} cannot be called")
        return tool  # type: ignore[no-any-return]
    if not isinstance(tool, ToolClient):
        raise LookupError(f"{call.name!r} has no functions")
    functions = tool.functions()
    if call.function not in functions:
        raise LookupError(f"{call.name!r} has no function {call.function!r} (its functions: {', '.join(functions)})")
    return functions[call.function].function


def run_one(example: Example, namespace: Mapping[str, Any]) -> ExampleResult:
    """Call the tool ``example`` names in ``namespace`` with its arguments; compare with its expected output."""
    call = example.call
    if call is None:
        return ExampleResult(example, False, "", error="not read as a call (refused)")
    try:
        function = _callee(call, namespace)
    except LookupError as exc:
        return ExampleResult(example, False, "", error=str(exc.args[0] if exc.args else exc))
    try:
        value = function(*call.args, **dict(call.kwargs))
    except Exception as exc:
        last = traceback.format_exception_only(type(exc), exc)[-1]
        if example.exc_msg is not None:
            passed = _matches(example.exc_msg, last) or _matches(example.exc_msg, f"{type(exc).__name__}: {exc}")
            return ExampleResult(example, passed, last)
        return ExampleResult(example, False, "", error=last.strip())
    got = repr(value) + "\n" if value is not None else ""
    passed = example.exc_msg is None and (
        _matches(example.want, got)
        or (isinstance(value, str) and _matches(example.want, value))
        or _equal_literal(example.want, value)
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
    """Run every example against the tools in ``namespace`` (name -> tool client), each call on its own.

    With ``confine`` (the default), the tools in ``namespace`` run in the
    sandbox meanwhile.
    """
    with _confined(namespace) if confine else contextlib.nullcontext():
        return AcceptanceReport([run_one(example, namespace) for example in examples])
