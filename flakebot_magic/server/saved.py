"""A notebook saved while a ``%%flakebot`` cell shows its live widget keeps a static record instead.

A widget's output is a pointer to a model in a kernel. Saved while the build
runs, or after a kernel restart left it frozen (JupyterLab stops reading the
old kernel's last words, the record :mod:`flakebot_magic.views.interrupted`
sends), it reopens as "Loading widget..." forever. So the live display carries,
beside the widget view, the static record of a build that did not end
(:func:`flakebot_magic.views.record.unfinished_html`) and the metadata
``{"flakebot": {"live": true}}``; this server's pre-save hook drops the widget
view from such outputs, so the file keeps the record. A build that ends
replaces its display with its full record (no widget view, no mark), which a
later save (JupyterLab saves every two minutes) writes over it. Only outputs
so marked are touched.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WIDGET_VIEW", "live_mark", "static_records"]

#: the mime type of an ipywidgets view (a pointer to a model in the kernel)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def live_mark() -> dict[str, Any]:
    """The display metadata of a build's live widget: what :func:`static_records` looks for."""
    return {"flakebot": {"live": True}}


def static_records(model: dict[str, Any] | None = None, **_: Any) -> None:
    """``ContentsManager`` pre-save hook: each marked live build's output keeps its static record, not its view."""
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
            if isinstance(mark, dict) and mark.get("live") is True:
                data.pop(WIDGET_VIEW, None)
