"""The spine: the pipeline that turns a request into a tool, on a background thread, and how a run ends."""

from __future__ import annotations

from ..host.names import tool_name
from .run import Pipeline

__all__ = ["Pipeline", "tool_name"]
