"""The pytest plugin a task's hidden tests run with: the fixture ``tool``, and a report of every test's outcome.

:func:`~flakebot_magic.eval.hidden.run_pytest` runs ``pytest -p
flakebot_magic.eval.pytest_plugin`` in a child process, with three
variables: ``FLAKEBOT_EVAL_CACHE`` (the attempt's flakebot cache),
``FLAKEBOT_EVAL_TOOL`` (the tool's name in it) and ``FLAKEBOT_EVAL_REPORT``
(where this plugin writes each test's outcome as JSON). The tool is loaded
from that cache as ``flakebot_magic.load`` would, and runs CONFINED for every
call (in the sandbox, as acceptance examples do): the tool is a model's code.

A task's test uses it like any fixture::

    def test_empty_input(tool):
        assert tool(input="") == "e3b0c442...  -\\n"
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["ENV_CACHE", "ENV_REPORT", "ENV_TOOL", "tool"]

ENV_CACHE = "FLAKEBOT_EVAL_CACHE"
ENV_TOOL = "FLAKEBOT_EVAL_TOOL"
ENV_REPORT = "FLAKEBOT_EVAL_REPORT"
#: one test's failure text, as kept in the report (and shown to a --feedback attempt)
_LONGREPR_CHARS = 3000

_outcomes: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="session")
def tool() -> Iterator[Any]:
    """The deployed tool of the task's attempt: its Python client, confined to the sandbox for every call."""
    from ..config import Settings, apply
    from ..manage.tools import load

    settings = apply(Settings(), {"cache_dir": os.environ[ENV_CACHE], "confine_tools": True})
    client = load(settings, os.environ[ENV_TOOL])
    try:
        yield client
    finally:
        client.close()


def _text(report: Any) -> str:
    text = str(getattr(report, "longreprtext", "") or "")
    return (
        text
        if len(text) <= _LONGREPR_CHARS
        else text[: _LONGREPR_CHARS // 2] + "\n[...]\n" + text[-_LONGREPR_CHARS // 2 :]
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "text": ""})
    if report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        entry["text"] = _text(report)
    elif report.skipped and report.when in ("setup", "call") and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _outcomes[report.nodeid or "<collection>"] = {"outcome": "error", "text": _text(report)}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get(ENV_REPORT)
    if target:
        Path(target).write_text(json.dumps({"exitstatus": int(exitstatus), "tests": _outcomes}), encoding="utf-8")
