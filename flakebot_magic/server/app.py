"""``FlakebotExtension``: the server extension app, its settings and its routes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Int, Unicode, default

from ..config import Settings, default_cache_dir
from ..host.names import TOOL_NAME_PATTERN
from .handlers import (
    DashboardHandler,
    IndexHandler,
    ProxyHandler,
    ToolHandler,
    ToolLogsHandler,
    ToolsHandler,
    ToolSteerHandler,
    ToolStopHandler,
)
from .proxy_rules import MAX_PROXY_RESPONSE
from .saved import static_records

__all__ = ["FlakebotExtension"]

_NAME = rf"(?P<name>{TOOL_NAME_PATTERN})"


class FlakebotExtension(ExtensionApp):
    """flakebot in the Jupyter server: ``/flakebot/`` (dashboard), ``/flakebot/api`` (REST), ``/flakebot/proxy/NAME/``.

    Every route needs Jupyter's authentication and is authorized on the
    ``flakebot`` resource. The tools come from the same SQLite tool inventory the
    kernels write (``<cache_dir>/tools/tools.sqlite3``).
    """

    name = "flakebot"
    extension_url = "/flakebot/"
    load_other_extensions = True

    cache_dir = Unicode(
        help="flakebot's cache dir (tool inventory, logs, store). Default: $FLAKEBOT_CACHE_DIR, else the user cache dir."
    ).tag(config=True)
    proxy_timeout = Float(300.0, help="Seconds the proxy waits for an http tool's answer.").tag(config=True)
    proxy_max_bytes = Int(
        MAX_PROXY_RESPONSE, help="The largest http tool answer the proxy passes on (bytes); a larger one gets 502."
    ).tag(config=True)

    @default("cache_dir")
    def _default_cache_dir(self) -> str:
        return str(default_cache_dir())

    def flakebot_settings(self) -> Settings:
        settings = Settings()
        settings.cache_dir = Path(self.cache_dir)
        return settings

    def initialize_settings(self) -> None:
        # a notebook saved under a live build keeps its static record, not a widget that needs the kernel
        if self.serverapp is not None:
            self.serverapp.contents_manager.register_pre_save_hook(static_records)

    def initialize_handlers(self) -> None:
        state: dict[str, Any] = {"settings": self.flakebot_settings()}
        proxy: dict[str, Any] = {**state, "timeout": self.proxy_timeout, "max_response": self.proxy_max_bytes}
        self.handlers.extend(
            [
                (r"/flakebot/?", DashboardHandler, state),
                (r"/flakebot/api/?", IndexHandler, state),
                (r"/flakebot/api/tools/?", ToolsHandler, state),
                (rf"/flakebot/api/tools/{_NAME}/?", ToolHandler, state),
                (rf"/flakebot/api/tools/{_NAME}/logs/?", ToolLogsHandler, state),
                (rf"/flakebot/api/tools/{_NAME}/stop/?", ToolStopHandler, state),
                (rf"/flakebot/api/tools/{_NAME}/steer/?", ToolSteerHandler, state),
                (rf"/flakebot/proxy/{_NAME}(?P<path>/.*)?", ProxyHandler, proxy),
            ]
        )
