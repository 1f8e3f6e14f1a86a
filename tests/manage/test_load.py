"""Tools built earlier, back without a rebuild: ``flakebot_magic.load`` and ``%flakebot load`` (issue 12 item 3).

The last test restarts a real ipykernel: the tools are still listed, not in
the namespace, and ``%flakebot load --all`` brings them back, callable.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.interactiveshell import InteractiveShell
from tinycrates import write_registry
from traitlets.config import Config

import flakebot_magic
from flakebot_magic.clients import lifecycle
from flakebot_magic.config import Settings
from flakebot_magic.errors import UsageError
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.testing.overlay import FIXTURES, overlay_registry

pytestmark = pytest.mark.cargo


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """tinyecho (a CLI tool) and the demo MCP server, built once; nothing of them is kept running."""
    root = tmp_path_factory.mktemp("load")
    registry = overlay_registry(root / "registry", [FIXTURES / "demo-mcp"])
    write_registry(registry, ["tinyecho"])
    settings = Settings(cache_dir=root / "cache", registry=str(registry), backend="cargo")
    Pipeline(settings).run("", crate="tinyecho", name="te")
    calc = Pipeline(settings).run("", crate="demo-mcp", name="calc")
    calc.close()
    lifecycle.unregister(calc)  # type: ignore[arg-type]
    return settings


def _store_entries(settings: Settings) -> list[str]:
    return sorted(p.name for p in settings.cache.store.iterdir())


def test_load_returns_the_tool_without_building_or_injecting(built: Settings) -> None:
    before = (_store_entries(built), Inventory(built.cache.tools).get("te"))
    te = flakebot_magic.load("te", cache_dir=built.cache_dir)
    assert te("hi") == "HI" and te.name == "te"  # standard input, in upper case
    assert "te" not in globals()
    assert (_store_entries(built), Inventory(built.cache.tools).get("te")) == before  # nothing rebuilt or rewritten


def test_an_mcp_tool_is_started_as_its_kind_requires(built: Settings) -> None:
    calc: Any = flakebot_magic.load("calc", cache_dir=built.cache_dir)
    try:
        assert calc.kind == "mcp" and calc.running and calc.pid
        record = Inventory(built.cache.tools).get("calc")
        assert record is not None and record.status == "running" and record.pid == calc.pid
        assert calc.add(a=2, b=3) == {"sum": 5.0}
    finally:
        calc.close()
        lifecycle.unregister(calc)


def test_unknown_or_cleaned_tools_are_clear_errors(built: Settings, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"No tool named 'nope' \(tools: .*te"):
        flakebot_magic.load("nope", cache_dir=built.cache_dir)
    # a copy of the cache whose store entry is gone (as after `clean`): rebuild, says the error
    cache = tmp_path / "cache"
    shutil.copytree(built.cache_dir, cache, symlinks=True)
    record = Inventory(Settings(cache_dir=cache).cache.tools).get("te")
    assert record is not None
    Path(record.binary.replace(str(built.cache_dir), str(cache))).unlink()
    Inventory(Settings(cache_dir=cache).cache.tools).update(
        "te", binary=record.binary.replace(str(built.cache_dir), str(cache))
    )
    with pytest.raises(UsageError, match=r"is gone.*%flakebot rebuild te"):
        flakebot_magic.load("te", cache_dir=cache)


@pytest.fixture
def ip(built: Settings) -> Iterator[InteractiveShell]:
    config = Config()
    config.FlakebotMagics.cache_dir = str(built.cache_dir)
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("flakebot_magic")
    yield shell
    calc = shell.user_ns.get("calc")
    if calc is not None:
        calc.close()
        lifecycle.unregister(calc)
    InteractiveShell.clear_instance()


def test_the_magic_loads_one_or_all_into_the_namespace(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_line_magic("flakebot", "load te")
    assert ip.user_ns["te"]("x") == "X" and "calc" not in ip.user_ns
    assert "`te` is ready in the kernel" in capsys.readouterr().out
    ip.run_line_magic("flakebot", "load --all")
    assert {"te", "calc"} <= set(ip.user_ns) and ip.user_ns["calc"].running
    for line in ("load", "load te calc", "load te --all"):
        with pytest.raises(IPythonUsageError, match=r"%flakebot load NAME, or %flakebot load --all"):
            ip.run_line_magic("flakebot", line)
    with pytest.raises(IPythonUsageError, match="No tool named 'nope'"):
        ip.run_line_magic("flakebot", "load nope")


@pytest.mark.kernel
def test_after_a_kernel_restart_load_all_brings_the_tools_back(built: Settings) -> None:
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(built.cache_dir), "FLAKEBOT_BACKEND": "cargo"}
    manager, client = start_new_kernel(kernel_name="python3", env=env)

    def run(code: str) -> tuple[dict[str, Any], str]:
        messages: list[dict[str, Any]] = []
        reply = client.execute_interactive(code, timeout=120, output_hook=messages.append)
        text = "".join(
            m["content"].get("text", "") or m["content"].get("data", {}).get("text/plain", "")
            for m in messages
            if m["msg_type"] in ("stream", "execute_result", "display_data")
        )
        return reply["content"], text

    try:
        content, _ = run("%load_ext flakebot_magic")
        assert content["status"] == "ok", content
        content, text = run(f"%%flakebot --registry {built.registry} --crate tinyecho --name te\nEcho words.\n")
        assert content["status"] == "ok", content
        _, text = run("print(te('a b'))")
        assert "A B" in text

        manager.restart_kernel(now=True)
        client.wait_for_ready(timeout=60)
        content, text = run("%load_ext flakebot_magic\n%flakebot list")
        assert content["status"] == "ok" and "te" in text and "calc" in text  # listed ...
        content, _ = run("te")
        assert content["status"] == "error" and content["ename"] == "NameError"  # ... not in the namespace
        content, text = run("%flakebot load --all")
        assert content["status"] == "ok", content
        assert "`te` is ready in the kernel" in text and "`calc` is ready in the kernel" in text
        _, text = run("print(te('back again'))\nprint(calc.running)")
        assert "BACK AGAIN" in text and "True" in text
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
