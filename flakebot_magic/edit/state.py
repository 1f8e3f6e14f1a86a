"""What an edit session leaves: the workspace's recorded sessions (EditState) and one session's outcome (EditOutcome)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clients.contract import ToolContract
from ..host.fsutil import atomic_write, load_json
from .checkrun import CheckRun
from .files import read_text

__all__ = ["STATE_FILE", "EditOutcome", "EditState"]

#: where the edit sessions of a workspace are recorded
STATE_FILE = "flakebot-edit.json"


@dataclass
class EditState:
    """The edit sessions of one workspace (kept in ``.git/flakebot-edit.json``)."""

    sessions: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, workspace: Path) -> EditState:
        try:
            data = load_json(read_text(workspace / ".git" / STATE_FILE))
        except (OSError, ValueError):
            return cls()
        return cls(sessions=list(data.get("sessions", [])))

    @staticmethod
    def exists(workspace: Path) -> bool:
        return (workspace / ".git" / STATE_FILE).is_file()

    def save(self, workspace: Path) -> None:
        atomic_write(workspace / ".git" / STATE_FILE, json.dumps({"sessions": self.sessions}, indent=2), root=workspace)


@dataclass
class EditOutcome:
    """A finished edit session: a green workspace and what it took."""

    summary: str
    contract: ToolContract
    runs: list[CheckRun]
    iterations: int
    model_calls: int
    tokens: int
    head: str
