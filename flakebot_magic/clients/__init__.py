"""Clients for deployed tools: CLI binaries, MCP servers, HTTP services; and their lifecycle.

Importing this package is cheap (httpx is imported by the HTTP client only).
Front ends manage running tools by name::

    from flakebot_magic import clients
    clients.running()        # ["calc", "svc"]
    clients.logs("svc")      # the service's recent output
    clients.stop("svc")      # what %flakebot stop svc calls
"""

from __future__ import annotations

from .lifecycle import logs, running, stop, stop_all

__all__ = ["logs", "running", "stop", "stop_all"]
