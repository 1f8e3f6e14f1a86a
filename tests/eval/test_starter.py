"""The starter suite: its solution scripts are what ``solutions.py`` writes, and a replay of a subset passes every
task through the real edit loop (the whole suite replays in ``make bench``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from flakebot_magic import cli
from flakebot_magic.config import DEBIAN_REGISTRY

STARTER = Path(__file__).resolve().parents[2] / "evals" / "starter"
#: two quick tasks: one green at its first check run, one whose first try does not compile
SUBSET = ("fnv1a", "hsize")


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


@pytest.mark.cargo
@pytest.mark.skipif(not DEBIAN_REGISTRY.is_dir(), reason="the offline registry is not installed: run `make install`")
def test_a_replay_of_the_starter_subset_passes_every_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["eval", str(STARTER), "--replay", "--jobs", "2", "--out", str(tmp_path / "out"), "--json"]
    code = cli.main([*args, *(f"--task={task}" for task in SUBSET)])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert data["replay"] is True and "not a model" in data["notice"] and data["complete"]
    assert sorted(a["task"] for a in data["attempts"] if a["passed"]) == sorted(SUBSET)
    assert all(a["hidden"]["passed"] == a["hidden"]["total"] > 0 for a in data["attempts"])
    hsize = next(a for a in data["attempts"] if a["task"] == "hsize")
    assert hsize["iterations"] >= 2  # its first try did not compile; the second did
    assert (tmp_path / "out" / "results.json").is_file()
