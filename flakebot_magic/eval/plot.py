"""The eval's plot: pass rate against cost, one point per model, drawn with matplotlib.

matplotlib, because a notebook keeps its output as a picture: an SVG renders
in JupyterLab, in a saved notebook on GitHub, in nbconvert's HTML and PDF,
offline and without a JavaScript renderer (plotly and altair need theirs in
the page). It is in the optional extra ``eval`` (``pip install
'flakebot-magic[eval]'``) and imported only here, only when a plot is asked
for: ``import flakebot_magic`` and ``import flakebot_magic.eval`` never load it.
The figure is a plain :class:`matplotlib.figure.Figure` (no pyplot, no global
state), shown in a notebook as SVG.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["PassCostPlot", "pass_rate_vs_cost"]


class PassCostPlot:
    """A figure of pass rate against cost; shown as SVG in a notebook, ``save(path)`` writes it."""

    def __init__(self, figure: Any, *, title: str) -> None:
        self.figure = figure
        self.title = title

    def svg(self) -> str:
        buffer = io.StringIO()
        self.figure.savefig(buffer, format="svg", metadata={"Date": None})
        return buffer.getvalue()

    def _repr_svg_(self) -> str:
        return self.svg()

    def save(self, path: str | Path) -> Path:
        """Write the figure (the format from the suffix: .svg, .png, .pdf)."""
        target = Path(path)
        self.figure.savefig(target, metadata={"Date": None} if target.suffix == ".svg" else None)
        return target

    def __repr__(self) -> str:
        return f"<PassCostPlot: {self.title}>"


def _matplotlib() -> Any:
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise ConfigError(
            "The eval's plot needs matplotlib, which is not installed. Install it with "
            "`pip install 'flakebot-magic[eval]'` (or `pip install matplotlib`)."
        ) from None
    # the same figure gives the same SVG, and its words stay text (searchable, selectable, small)
    matplotlib.rcParams["svg.hashsalt"] = "flakebot-eval"
    matplotlib.rcParams["svg.fonttype"] = "none"
    return Figure


def pass_rate_vs_cost(data: Mapping[str, Any]) -> PassCostPlot:
    """One point per model: pass@1 against USD per task (tokens per task when a model has no price).

    Every point and its label lie inside the axes, whatever the numbers: the x
    axis runs from 0 to a third past the largest value (0 to 1 when all are 0),
    a label sits on the side of its point that has room (left of a point in the
    right half, below one near 100%), and the legend is below the axes, where
    it covers no point.
    """
    figure_class = _matplotlib()
    models = list(data.get("models", []))
    # a replay costs nothing anyone paid: its tokens are what it shows
    priced = not data.get("replay") and bool(models) and all(m["summary"].get("cost_usd") is not None for m in models)
    figure = figure_class(figsize=(6.4, 4.6), layout="constrained")
    axes = figure.subplots()
    points = []
    for model in models:
        summary = model["summary"]
        tasks = max(int(summary.get("tasks") or 0), 1)
        x = float((summary["cost_usd"] if priced else summary.get("tokens", 0)) or 0) / tasks
        y = 100.0 * float(summary.get("pass_at_1") or 0.0)
        points.append((x, y, str(model.get("label") or model["model"]), model.get("kind") in ("replay", "reference")))
    right = max((x for x, _, _, _ in points), default=0.0) * 4 / 3 or 1.0
    for x, y, label, double in points:
        axes.scatter([x], [y], s=60, marker="x" if double else "o", label=label, zorder=3)
        left_side = x > right / 2
        low = y > 85
        axes.annotate(
            label,
            (x, y),
            textcoords="offset points",
            xytext=(-8 if left_side else 8, -10 if low else 8),
            ha="right" if left_side else "left",
            va="top" if low else "bottom",
            fontsize=8,
        )
    axes.set_xlabel("USD per task" if priced else "tokens per task (no price for every model)")
    axes.set_ylabel("pass@1 (%)")
    axes.set_ylim(-5, 105)
    axes.set_xlim(-right / 25, right)  # a point at 0 shows whole
    axes.grid(True, alpha=0.3)
    title = "flakebot eval: pass rate vs cost"
    if data.get("reference"):
        title += "\nREFERENCE solutions sent by a test double: not a model"
    elif data.get("replay"):
        title += "\nREPLAY of solution.json by a test double: not a model"
    axes.set_title(title, fontsize=10)
    if models:
        figure.legend(loc="outside lower center", fontsize=8, ncols=min(len(models), 3), frameon=False)
    return PassCostPlot(figure, title=title.replace("\n", " "))
