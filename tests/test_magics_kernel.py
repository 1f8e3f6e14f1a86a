"""``%%flakebot`` in a real ipykernel: the widget, provenance metadata, and a kernel that stays responsive.

A frontend is played by jupyter_client: it reads the widget's comm messages
from IOPub and clicks the Cancel button by sending the comm message a
browser would send.
"""

from __future__ import annotations

import os
import queue
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel
from tinycrates import processes_in, write_registry

pytestmark = [pytest.mark.kernel, pytest.mark.cargo]


class Kernel:
    def __init__(self, manager: KernelManager, client: BlockingKernelClient, cache: Path, registry: Path) -> None:
        self.manager, self.client, self.cache, self.registry = manager, client, cache, registry

    def run(self, code: str, timeout: float = 240) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        messages: list[dict[str, Any]] = []
        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=messages.append)
        return reply["content"], messages

    def start(self, code: str) -> str:
        return str(self.client.execute(code))

    def reply_to(self, msg_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            msg = self.client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return dict(msg["content"])

    def iopub_until(self, done: Callable[[], bool], timeout: float = 120) -> list[dict[str, Any]]:
        seen = []
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "timed out waiting on the kernel"
            try:
                seen.append(self.client.get_iopub_msg(timeout=0.1))
            except queue.Empty:
                pass
        return seen


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    root = tmp_path_factory.mktemp("kernel")
    registry = write_registry(root / "registry")
    cache = root / "cache"
    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_BACKEND": "cargo"}
    manager, client = start_new_kernel(kernel_name="python3", env=env, cwd=str(root))
    try:
        kernel = Kernel(manager, client, cache, registry)
        content, _ = kernel.run("%load_ext flakebot_magic")
        assert content["status"] == "ok", content
        yield kernel
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _button_comm(messages: list[dict[str, Any]]) -> str:
    for msg in messages:
        if msg["msg_type"] == "comm_open" and msg["content"]["data"]["state"].get("description") == "Cancel":
            return str(msg["content"]["comm_id"])
    raise AssertionError("no Cancel button was opened")


def test_cell_shows_the_widget_then_the_tool_with_its_provenance(kernel: Kernel) -> None:
    content, messages = kernel.run(f"%%flakebot --registry {kernel.registry} --crate tinyecho --name te\n")
    assert content["status"] == "ok", content
    kinds = [m["msg_type"] for m in messages]
    display = next(m for m in messages if m["msg_type"] == "display_data")
    assert "application/vnd.jupyter.widget-view+json" in display["content"]["data"]
    assert "comm_msg" in kinds  # the widget was updated while the build ran
    last = [m for m in messages if m["msg_type"] == "update_display_data"][-1]["content"]
    assert last["transient"]["display_id"] == display["content"]["transient"]["display_id"]
    # the build over, the display is its record: HTML and text, no widget (a saved notebook needs no kernel)
    assert set(last["data"]) == {"text/html", "text/plain"}
    assert "class='flakebot-record'" in last["data"]["text/html"]
    final = last["data"]["text/plain"]
    assert "ready" in final and "`te` is ready" in final
    closed = {m["content"]["comm_id"] for m in messages if m["msg_type"] == "comm_close"}
    assert closed, "the widget's models are let go once the record shows"
    result = next(m for m in messages if m["msg_type"] == "execute_result")["content"]
    provenance = result["metadata"]["flakebot"]
    assert provenance["crate"] == "tinyecho" and provenance["version"] == "0.2.0"
    assert provenance["backend"] == "cargo" and len(provenance["commit"]) == 40
    assert provenance["store_path"] and provenance["source_hash"] and provenance["checksum"]
    assert provenance["iterations"] == 0 and provenance["model"] is None
    assert "text/html" in result["data"]

    content, messages = kernel.run("print(te('hi'))\n%flakebot list")
    text = "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
    table = next(m for m in messages if m["msg_type"] == "display_data")["content"]["data"]["text/plain"]
    assert "HI" in text  # te('hi') went to standard input, which tinyecho prints in upper case
    assert "tinyecho@0.2.0" in table and "ready" in table
    _, messages = kernel.run("%flakebot show te")
    shown = "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")
    assert provenance["commit"] in shown and "tinyecho" in shown


