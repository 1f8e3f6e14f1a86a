"""flakebot's HTML outputs (and the dashboard page) in a narrow window, in a real Chromium without JupyterLab: nothing reaches past the
output's edge (a hash or a store path breaks anywhere rather than being cut off).

The page is the output alone, at the width a 500 px JupyterLab window leaves an
output (about 400 px), so these run in seconds; tests/browser/test_lab.py shows
the same outputs in JupyterLab itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_lab import CHROMIUM, CHROMIUM_ARGS, SHOTS

from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.records.inventory import ToolRecord
from flakebot_magic.server.dashboard import DashboardRow, render_dashboard

pytestmark = [pytest.mark.browser]

if not CHROMIUM.exists() and not os.environ.get("CI"):
    pytest.skip("Debian's chromium is not installed (scripts/install-system.sh installs it)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")

#: what a 500 px JupyterLab window leaves an output, the side bars folded
WIDTH = 400


@pytest.fixture(scope="module")
def page() -> Iterator[object]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser.new_page(viewport={"width": 500, "height": 900})
        browser.close()


def _past_the_edge(page: object, markup: str) -> list[str]:
    """The elements of ``markup``, shown in a box ``WIDTH`` px wide, that reach past its right edge."""
    page.set_content(f"<body style='margin:0'><div id=out style='width:{WIDTH}px'>{markup}</div></body>")  # type: ignore[attr-defined]
    return page.evaluate(  # type: ignore[attr-defined,no-any-return]
        """() => {
            const out = document.getElementById('out'), right = out.getBoundingClientRect().right + 1;
            return [...out.querySelectorAll('*')].filter(e => e.getBoundingClientRect().right > right)
                .map(e => `${e.tagName} ${e.textContent.slice(0, 60)}`);
        }"""
    )


def test_the_tool_card_fits_a_narrow_window(page: object, tmp_path: Path) -> None:
    store = tmp_path / "store" / ("70e6edfceb12a92ff3d4a9d6e4a6e29d" * 2 + "-pulldown-cmark-0.9.2")
    store.mkdir(parents=True)
    binary = store / "md"
    binary.write_text("#!/bin/sh\ncat\n")
    binary.chmod(0o755)
    tool = CliTool(
        name="md", binary=binary, crate="pulldown-cmark", version="0.9.2", source_hash="0" * 64, store_path=store
    )
    assert _past_the_edge(page, tool._repr_html_()) == []
    page.screenshot(path=SHOTS / "30-card-400px.png")  # type: ignore[attr-defined]


def test_the_dashboard_fits_a_500px_window(page: object) -> None:
    """In a 500 px window the dashboard keeps a tool's name, crate, status and buttons in view (the other columns
    go; issue 37); the page never scrolls sideways, closed or with a tool's provenance and log open."""
    tool = ToolRecord.stand_in(
        "markdown_to_html",
        crate="pulldown-cmark",
        version="0.9.2",
        backend="nix",
        kind="cli",
        status="cancelled",
        source_hash="b05fd213608784fe25a93272e5b0c80e",
        workspace="/root/.cache/flakebot/workspaces/markdown_to_html",
        log_path="/root/.cache/flakebot/logs/markdown_to_html.cancelled.log",
    ).public_json()
    tool.update(provenance={}, started=1.0, links={}, extra={})
    row = DashboardRow(tool, log="cargo build --release " + "x" * 300, started="2026-11-26 05:14")
    html = render_dashboard(
        [tool], [row], counted="1 tool", registry="/root/.cache/flakebot/" + "tools/" * 12, api="/a", xsrf="t"
    )
    page.set_viewport_size({"width": 500, "height": 900})  # type: ignore[attr-defined]
    page.set_content(html)  # type: ignore[attr-defined]
    for opened in (False, True):
        if opened:
            page.evaluate("() => document.querySelectorAll('details').forEach(d => { d.open = true; })")  # type: ignore[attr-defined]
        widths = page.evaluate(  # type: ignore[attr-defined]
            """() => ({page: document.documentElement.scrollWidth - document.documentElement.clientWidth,
                       box: document.querySelector('.tools').clientWidth,
                       table: document.querySelector('.tools table').scrollWidth})"""
        )
        assert widths["page"] == 0, widths
        # the columns one can do without go under 640 px (issue 37): what is left fits, the status column in view
        assert widths["table"] <= widths["box"], widths
        status = page.evaluate(  # type: ignore[attr-defined]
            "() => document.querySelector('tr.tool td.status').getBoundingClientRect().right"
        )
        assert 0 < status <= 500, status
        # what a tool's details say reads without scrolling sideways: inside the visible part of the box
        past = page.evaluate(  # type: ignore[attr-defined]
            """() => { const right = document.querySelector('.tools').getBoundingClientRect().right + 1;
                return [...document.querySelectorAll('.tool-details td > *')]
                    .filter(e => e.getBoundingClientRect().right > right).map(e => e.tagName); }"""
        )
        assert past == [], past
    page.screenshot(path=SHOTS / "31-dashboard-500px.png", full_page=True)  # type: ignore[attr-defined]
