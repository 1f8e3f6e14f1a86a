"""Every notebook in notebooks/ is fit to run under nbval in CI (the Makefile runs `pytest tests notebooks --nbval-lax`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_ci_runs_every_notebook_under_nbval() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"pytest tests notebooks --nbval", recipe), recipe
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_fit_for_nbval(path: Path) -> None:
    notebook = json.loads(path.read_text())
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    # saved widget state would pin model ids that a fresh kernel does not have
    assert "widgets" not in notebook["metadata"]
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or "%%flakebot" not in source:
            continue
        tags = cell["metadata"].get("tags", [])
        # a build's output (widget, timings, paths) differs from run to run
        assert "nbval-ignore-output" in tags or "NBVAL_IGNORE_OUTPUT" in source, source[:80]
