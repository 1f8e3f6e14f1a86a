"""No binary runs unless its store entry is whole, at every door that makes a client from a record.

A real tool (tinyecho, built by cargo once) is damaged three ways: another
program in its binary's place (what swapping two tools' binaries does; this
one leaves a marker file if it ever runs), one byte changed (size and mtime
kept), the binary truncated. Each door refuses with an error naming the tool
and ``rebuild``: ``flakebot_magic.load``, ``load_all`` (the kernel restart
path: ``%flakebot load --all``), the magic's ``%flakebot load``, the
agents' ``flakebot_magic.call`` (the Jupyter server's and MCP agent's
catalog), and a client loaded while the entry was whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.interactiveshell import InteractiveShell
from tinycrates import write_registry
from traitlets.config import Config

import flakebot_magic
from flakebot_magic.config import Settings
from flakebot_magic.errors import FlakebotError
from flakebot_magic.manage import tools
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.inventory import Inventory

pytestmark = pytest.mark.cargo


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    root = tmp_path_factory.mktemp("damage")
    registry = write_registry(root / "registry", ["tinyecho"])
    settings = Settings(cache_dir=root / "cache", registry=str(registry), backend="cargo")
    Pipeline(settings).run("", crate="tinyecho", name="te")
    return settings


def _other(binary: Path) -> None:
    binary.write_text(f"#!/bin/sh\ntouch {binary.parent.parent.parent / 'RAN'}\necho I-AM-OTHER\n")


def _byte(binary: Path) -> None:
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 1
    stat = binary.stat()
    binary.write_bytes(bytes(data))
    os.utime(binary, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _truncate(binary: Path) -> None:
    os.truncate(binary, binary.stat().st_size // 2)


@pytest.fixture(params=[_other, _byte, _truncate], ids=["another-binary", "one-byte", "truncated"])
def damaged(built: Settings, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The tool ``te`` with its binary damaged one way; restored after (the store entry is the module's)."""
    record = Inventory(built.cache.tools).get("te")
    assert record is not None
    binary = Path(record.binary)
    kept = binary.read_bytes()
    mode = binary.stat().st_mode
    request.param(binary)
    os.chmod(binary, mode)
    yield binary.parent.parent.parent / "RAN"
    binary.write_bytes(kept)
    os.chmod(binary, mode)
    assert flakebot_magic.load("te", cache_dir=built.cache_dir)("ok") == "OK"  # whole again: it runs


def _python_load(settings: Settings) -> Any:
    return flakebot_magic.load("te", cache_dir=settings.cache_dir)("hi")


def _load_all(settings: Settings) -> Any:
    loaded, problems = tools.load_all(settings)
    assert "te" not in loaded
    raise FlakebotError(" ".join(problems))


def _agent_call(settings: Settings) -> Any:
    call = {"id": "1", "type": "function", "function": {"name": "te", "arguments": json.dumps({"args": ["hi"]})}}
    answer = flakebot_magic.call(call, cache_dir=settings.cache_dir)
    raise FlakebotError(json.dumps(answer))  # a damaged tool is left out of the agents' list (a notice says why)


def _magic_load(settings: Settings) -> Any:
    config = Config()
    config.FlakebotMagics.cache_dir = str(settings.cache_dir)
    shell = InteractiveShell(config=config)
    try:
        shell.extension_manager.load_extension("flakebot_magic")
        for line in ("load te", "load --all"):
            try:
                shell.run_line_magic("flakebot", line)
            except IPythonUsageError as exc:
                raise FlakebotError(str(exc)) from None
            if "te" in shell.user_ns:
                return shell.user_ns["te"]("hi")
        raise FlakebotError(f"not loaded: {line}")
    finally:
        InteractiveShell.clear_instance()


REFUSED = r"te.*not the one deployed.*rebuild te"
#: each door, and how it refuses
DOORS: dict[str, tuple[Callable[[Settings], Any], str]] = {
    "flakebot_magic.load": (_python_load, REFUSED),
    "load_all (kernel restart)": (_load_all, REFUSED),
    "agents' call": (_agent_call, r"there is no function 'te'"),
    "%flakebot load": (_magic_load, REFUSED),
}


@pytest.mark.parametrize("door", DOORS)
def test_each_door_refuses_a_damaged_entry(built: Settings, damaged: Path, door: str) -> None:
    call, refused = DOORS[door]
    with pytest.raises(FlakebotError, match=refused):
        call(built)
    assert not damaged.exists(), "the damaged binary ran"


def test_a_loaded_tool_refuses_once_its_entry_is_damaged(built: Settings) -> None:
    te = flakebot_magic.load("te", cache_dir=built.cache_dir)
    assert te("a") == "A"
    record = Inventory(built.cache.tools).get("te")
    assert record is not None
    binary = Path(record.binary)
    kept, mode = binary.read_bytes(), binary.stat().st_mode
    try:
        _other(binary)
        with pytest.raises(FlakebotError, match=r"te cannot run: .*not the one deployed.*not run"):
            te("a")
        assert not (binary.parent.parent.parent / "RAN").exists()
    finally:
        binary.write_bytes(kept)
        os.chmod(binary, mode)
