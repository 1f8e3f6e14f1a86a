"""What a build shown in a notebook calls back into: the widget's steer box, and where a follow-up's diff starts."""

from __future__ import annotations

from collections.abc import Callable

from ..config import Settings
from ..manage import tools
from ..records.inventory import Inventory
from ..request import BuildRequest

__all__ = ["previous_commit", "steer_to"]


def previous_commit(settings: Settings, request: BuildRequest) -> str:
    """A follow-up's (``--continue``) starting point: the commit of the tool it changes; "" otherwise."""
    if not request.follow_up or not request.name:
        return ""
    record = Inventory(settings.cache.tools).get(request.name)
    return record.commit if record is not None else ""


def steer_to(settings: Settings, name: str) -> Callable[[str], None]:
    """The widget's Send: queue the text for ``name``'s edit session (what it raises, the widget shows)."""

    def send(text: str) -> None:
        tools.steer(settings, name, text, source="widget")

    return send
