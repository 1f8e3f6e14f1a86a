"""What a valid tool name is, decided once (``host.names.is_tool_name``) and applied alike at every door.

The doors: a build's ``--name``, the lock file, the steering mailbox, the session journals, ``flakebot cargo
NAME``, an eval task's name and the server's URLs. Each accepts exactly the names the rule accepts; and no
module but ``host/names.py`` decides it by itself (``str.isidentifier``, its own pattern).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.errors import FlakebotError, UsageError
from flakebot_magic.host.cache import CacheLayout
from flakebot_magic.host.locks import tool_lock
from flakebot_magic.host.names import TOOL_NAME_PATTERN, check_tool_name, is_tool_name, tool_name
from flakebot_magic.manage.workspace_cargo import run_cargo
from flakebot_magic.records.journal import journals_dir
from flakebot_magic.records.steering import Inbox

PACKAGE = Path(__file__).resolve().parents[1] / "flakebot_magic"
NAMES = ["md", "_x", "pulldown_cmark", "X9", "a" * 128]
BAD = ["", "a" * 129, "../x", "a/b", ".hidden", "a-b", "a.b", "na me", "9lives", "class", "café", "x\n"]


def test_the_rule() -> None:
    assert [n for n in NAMES if not is_tool_name(n)] == []
    assert [n for n in BAD if is_tool_name(n)] == []
    assert all(is_tool_name(tool_name(n)) for n in [*NAMES, *BAD[1:], "pulldown-cmark", "match"])


def _door_accepts(door: str, name: str, tmp_path: Path) -> bool:
    """Whether ``door`` takes ``name`` as a tool's name (a UsageError naming it means no)."""
    try:
        if door == "check":
            check_tool_name(name)
        elif door == "lock":
            with tool_lock(CacheLayout(tmp_path), name):
                pass
        elif door == "steering":
            Inbox(CacheLayout(tmp_path), name)
        elif door == "journal":
            journals_dir(tmp_path, name)
        elif door == "cargo":
            run_cargo(Settings(cache_dir=tmp_path), name, ["metadata"])
        elif door == "server":
            return re.fullmatch(TOOL_NAME_PATTERN, name) is not None and is_tool_name(name)
    except UsageError as exc:
        refusals = ("not a valid tool name", "is not a tool's name", "Usage: flakebot cargo NAME")
        return not any(words in str(exc) for words in refusals)
    except FlakebotError:  # past the name: no such tool, no sandbox...
        return True
    return True


@pytest.mark.parametrize("door", ["check", "lock", "steering", "journal", "cargo", "server"])
def test_every_door_applies_the_one_rule(door: str, tmp_path: Path) -> None:
    verdicts = {name: _door_accepts(door, name, tmp_path) for name in [*NAMES, *BAD]}
    assert verdicts == {name: is_tool_name(name) for name in verdicts}


def test_no_module_decides_by_itself_what_a_tool_name_is() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "host" / "names.py" or (PACKAGE / "eval" / "suites") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "isidentifier":
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} calls isidentifier")
            if isinstance(node, ast.Constant) and "not a valid tool name" in str(node.value):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} words its own refusal")
    assert found == []