def test_cancel_button_stops_the_build_while_the_cell_runs(kernel: Kernel) -> None:
    workspace = kernel.cache / "workspaces" / "slow"
    marker = workspace / "build-script-started"
    msg_id = kernel.start(f"%%flakebot --registry {kernel.registry} --crate slowbuild --name slow --rebuild\n")
    seen = kernel.iopub_until(marker.exists)  # the build script sleeps for a minute
    clicked = time.monotonic()
    click = {"method": "custom", "content": {"event": "click"}}
    kernel.client.shell_channel.send(
        kernel.client.session.msg("comm_msg", {"comm_id": _button_comm(seen), "data": click})
    )
    reply = kernel.reply_to(msg_id, timeout=30)
    assert time.monotonic() - clicked < 10
    assert reply["status"] == "error" and reply["ename"] == "Cancelled"
    assert str(workspace) in reply["evalue"]  # the workspace is kept, and said so
    assert (workspace / ".git").is_dir()
    assert processes_in(workspace) == []  # cargo and the build script are gone
    log = (kernel.cache / "logs" / "slow.cancelled.log").read_text()  # what %flakebot logs slow shows
    assert "Cancelled" in log and "cancelled from the widget" in log
    _assert_shown_cancelled(kernel, log)


def _assert_shown_cancelled(kernel: Kernel, log: str) -> None:
    """The record that replaced the widget (what a saved notebook keeps, no kernel needed) and the run's log say
    cancelled: the run, the stage cargo was in; no row, and no line of the log, says failed."""
    record: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    while not record:
        assert time.monotonic() < deadline, "no record replaced the widget"
        try:
            msg = kernel.client.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            continue
        if msg["msg_type"] == "update_display_data" and "text/html" in msg["content"]["data"]:
            record = msg["content"]["data"]
    assert "application/vnd.jupyter.widget-view+json" not in record
    page, text = record["text/html"], record["text/plain"]
    assert "flakebot-record' data-outcome='cancelled'" in page and "data-state='cancelled'" in page
    assert "data-state='failed'" not in page and "tests passing" not in page
    assert re.search(r"— cancelled \(", text.splitlines()[0]) and "failed" not in text.lower()
    assert "== run cancelled: Cancelled: " in log and not re.search(r"== \S+ failed", log)


def test_kernel_interrupt_cancels_the_build(kernel: Kernel) -> None:
    workspace = kernel.cache / "workspaces" / "slow2"
    marker = workspace / "build-script-started"
    msg_id = kernel.start(f"%%flakebot --registry {kernel.registry} --crate slowbuild --name slow2 --rebuild\n")
    kernel.iopub_until(marker.exists)
    interrupted = time.monotonic()
    kernel.manager.interrupt_kernel()
    reply = kernel.reply_to(msg_id, timeout=30)
    assert time.monotonic() - interrupted < 10
    assert reply["status"] == "error" and reply["ename"] == "Cancelled"
    assert processes_in(workspace) == []
    _assert_shown_cancelled(kernel, (kernel.cache / "logs" / "slow2.cancelled.log").read_text())
    content, _ = kernel.run("1 + 1")  # the kernel is fine afterwards
    assert content["status"] == "ok"


# -- %%flakebot wrapped by another cell magic (issue 12 item 4) ---------------------------------


def _texts(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"].get("text", "") for m in messages if m["msg_type"] == "stream")


@pytest.mark.parametrize(
    ("wrapper", "name"), [("%%time", "timed"), ("%%capture captured", "captured_te"), ("%%timeit -n1 -r1", "ti")]
)
def test_a_cell_magic_wrapping_flakebot_runs_it(kernel: Kernel, wrapper: str, name: str) -> None:
    """The inner cell runs the synchronous way: no `await` outside a function, no busy loop, no traceback."""
    cell = f"{wrapper}\n%%flakebot --registry {kernel.registry} --crate tinyecho --name {name}\nEcho its words.\n"
    content, messages = kernel.run(cell)
    assert content["status"] == "ok", content
    errors = [m for m in messages if m["msg_type"] == "error"]
    assert errors == [] and "SyntaxError" not in _texts(messages)
    if wrapper == "%%time":
        assert "Wall time" in _texts(messages)
    if wrapper.startswith("%%timeit"):
        assert "per loop" in _texts(messages)
    content, messages = kernel.run(f"print({name}('hi'))")
    assert content["status"] == "ok", content
    assert "HI" in _texts(messages)
    if wrapper.startswith("%%capture"):
        _, messages = kernel.run("print(type(captured).__name__, len(captured.outputs) >= 1)")
        assert "CapturedIO True" in _texts(messages)  # the widget's display went into the capture


def test_time_over_a_failing_flakebot_cell_is_a_one_line_error(kernel: Kernel) -> None:
    content, _ = kernel.run("%%time\n%%flakebot --name 1bad\nanything\n")
    assert content["status"] == "error" and content["ename"] == "UsageError", content
    assert "is not a valid tool name" in content["evalue"]
