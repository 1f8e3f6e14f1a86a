"""Run state vs dependencies: RunState, RunDeps and the stage rows live in ``stages/state.py``, with real types.

* every RunState field has a real type (no ``Any`` standing in for a journal, a resume point, a race or an
  example, as when it lived under the edit loop's layer in ``backends/base.py``);
* ``backends/base.py`` defines the backend interface only: no second home for the run's state.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path
from typing import Any

from flakebot_magic.records.journal import Journal, ResumePoint
from flakebot_magic.records.races import RacePoint, RaceRecord
from flakebot_magic.stages.accept import Example
from flakebot_magic.stages.state import RunDeps, RunState

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"


def _mentions_any(hint: Any) -> bool:
    return hint is Any or any(_mentions_any(arg) for arg in typing.get_args(hint))


def test_every_field_of_the_run_has_a_real_type() -> None:
    hints = typing.get_type_hints(RunState)
    loose = [
        f.name
        for f in dataclasses.fields(RunState)
        if _mentions_any(hints[f.name]) and f.name != "session"  # the manifest's free-form record
    ]
    assert loose == []
    assert hints["journal"] == Journal | None
    assert hints["resume"] == ResumePoint | RacePoint | None
    assert hints["race"] == RaceRecord | None
    assert hints["examples"] == list[Example]
    assert not any(_mentions_any(h) for h in typing.get_type_hints(RunDeps).values())


def test_backends_base_holds_the_backend_interface_only() -> None:
    tree = ast.parse((PACKAGE / "backends" / "base.py").read_text(encoding="utf-8"))
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert classes == {"Built", "Backend"}
    state = ast.parse((PACKAGE / "stages" / "state.py").read_text(encoding="utf-8"))
    assert {n.name for n in state.body if isinstance(n, ast.ClassDef)} == {
        "RunDeps",
        "BackendChoice",
        "RunState",
        "Stage",
    }
