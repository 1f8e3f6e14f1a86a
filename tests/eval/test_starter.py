"""The starter suite: its solution scripts are what ``solutions.py`` writes.

A replay of a subset passing every task through the real edit loop is ``notebooks/eval.ipynb`` (nbval checks its
summary in ``make test``); the whole suite replays in ``make bench``.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from flakebot_magic.eval.task import BUILTIN_SUITES

STARTER = BUILTIN_SUITES["starter"]


def _solutions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("starter_solutions", STARTER / "solutions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_solution_json_is_what_solutions_py_writes() -> None:
    solutions = _solutions()
    tasks = sorted(p.parent.name for p in STARTER.glob("*/task.toml"))
    assert sorted(solutions.SOLUTIONS) == tasks
    for task in tasks:
        assert (STARTER / task / "solution.json").read_text() == solutions.text(task), (
            f"{task}/solution.json is stale: run `python evals/starter/solutions.py`"
        )
