"""The extension's request handlers, by job: the REST API (:mod:`.api`), the dashboard page (:mod:`.dashboard`,
its templates in ``templates/``) and the authenticated proxy to http tools (:mod:`.proxy`).

Every handler is ``@web.authenticated`` and ``@authorized`` on the ``flakebot`` resource; a write passes
Jupyter's XSRF check and no cross-origin request (:mod:`.origin`).
"""

from __future__ import annotations

from .api import IndexHandler, ToolHandler, ToolLogsHandler, ToolsHandler, ToolSteerHandler, ToolStopHandler
from .dashboard import DashboardHandler
from .proxy import ProxyHandler

__all__ = [
    "DashboardHandler",
    "IndexHandler",
    "ProxyHandler",
    "ToolHandler",
    "ToolLogsHandler",
    "ToolSteerHandler",
    "ToolStopHandler",
    "ToolsHandler",
]
