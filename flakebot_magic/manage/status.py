"""A tool's status as ``list``, ``show`` and the server show it: its record's, corrected by what is on disk and in
the process table (never saved: the disk says it).

``running`` whose process is gone (the kernel restarted, the machine rebooted) is ``stopped``; a tool whose store
entry is gone (``doctor`` set it aside as damaged, or it was removed by hand) is ``broken`` whatever its record
says, and ``rebuild NAME`` makes it again.
"""

from __future__ import annotations

from pathlib import Path

from ..commands import typed
from ..host.process import alive, process_started_at
from ..records.inventory import ToolRecord
from ..stages.deploy import DAMAGED_PREFIX

__all__ = ["BROKEN", "same_process", "status_of", "why_gone"]


def same_process(pid: int, record: ToolRecord) -> bool:
    """Whether ``pid`` is still the process the record names: it started no later than recorded."""
    started = process_started_at(pid)
    if started is None or not record.started:
        return False
    return started <= record.started + 1.0  # a reused PID started after the record was written


#: the status of a tool that cannot run as it is: its store entry is gone (``doctor`` set it aside as damaged, or
#: it was removed by hand); ``rebuild NAME`` makes it again. Never saved: the disk says it
BROKEN = "broken"


def status_of(record: ToolRecord) -> str:
    """The record's status, corrected by what is on disk: a recorded process that is gone, a store entry gone."""
    # a recorded "running" whose process is gone (kernel restarted, machine rebooted) is stale
    status = record.status
    if status == "running" and record.pid and not (alive(record.pid) and same_process(record.pid, record)):
        status = "stopped"
    if status != "running" and not Path(record.store_path).is_dir():
        return BROKEN
    return status


def why_gone(record: ToolRecord) -> str:
    """What took a tool's store entry, as far as the store tells: the doctor set it aside, or it was removed."""
    entry = Path(record.store_path)
    try:
        aside = sorted(entry.parent.glob(f"{DAMAGED_PREFIX}{entry.name}-*"))
    except OSError:
        aside = []
    if aside:
        return f"its store entry was damaged, and {typed('doctor')} or a build set it aside at {aside[-1]}"
    if entry.is_dir():
        return f"its store entry {entry} lacks it"
    return f"its store entry {entry} was removed"
