"""Issue 37: a kernel restarted while a build runs leaves a record, not a frozen widget.

A frontend is played by jupyter_client, as in tests/test_magics_kernel.py: the build (a crate whose build
script sleeps) is shown as a widget; the kernel is restarted the way JupyterLab restarts it (a shutdown
request with ``restart: true``, then a new kernel); before the old kernel exits, the cell's display is
updated with the build's record, which says why it stopped and keeps the log. Its build is gone.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel
from tinycrates import processes_in, write_registry

pytestmark = [pytest.mark.kernel, pytest.mark.cargo]


def test_a_restart_under_a_build_ends_it_as_a_record(tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry")
    cache = tmp_path / "cache"
    env = {**os.environ, "FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_BACKEND": "cargo"}
    manager, client = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    try:
        assert client.execute_interactive("%load_ext flakebot_magic", timeout=60)["content"]["status"] == "ok"
        workspace = cache / "workspaces" / "slow"
        client.execute(f"%%flakebot --registry {registry} --crate slowbuild --name slow --rebuild\n")
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 240
        while not (workspace / "build-script-started").exists():
            assert time.monotonic() < deadline, "the build script never started"
            try:
                seen.append(client.get_iopub_msg(timeout=0.1))
            except queue.Empty:
                pass
        live = [m for m in seen if "application/vnd.jupyter.widget-view+json" in m["content"].get("data", {})]
        assert live
        # a notebook saved now (or after JupyterLab's restart, which drops the record below) keeps a static record
        assert live[0]["content"]["metadata"] == {"flakebot": {"live": True, "pid": manager.provisioner.pid}}
        assert "did not end here" in live[0]["content"]["data"]["text/html"]
        manager.restart_kernel(now=False)  # a shutdown request (restart: true), as JupyterLab's restart sends
        record: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while not record and time.monotonic() < deadline:
            try:
                msg = client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            if msg["msg_type"] == "update_display_data" and "text/html" in msg["content"]["data"]:
                record = msg["content"]["data"]
        assert record, "no record replaced the widget before the kernel went"
        assert "application/vnd.jupyter.widget-view+json" not in record
        page, text = record["text/html"], record["text/plain"]
        assert "interrupted by a kernel restart" in page and "interrupted by a kernel restart" in text
        assert "data-outcome='cancelled'" in page and "data-state='running'" not in page
        assert "flakebot-log" in page  # the log is kept
        # and saved, as a cancelled run's, before the kernel went: `%flakebot logs slow` reads it in the new kernel
        saved = cache / "logs" / "slow.cancelled.log"
        assert saved.exists(), f"no cancelled log: {sorted(p.name for p in (cache / 'logs').glob('*'))}"
        assert "interrupted by a kernel restart" in saved.read_text()
        deadline = time.monotonic() + 30
        while processes_in(workspace):
            assert time.monotonic() < deadline, "the build outlived its kernel"
            time.sleep(0.2)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
