"""Issue 37: a notebook saved under a live ``%%flakebot`` widget keeps a static record, not a dead widget view.

The invariant: a saved output marked as a build's live display (``{"flakebot": {"live": true, "pid": PID}}``)
whose kernel process is gone never keeps the widget view (a pointer into that kernel) and always keeps its text/html
and text/plain; one whose kernel runs keeps its view (a page reloaded mid-build gets the live widget back); every
other output is saved exactly as sent. Proven on the hook over each output class, then through a real Jupyter
server's contents API (the hook the extension registers).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jupyter_process import JupyterProcess

from flakebot_magic.server.saved import WIDGET_VIEW, live_mark, static_records
from flakebot_magic.views.widget import ProgressWidget

VIEW = {WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": "abc"}}


def _gone_pid() -> int:
    """The pid of a process that has exited (a restarted kernel's)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _live(pid: int | None = None) -> dict[str, Any]:
    """A build's live display as the magic sends it; by default from a kernel that is gone."""
    bundle = ProgressWidget("Render Markdown text to HTML.", name="md").mimebundle()
    mark = live_mark()
    mark["flakebot"]["pid"] = _gone_pid() if pid is None else pid
    return {"output_type": "display_data", "data": bundle, "metadata": mark}


def _notebook(*outputs: dict[str, Any]) -> dict[str, Any]:
    cell = {"cell_type": "code", "source": "", "metadata": {}, "execution_count": 1, "outputs": list(outputs)}
    return {"type": "notebook", "content": {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}}


#: outputs the hook must leave exactly as they are: other widgets, marked ones without a static record, records
OTHERS = [
    {"output_type": "display_data", "data": {**VIEW, "text/plain": "IntSlider()"}, "metadata": {}},
    {"output_type": "display_data", "data": {**VIEW, "text/plain": "x"}, "metadata": live_mark()},  # no text/html
    {"output_type": "display_data", "data": {**VIEW, "text/html": "<b>x</b>"}, "metadata": {"flakebot": "live"}},
    {"output_type": "display_data", "data": {"text/html": "<div class='flakebot-record'></div>"}, "metadata": {}},
    {"output_type": "stream", "name": "stdout", "text": "hi"},
    {"output_type": "error", "ename": "E", "evalue": "v", "traceback": []},
]


def test_the_live_display_carries_its_static_record() -> None:
    live = _live()
    page = live["data"]["text/html"]
    assert WIDGET_VIEW in live["data"] and "text/plain" in live["data"]
    assert "did not end here" in page and "%flakebot logs md" in page and "Traceback" not in page
    assert "data-level='warning'" in page  # amber, a notice


@pytest.mark.parametrize("other", OTHERS, ids=lambda o: str(o.get("output_type")) + str(sorted(o.get("data", {}))))
def test_a_saved_live_build_keeps_its_record_and_nothing_else_changes(other: dict[str, Any]) -> None:
    model = _notebook(_live(), other, _live())
    before = copy.deepcopy(model)
    static_records(model=model, path="x.ipynb", contents_manager=None)
    live_a, kept, live_b = model["content"]["cells"][0]["outputs"]
    sent_a, _, sent_b = before["content"]["cells"][0]["outputs"]
    for saved, sent in ((live_a, sent_a), (live_b, sent_b)):
        assert WIDGET_VIEW not in saved["data"]
        assert saved["data"]["text/html"] == sent["data"]["text/html"]
        assert saved["data"]["text/plain"] == sent["data"]["text/plain"]
        assert saved["metadata"] == sent["metadata"]
    assert kept == other  # untouched


def test_models_that_are_not_notebooks_are_left_alone() -> None:
    for model in ({"type": "file", "content": "x"}, {"type": "notebook", "content": None}, None, {"type": "directory"}):
        snapshot = copy.deepcopy(model)
        static_records(model=model)
        assert model == snapshot


@pytest.mark.kernel
def test_the_server_saves_a_live_build_as_its_record(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    jupyter = JupyterProcess(root, env={"FLAKEBOT_CACHE_DIR": str(tmp_path / "cache")}).start()
    try:
        model = _notebook(_live(), OTHERS[0])
        with jupyter.client() as client:
            put = client.put("/api/contents/saved.ipynb", json={"type": "notebook", "content": model["content"]})
            assert put.status_code in (200, 201), put.text
        outputs = json.loads((root / "saved.ipynb").read_text())["cells"][0]["outputs"]
        assert WIDGET_VIEW not in outputs[0]["data"] and "did not end here" in "".join(outputs[0]["data"]["text/html"])
        assert WIDGET_VIEW in outputs[1]["data"]  # another widget is saved as it was
    finally:
        jupyter.stop()


def test_the_mark_names_the_kernel_that_shows_the_build() -> None:
    assert live_mark() == {"flakebot": {"live": True, "pid": os.getpid()}}


@pytest.mark.parametrize("pid", ["running", "gone", None, "text", 0, -1, True])
def test_a_live_build_keeps_its_view_while_its_kernel_runs_and_only_then(pid: object) -> None:
    live = _live()
    if pid == "running":
        live["metadata"]["flakebot"]["pid"] = os.getpid()
    elif pid == "gone":
        pass
    elif pid is None:
        del live["metadata"]["flakebot"]["pid"]
    else:
        live["metadata"]["flakebot"]["pid"] = pid
    model = _notebook(live)
    static_records(model=model)
    kept = model["content"]["cells"][0]["outputs"][0]["data"]
    assert (WIDGET_VIEW in kept) == (pid == "running")
    assert kept["text/html"] and kept["text/plain"]
