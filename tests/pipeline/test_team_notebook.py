"""What ``flakebot pull`` and a saved notebook's cell read of a notebook file: data of any shape, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.errors import UsageError
from flakebot_magic.pipeline.team import notebook_provenance, saved_pin

RECORDED = {"name": "tool", "request": "make a tool"}


@pytest.mark.parametrize(
    "cells",
    [
        [{"outputs": 5}],
        [{"outputs": [{"metadata": [1]}]}],
        [{"outputs": [{"metadata": {"flakebot": "tool"}}]}],
        [{"outputs": ["text", None, {"metadata": None}]}],
        [5, "cell", None],
        {"not": "a list"},
    ],
    ids=["outputs-a-number", "metadata-a-list", "record-a-string", "odd-outputs", "odd-cells", "cells-a-dict"],
)
def test_a_notebook_of_any_shape_records_no_tool_and_raises_no_traceback(
    tmp_path: Path, cells: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before (red team 5), ``"outputs": 5`` or a ``metadata`` list ended ``flakebot pull`` and every
    ``%%flakebot`` cell of that notebook (it looks for a pin first) with ``TypeError``/``AttributeError``."""
    notebook = tmp_path / "shared.ipynb"
    notebook.write_text(json.dumps({"cells": [*cells, {"outputs": [{"metadata": {"flakebot": RECORDED}}]}]}))
    if isinstance(cells, list):  # the well-formed record beside them is still found
        assert notebook_provenance(notebook, "tool") == RECORDED
    notebook.write_text(json.dumps({"cells": cells}))
    with pytest.raises(UsageError, match="records no tool named 'tool'"):
        notebook_provenance(notebook, "tool")
    monkeypatch.chdir(tmp_path)
    assert saved_pin(Settings(cache_dir=tmp_path / "cache"), str(notebook), "tool", "make a tool", None) is None


def test_a_notebook_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """Issue 33 (K8): a shared "notebook" that never ends is refused, not read until memory runs out or forever."""
    fifo = tmp_path / "shared.ipynb"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="Cannot read"):
        notebook_provenance(fifo, "tool")
