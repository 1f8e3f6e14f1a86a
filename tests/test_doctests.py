"""The docstring examples run: every ``>>>`` example in the package (and in tests/polling.py) passes.

An example that needs a real build or the network says so with
``# doctest: +SKIP``; everything else is executed and its output compared.
A module is collected here when its source holds an example, so a new
example is tested without touching this file.
"""

from __future__ import annotations

import doctest
import importlib
import io
import re
from pathlib import Path

import pytest

import flakebot_magic

PACKAGE = Path(flakebot_magic.__file__).resolve().parent
EXAMPLE = re.compile(r"^\s*>>> ", re.MULTILINE)

# Docstrings whose ``>>>`` lines are not Python for doctest: they show a
# ``%%flakebot`` cell, whose examples flakebot's acceptance stage runs against
# a built tool (tests/stages/test_accept.py does that).
NOT_DOCTESTS = {"flakebot_magic.stages.accept": "the module docstring shows a %%flakebot cell"}


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if not EXAMPLE.search(path.read_text(encoding="utf-8")):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = [*_modules_with_examples(), "polling"]


def test_the_package_has_examples_to_run() -> None:
    assert len(MODULES) > 10, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name: str) -> None:
    module = importlib.import_module(name)
    tests = [
        test for test in doctest.DocTestFinder(exclude_empty=True).find(module, name) if test.name not in NOT_DOCTESTS
    ]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    failed = attempted = 0
    for test in tests:
        outcome = runner.run(test, out=report.write)
        failed, attempted = failed + outcome.failed, attempted + outcome.attempted
    assert failed == 0, report.getvalue()
    examples = sum(len(test.examples) for test in tests)
    if name in NOT_DOCTESTS and not examples:
        pytest.skip(f"{name}: {NOT_DOCTESTS[name]}, not a doctest")
    assert examples, f"{name} has a line starting with '>>> ' but no docstring example"
    # a module whose examples are all skipped runs none: say so instead of passing quietly
    if attempted == 0:
        pytest.skip(f"{name}: its {examples} example(s) need a build or the network (+SKIP)")
