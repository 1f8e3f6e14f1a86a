"""A real kernel builds and starts an MCP server and an HTTP service; stopping and killing it leaves no tool process."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.manager import KernelManager, start_new_kernel

from flakebot_magic.config import Settings
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.testing.overlay import fixture_crates_buildable

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.cargo,
    pytest.mark.skipif(not fixture_crates_buildable(), reason="needs serde_json and tiny_http: run `make install`"),
]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _run(client: Any, code: str, timeout: float = 300) -> str:
    messages: list[dict[str, Any]] = []
    reply = client.execute_interactive(code, timeout=timeout, output_hook=messages.append)
    text = "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
    assert reply["content"]["status"] == "ok", (reply["content"], text)
    return text


@pytest.fixture
def kernel(fixture_settings: Settings, tmp_path: Any) -> Iterator[tuple[KernelManager, Any]]:
    for crate in ("demo-mcp", "demo-http"):  # built here, so the kernel's runs are cache hits
        Pipeline(fixture_settings).run("", crate=crate, name=f"warm_{crate.replace('-', '_')}").close()
    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(fixture_settings.cache_dir), "FLAKEBOT_BACKEND": "cargo"}
    manager, client = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    try:
        yield manager, client
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)
        else:
            manager.cleanup_resources()


def test_stop_by_name_then_no_orphans_after_kill_9(
    kernel: tuple[KernelManager, Any], fixture_settings: Settings
) -> None:
    manager, client = kernel
    registry = fixture_settings.registry
    _run(client, "%load_ext flakebot_magic")
    _run(client, f"%%flakebot --registry {registry} --crate demo-mcp --name calc\n")
    _run(client, f"%%flakebot --registry {registry} --crate demo-http --name svc\n")
    out = _run(client, "print(calc.add(a=1, b=2), svc.greet(name='k'), calc.pid, svc.pid)")
    assert "{'sum': 3.0} {'greeting': 'Hello, k.'}" in out
    calc_pid, svc_pid = map(int, out.split()[-2:])
    assert _alive(calc_pid) and _alive(svc_pid)

    # %flakebot stop NAME stops the process; the next call starts it again
    stopped = _run(client, "%flakebot stop calc")
    assert "stopped calc" in stopped
    deadline = time.monotonic() + 5
    while _alive(calc_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(calc_pid)
    assert "output" in _run(client, "%flakebot logs svc")
    out = _run(client, "print(calc.add(a=2, b=2), calc.pid)")
    assert "{'sum': 4.0}" in out
    calc_pid = int(out.split()[-1])

    # kill -9 the kernel: the parent-death signal takes the tools with it
    kernel_pid = manager.provisioner.pid  # type: ignore[union-attr]
    assert kernel_pid is not None
    os.kill(kernel_pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while (_alive(calc_pid) or _alive(svc_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(calc_pid), "the MCP server outlived the kernel"
    assert not _alive(svc_pid), "the HTTP service outlived the kernel"


def test_a_kernel_restart_stops_the_tools(kernel: tuple[KernelManager, Any], fixture_settings: Settings) -> None:
    manager, client = kernel
    _run(client, "%load_ext flakebot_magic")
    _run(client, f"%%flakebot --registry {fixture_settings.registry} --crate demo-mcp --name calc\n")
    calc_pid = int(_run(client, "calc.add(a=1, b=2); print(calc.pid)").split()[-1])  # started at the first call
    assert _alive(calc_pid)
    manager.restart_kernel(now=False)  # a clean shutdown first: the interpreter's exit stops its tools
    deadline = time.monotonic() + 5
    while _alive(calc_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(calc_pid)
