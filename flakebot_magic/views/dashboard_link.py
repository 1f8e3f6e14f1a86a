"""A link from a kernel to the tools' dashboard (``%flakebot dashboard``): the server extension's ``/flakebot/``.

A kernel does not know the URL its notebook was opened at, but the Jupyter
server that started it does, and says so in its runtime file
(``jpserver-PID.json``: ``base_url``, ``url``); the kernel knows that server's
pid (``$JPY_PARENT_PID``). The link is ``BASE_URL/flakebot/``, an absolute
path: the browser keeps the host and port it reached the server by (a proxy,
Binder's too), and JupyterLab leaves a path that starts with ``/`` alone (it
resolves only relative links, as files). JupyterLab's Help menu has the same
page as "flakebot dashboard" (``jupyter-config/labconfig``: a settings
override that ``make install`` merges, where Lab is served at ``/``).
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..host.fsutil import load_json, read_regular

__all__ = ["DashboardLink", "dashboard_link", "server_of_kernel"]

#: the dashboard's path under the server's base URL (server/app.py maps it)
DASHBOARD = "flakebot/"


def server_of_kernel(runtime_dir: Path | None = None, parent: int | None = None) -> dict[str, Any] | None:
    """The runtime information of the Jupyter server that started this kernel, or None (no such server)."""
    pid = parent if parent is not None else int(os.environ.get("JPY_PARENT_PID") or 0)
    if not pid:
        return None
    if runtime_dir is None:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime_dir = Path(jupyter_runtime_dir())
    for path in (runtime_dir / f"jpserver-{pid}.json", *sorted(runtime_dir.glob("jpserver-*.json"))):
        try:
            info = load_json(read_regular(path, 64 * 1024)[0].decode("utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("pid") == pid:
            return info
    return None


@dataclass(frozen=True)
class DashboardLink:
    """The dashboard's link: HTML in a notebook (opens in a new tab), its URL as text elsewhere."""

    path: str
    url: str
    found: bool

    def _repr_html_(self) -> str:
        where = "" if self.found else " (this kernel's Jupyter server was not found: its base URL is taken to be /)"
        return (
            f"<a href='{html.escape(self.path)}' target='_blank' rel='noopener'>Open the flakebot dashboard</a>"
            f" <span style='opacity:0.7'>{html.escape(self.path)}{html.escape(where)}; also in the Help menu</span>"
        )

    def __repr__(self) -> str:
        if self.found:
            return f"The flakebot dashboard: {self.url} (in JupyterLab: Help > flakebot dashboard)"
        return (
            "The flakebot dashboard is the Jupyter server's /flakebot/ page (this kernel was not started by a "
            "Jupyter server: start `jupyter lab`, then open http://HOST:PORT/flakebot/)."
        )

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def dashboard_link(runtime_dir: Path | None = None, parent: int | None = None) -> DashboardLink:
    """The link to the dashboard of the Jupyter server that started this kernel (``/flakebot/`` when unknown)."""
    info = server_of_kernel(runtime_dir, parent)
    base = str(info.get("base_url") or "/") if info else "/"
    base = base if base.endswith("/") else base + "/"
    url = str(info.get("url") or "") if info else ""
    url = (url if url.endswith("/") else url + "/") + DASHBOARD if url else ""
    return DashboardLink(base + DASHBOARD, url, info is not None)
