"""``call()`` and ``acall()`` in a real ipykernel: the widget shows an agent's build, and Cancel stops it.

A frontend is played by jupyter_client: it reads the widget's comm messages
from IOPub and clicks the Cancel button by sending the comm message a
browser would send. ``await acall(...)`` keeps the kernel reading messages
while it builds, so the click arrives; a synchronous ``call()`` is stopped by
interrupting the kernel.
"""

from __future__ import annotations

import json
import os
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel
from polling import wait_for
from tinycrates import processes_in, write_registry

pytestmark = [pytest.mark.kernel, pytest.mark.cargo]


class Kernel:
    def __init__(self, manager: KernelManager, client: BlockingKernelClient, cache: Path) -> None:
        self.manager, self.client, self.cache = manager, client, cache
        self.seen: list[dict[str, Any]] = []

    def run(self, code: str, timeout: float = 240) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        messages: list[dict[str, Any]] = []
        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=messages.append)
        return reply["content"], messages

    def start(self, code: str) -> str:
        self.seen = []
        return str(self.client.execute(code))

    def read_iopub(self) -> bool:
        try:
            self.seen.append(self.client.get_iopub_msg(timeout=0.1))
        except queue.Empty:
            pass
        return False

    def reply_to(self, msg_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return dict(msg["content"])

    def cancel_button(self) -> str | None:
        for m in self.seen:
            if m["msg_type"] == "comm_open" and m["content"]["data"]["state"].get("description") == "Cancel":
                return str(m["content"]["comm_id"])
        return None

    def click_cancel(self) -> None:
        """Click the widget's Cancel (reading IOPub until its button has been opened)."""
        comm = wait_for(lambda: self.read_iopub() or self.cancel_button(), 30, "the widget's Cancel button")
        click = {"method": "custom", "content": {"event": "click"}}
        self.client.shell_channel.send(self.client.session.msg("comm_msg", {"comm_id": comm, "data": click}))


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    root = tmp_path_factory.mktemp("kernel")
    registry = write_registry(root / "registry")
    cache = root / "cache"
    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_BACKEND": "cargo"}
    manager, client = start_new_kernel(kernel_name="python3", env=env, cwd=str(root))
    try:
        kernel = Kernel(manager, client, cache)
        # the registry comes from the kernel's configuration of the magic, not from call()'s arguments
        setup = f"%load_ext flakebot_magic\n%config FlakebotMagics.registry = {str(registry)!r}\nimport flakebot_magic"
        content, _ = kernel.run(setup)
        assert content["status"] == "ok", content
        yield kernel
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _build_call(ident: str, **arguments: Any) -> str:
    call = {"id": ident, "type": "function", "function": {"name": "build_tool", "arguments": json.dumps(arguments)}}
    return repr(call)


def test_call_shows_the_widget_and_puts_the_tool_in_the_kernel(kernel: Kernel) -> None:
    code = f"result = flakebot_magic.call({_build_call('c1', request='echo', crate='tinyecho', name='te')})\n"
    content, messages = kernel.run(code + "print(result['content'])")
    assert content["status"] == "ok", content
    printed = "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
    assert printed.startswith("Built `te`") and "requested by notebook" in printed, printed
    display = next(m for m in messages if m["msg_type"] == "display_data")
    assert "application/vnd.jupyter.widget-view+json" in display["content"]["data"]
    final = [m for m in messages if m["msg_type"] == "update_display_data"][-1]["content"]["data"]
    assert "ready" in final["text/plain"] and "class='flakebot-record'" in final["text/html"]  # the record stays
    assert "application/vnd.jupyter.widget-view+json" not in final
    content, messages = kernel.run("print(te('hi'))")  # the tool is in the kernel under its name
    assert content["status"] == "ok", content
    assert "HI" in "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")


def test_the_cancel_button_stops_a_build_awaited_with_acall(kernel: Kernel) -> None:
    workspace = kernel.cache / "workspaces" / "slow"
    call = _build_call("c2", request="", crate="slowbuild", name="slow")
    msg_id = kernel.start(f"import flakebot_magic.agent\nawait flakebot_magic.agent.acall({call})\n")
    # the build script sleeps for a minute
    wait_for(lambda: kernel.read_iopub() or (workspace / "build-script-started").exists(), 120, "the build script")
    clicked = time.monotonic()
    kernel.click_cancel()
    reply = kernel.reply_to(msg_id, timeout=30)
    assert time.monotonic() - clicked < 10
    assert reply["status"] == "error" and reply["ename"] == "Cancelled", reply
    assert str(workspace) in reply["evalue"]  # the workspace is kept, and said so
    wait_for(lambda: not processes_in(workspace), 30, "cargo and the build script to stop")
    log = kernel.cache / "logs" / "slow.cancelled.log"
    wait_for(log.exists, 30, "the stopped run's log")
    assert "cancelled from the widget" in log.read_text()


def test_an_interrupt_stops_a_build_in_a_synchronous_call(kernel: Kernel) -> None:
    workspace = kernel.cache / "workspaces" / "slow2"
    call = _build_call("c3", request="", crate="slowbuild", name="slow2")
    msg_id = kernel.start(f"flakebot_magic.call({call})\n")
    wait_for(lambda: kernel.read_iopub() or (workspace / "build-script-started").exists(), 120, "the build script")
    interrupted = time.monotonic()
    kernel.manager.interrupt_kernel()
    reply = kernel.reply_to(msg_id, timeout=30)
    assert time.monotonic() - interrupted < 10
    assert reply["status"] == "error" and reply["ename"] == "Cancelled", reply
    wait_for(lambda: not processes_in(workspace), 30, "cargo and the build script to stop")
    content, _ = kernel.run("1 + 1")  # the kernel is fine afterwards
    assert content["status"] == "ok"
