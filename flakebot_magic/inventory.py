"""The tools this machine has built: one JSON record per tool name in the cache dir."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Inventory", "ToolRecord"]


@dataclass
class ToolRecord:
    """What is known about a deployed tool: enough to call it again and to prove its origin."""

    name: str
    crate: str
    version: str
    binary: str
    store_path: str
    source_hash: str
    checksum: str
    checksum_kind: str
    registry: str
    workspace: str
    commit: str
    backend: str = "cargo"
    kind: str = "cli"
    description: str = ""
    created: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Inventory:
    """Reads and writes tool records under ``<cache>/tools``."""

    def __init__(self, tools_dir: Path) -> None:
        self.dir = tools_dir

    def save(self, record: ToolRecord) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{record.name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record.to_json(), indent=2, sort_keys=True))
        os.replace(tmp, self.dir / f"{record.name}.json")

    def get(self, name: str) -> ToolRecord | None:
        try:
            return ToolRecord(**json.loads((self.dir / f"{name}.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def all(self) -> list[ToolRecord]:
        if not self.dir.is_dir():
            return []
        records = [self.get(p.stem) for p in sorted(self.dir.glob("*.json"))]
        return [r for r in records if r is not None]

    def remove(self, name: str) -> None:
        (self.dir / f"{name}.json").unlink(missing_ok=True)
