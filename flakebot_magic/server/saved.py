"""A notebook saved while a ``%%flakebot`` cell shows its live widget keeps a static record instead.

A widget's output is a pointer to a model in a kernel. Saved while the build
runs, or after a kernel restart left it frozen (JupyterLab stops reading the
old kernel's last words, the record :mod:`flakebot_magic.views.interrupted`
sends), it reopens as "Loading widget..." forever. So the live display carries,
beside the widget view, the static record of a build that did not end
(:func:`flakebot_magic.views.record.unfinished_html`) and the metadata
``{"flakebot": {"live": true, "pid": PID}}``, the kernel's process; this
server's pre-save hook drops the widget view from such outputs once that
process is gone, so the file keeps the record. While it lives the view is
kept: a page reloaded mid-build gets its live widget back from the kernel. A
build that ends replaces its display with its full record (no widget view, no
mark). Only outputs so marked are touched. (A kernel on another machine, a
gateway's, has no process here: its builds are saved as records.)
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["WIDGET_VIEW", "live_mark", "static_records"]

#: the mime type of an ipywidgets view (a pointer to a model in the kernel)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def live_mark() -> dict[str, Any]:
    """The display metadata of a build's live widget, shown by this process (the kernel): what
    :func:`static_records` looks for."""
    return {"flakebot": {"live": True, "pid": os.getpid()}}


def _running(pid: object) -> bool:
    """Whether the process ``pid`` (a kernel's, from a live mark) is running on this machine."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    except OSError:
        return False
    return True


def static_records(model: dict[str, Any] | None = None, **_: object) -> None:
    """``ContentsManager`` pre-save hook: each marked live build whose kernel is gone keeps its static record, not
    its view."""
    if not isinstance(model, dict) or model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    for cell in model["content"].get("cells") or []:
        for output in (cell.get("outputs") if isinstance(cell, dict) else None) or []:
            if not isinstance(output, dict):
                continue
            data, meta = output.get("data"), output.get("metadata")
            if not isinstance(data, dict) or not isinstance(meta, dict) or "text/html" not in data:
                continue
            mark = meta.get("flakebot")
            if isinstance(mark, dict) and mark.get("live") is True and not _running(mark.get("pid")):
                data.pop(WIDGET_VIEW, None)
