"""The Jupyter server extension: flakebot's REST API, dashboard and tool proxy (the only package importing tornado and jupyter_server).

Enabled by ``jupyter_server_config.d/flakebot_magic.json``, which the package
installs; ``jupyter server extension list`` shows it.
"""

from __future__ import annotations

from typing import Any

from .app import FlakebotExtension

__all__ = ["FlakebotExtension"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "flakebot_magic.server", "app": FlakebotExtension}]
