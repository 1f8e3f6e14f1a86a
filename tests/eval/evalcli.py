"""``flakebot eval ... --json`` run in-process for the eval's tests: its exit code, results.json (or {}) and stderr."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flakebot_magic import cli

__all__ = ["eval_json"]


def eval_json(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict[str, Any], str]:
    """``flakebot eval *args --json``, its output captured by ``capsys``."""
    code = cli.main(["eval", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), err
