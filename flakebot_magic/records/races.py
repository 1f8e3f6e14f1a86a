"""Journalled races: a race of candidates, recorded so that an interrupted one can be resumed.

Each candidate's session has its own journal (:mod:`.journal`), all sharing
the race's ``run`` id. Beside them, ``journals/NAME/<race>.race.json`` says
what the race is (its workspace, how many candidates, the request) and,
once the manager has kept a winner, that it is decided. The newest race
that is not decided, with no session journalled after it, is what
``--resume`` continues: every candidate from where its session stopped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..host.fsutil import atomic_write, load_json, private_dir, read_regular
from ..llm.usage import Usage
from .journal import ResumePoint, journals_dir, race_points

__all__ = ["RacePoint", "RaceRecord", "unfinished_race"]

_SUFFIX = ".race.json"


@dataclass
class RaceRecord:
    """One race, as written beside its candidates' journals."""

    race: str
    workspace: str
    replaces: str
    candidates: int
    request: str
    follow_up: bool = False
    decided: bool = False

    @classmethod
    def start(cls, cache_dir: Path, name: str, **fields: Any) -> RaceRecord:
        record = cls(race=f"race-{time.time_ns()}", **fields)
        record.save(cache_dir, name)
        return record

    def save(self, cache_dir: Path, name: str) -> None:
        folder = private_dir(journals_dir(cache_dir, name))
        atomic_write(folder / f"{self.race}{_SUFFIX}", json.dumps(self.__dict__), root=Path(cache_dir))

    def decide(self, cache_dir: Path, name: str) -> None:
        """The manager kept a winner: there is nothing left to resume."""
        self.decided = True
        self.save(cache_dir, name)


@dataclass
class RacePoint:
    """An interrupted race: its record, and where each candidate's session stopped."""

    record: RaceRecord
    points: dict[int, ResumePoint] = field(default_factory=dict)

    @property
    def start(self) -> dict[str, Any]:
        """The fields a single session's resume point has in its start record (the pipeline reads these)."""
        record = self.record
        return {
            "workspace": record.workspace,
            "replaces": record.replaces,
            "request": record.request,
            "follow_up": "yes" if record.follow_up else "",
        }

    @property
    def usage(self) -> Usage:
        total = Usage()
        for point in self.points.values():
            total = total + point.usage
        return total

    @property
    def iterations(self) -> int:
        return max((p.iterations for p in self.points.values()), default=0)

    @property
    def path(self) -> Path:
        return Path(self.record.workspace)


def unfinished_race(cache_dir: Path, name: str) -> RacePoint | None:
    """The newest race of tool ``name`` that is not decided and that no later session followed; None otherwise."""
    folder = journals_dir(cache_dir, name)
    try:
        files = sorted(folder.glob(f"race-*{_SUFFIX}"), key=lambda p: p.name)
        sessions = sorted(p.name for p in folder.glob("*.jsonl"))
    except OSError:
        return None
    if not files:
        return None
    try:
        data = load_json(read_regular(files[-1], 1 << 20)[0])
        record = RaceRecord(**data)
    except (OSError, ValueError, TypeError):
        return None
    if record.decided:
        return None
    points = race_points(cache_dir, name, record.race)
    if not points:
        return None
    # a single session started after the race (its journal is newer than every candidate's) wins
    newest_candidate = max(p.path.name for p in points.values())
    if sessions and sessions[-1] > newest_candidate:
        return None
    return RacePoint(record, points)
