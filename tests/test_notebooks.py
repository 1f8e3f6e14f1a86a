"""Every notebook in notebooks/ is checked by nbval in CI: `make test` runs `pytest tests notebooks --nbval`.

nbval compares each cell's fresh output with the output stored in the
notebook, so the stored outputs must be the real current ones (re-run with
``scripts/run_notebook.py --inplace``) and free of anything that differs from
run to run. A cell whose output cannot be the same twice (a build's widget and
timings, store paths, ports, pids) says so: ``# NBVAL_IGNORE_OUTPUT`` alone on
its first line (nbval reads it only so) and ``# why`` under it, or the
``nbval-ignore-output`` tag on a ``%%flakebot`` cell (a cell magic must be the
cell's first line, so it cannot carry the comment).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SCRIPTED = [path for path in NOTEBOOKS if "FakeOpenAIServer" in path.read_text()]
IGNORE = "# NBVAL_IGNORE_OUTPUT"
# what differs from run to run: never in a checked cell's stored output
VOLATILE = re.compile(r"/tmp/|127\.0\.0\.1:\d|/work/|/home/|\bpid \d")


def _source(cell: dict[str, Any]) -> str:
    return "".join(cell["source"])


def _ignored(cell: dict[str, Any]) -> bool:
    return "nbval-ignore-output" in cell["metadata"].get("tags", []) or _source(cell).startswith(IGNORE + "\n")


def _text(output: dict[str, Any]) -> str:
    if output["output_type"] == "stream":
        return "".join(output["text"])
    data = output.get("data", {})
    return "".join(data.get("text/plain", "")) + "".join(data.get("text/html", ""))


def _code_cells(path: Path) -> list[dict[str, Any]]:
    return [cell for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]


def test_ci_checks_every_notebooks_outputs_with_nbval() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"pytest tests notebooks --nbval\b", recipe), recipe
    assert "--nbval-lax" not in recipe, "--nbval-lax compares no output: a changed output would pass"
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_fit_for_nbval(path: Path) -> None:
    notebook = json.loads(path.read_text())
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    # saved widget state would pin model ids that a fresh kernel does not have
    assert "widgets" not in notebook["metadata"]
    for cell in _code_cells(path):
        source = _source(cell)
        if "%%flakebot" in source:
            # a build's output (widget, timings, paths) differs from run to run
            assert _ignored(cell), source[:80]
        if IGNORE in source:
            # nbval reads the marker only alone on its line; the comment under it says why
            assert re.match(rf"{IGNORE}\n# \S", source), (
                f"put '{IGNORE}' on a line of its own, then '# why': {source[:80]}"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_are_a_real_run_nbval_can_compare(path: Path) -> None:
    cells = _code_cells(path)
    # every cell ran (in order, in one kernel) and none failed: what is stored is what a run gives
    assert [cell["execution_count"] for cell in cells] == list(range(1, len(cells) + 1)), (
        f"re-run it: .venv/bin/python scripts/run_notebook.py --inplace {path.relative_to(ROOT)}"
    )
    assert not [o for cell in cells for o in cell["outputs"] if o["output_type"] == "error"]
    checked = [cell for cell in cells if not _ignored(cell)]
    assert any(cell["outputs"] for cell in checked), "no checked cell prints anything: nbval would prove nothing"
    for cell in checked:
        for output in cell["outputs"]:
            found = VOLATILE.search(_text(output))
            assert not found, f"checked output holds {found.group()!r}, which differs per run: {_source(cell)[:80]}"


@pytest.mark.parametrize("path", SCRIPTED, ids=lambda p: p.name)
def test_the_fake_model_is_labelled_as_a_test_double(path: Path) -> None:
    cells = _code_cells(path)
    shown = "".join(_text(output) for cell in cells for output in cell["outputs"])
    assert "scripted test double (not a language model)" in shown


#: a path on someone's machine (a checkout, a home, a cache in /tmp): never in a committed notebook, checked or not;
#: only a notebook that makes a temporary cache of its own (the agent notebooks) shows that one (issue 21)
LOCAL_PATH = re.compile(r"/work/|/home/|/root/|/Users/")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_output_names_a_local_path(path: Path) -> None:
    own_cache = "tempfile.mkdtemp" in path.read_text()
    for cell in _code_cells(path):
        outputs = json.dumps(cell["outputs"])
        found = LOCAL_PATH.search(outputs) or (None if own_cache else re.search("/tmp/", outputs))
        assert not found, f"{found.group()!r} in the outputs of: {_source(cell)[:80]}; re-run with --inplace"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_build_cell_is_saved_as_its_record_not_a_widget(path: Path) -> None:
    """A widget view needs the kernel that made it; the record (HTML and text) needs nothing."""
    for cell in _code_cells(path):
        for output in cell["outputs"]:
            assert "application/vnd.jupyter.widget-view+json" not in output.get("data", {}), _source(cell)[:80]
        if _source(cell).startswith("%%flakebot"):
            html = "".join("".join(o.get("data", {}).get("text/html", "")) for o in cell["outputs"])
            assert "class='flakebot-record'" in html and "class='flakebot-stages'" in html, _source(cell)[:80]


def test_the_notebooks_find_what_they_need_wherever_they_are_copied(tmp_path: Path) -> None:
    """No notebook walks up from its working directory to the checkout (edit-loop did, to tests/scripts)."""
    import subprocess
    import sys

    for path in NOTEBOOKS:
        assert "tests/scripts" not in path.read_text() and ".parents" not in path.read_text(), path.name
    first = next(c for c in _code_cells(ROOT / "notebooks" / "edit-loop.ipynb") if "FakeOpenAIServer(" in _source(c))
    code = _source(first) + "\nreplay.stop()\n"
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert "scripted test double (not a language model) replaying 3 responses" in ran.stdout


def test_the_quickstart_shows_a_newcomer_no_test_markers() -> None:
    """Issue 37: `# NBVAL_IGNORE_OUTPUT` comments showed in the quickstart; its cells carry the tag instead."""
    quickstart = ROOT / "notebooks" / "quickstart.ipynb"
    assert all(IGNORE not in _source(cell) for cell in _code_cells(quickstart))
