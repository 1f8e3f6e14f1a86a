"""A real Jupyter server (or JupyterLab) on 127.0.0.1 for the tests, with its own config dirs and a token.

The flakebot extension is enabled the way users get it: by the
``jupyter_server_config.d/flakebot_magic.json`` the package installs.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

__all__ = ["JupyterProcess", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class JupyterProcess:
    """``python -m jupyter_server`` (``app="server"``) or ``python -m jupyterlab`` (``app="lab"``)."""

    def __init__(self, root: Path, *, app: str = "server", env: dict[str, str] | None = None) -> None:
        self.root = root
        self.app = app
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home = root.parent / f"{root.name}-jupyter"
        self.env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "JUPYTERLAB_SETTINGS_DIR": str(home / "lab-settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "lab-workspaces"),
            **(env or {}),
        }
        self.log = home / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _lab_settings(self) -> None:
        # what a user would click once: start the notebook's kernel without asking, fetch no news
        settings = Path(self.env["JUPYTERLAB_SETTINGS_DIR"])
        for plugin, values in {
            "notebook-extension/tracker": {"autoStartDefaultKernel": True},
            "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        }.items():
            path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))

    def start(self, timeout: float = 90.0) -> JupyterProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        if self.app == "lab":
            self._lab_settings()
        module = "jupyterlab" if self.app == "lab" else "jupyter_server"
        argv = [
            sys.executable,
            "-m",
            module,
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
        ]
        if self.app == "lab":
            argv += [
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.news_url=None",
                "--LabApp.extension_manager=readonly",
            ]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"jupyter exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
                try:
                    if client.get(f"{self.url}/api/status", params={"token": self.token}).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"jupyter did not start in {timeout:.0f}s:\n{self.log.read_text()[-3000:]}")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def client(self, *, token: bool = True) -> httpx.Client:
        headers = {"Authorization": f"token {self.token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, follow_redirects=False)
