"""A real JupyterLab in Chromium: the quickstart's %%flakebot cell with its live widget and the record it leaves,
the saved notebook reopened without a kernel, Cancel, a 760 px window, the dashboard, auth, wrong input and a
request no crate fits.

Debian's Chromium, driven by Playwright (pip) with ``executable_path``;
JupyterLab listens on 127.0.0.1 with a token. Screenshots land in
``artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_process import JupyterProcess, free_port
from tinycrates import processes_in, write_registry

pytestmark = [pytest.mark.browser, pytest.mark.kernel, pytest.mark.cargo]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not CHROMIUM.exists() and not os.environ.get("CI"):  # in CI a missing browser is a failure, not a skip
    pytest.skip("Debian's chromium is not installed (scripts/install-system.sh installs it)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


def _notebook(cells: list[str]) -> dict[str, object]:
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": f"c{i}",
                "metadata": {},
                "outputs": [],
                "source": source,
            }
            for i, source in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterProcess]:
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", root / "quickstart.ipynb")
    registry = write_registry(root / "registry", ["slowbuild"])
    cancel = _notebook(
        ["%load_ext flakebot_magic", f"%%flakebot --registry {registry} --crate slowbuild --name slow --rebuild\n"]
    )
    (root / "cancel.ipynb").write_text(json.dumps(cancel))
    (root / "usage.ipynb").write_text(
        json.dumps(
            _notebook(
                [
                    "%load_ext flakebot_magic",
                    "%%flakebot --name 1bad\nEcho words",
                    "%%flakebot --name wrap\nwrap long lines of text to a width",  # no crate fits, as published
                ]
            )
        )
    )
    # a cache of its own: the quickstart is a first build here, with live progress (in a cache that holds the tool,
    # a warm re-run answers from its record before a widget could show)
    cache = str(root / "cache")
    env = {"FLAKEBOT_CACHE_DIR": cache, "FLAKEBOT_BACKEND": "cargo"}
    jupyter = JupyterProcess(root, app="lab", env=env).start()
    jupyter.cache = Path(cache)  # type: ignore[attr-defined]
    yield jupyter
    jupyter.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def context(browser: object, lab: JupyterProcess) -> Iterator[object]:
    context = browser.new_context(viewport={"width": 1280, "height": 1000})  # type: ignore[attr-defined]
    context.set_default_timeout(60_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield context
    context.close()


def _open_notebook(context: object, lab: JupyterProcess, name: str) -> object:
    page = context.new_page()  # type: ignore[attr-defined]
    page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}")
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").first.wait_for()
    # the page draws the notebook before its kernel is up; Run All before that does nothing
    deadline = time.monotonic() + 90
    with lab.client() as client:
        while True:
            sessions = [s for s in client.get("/api/sessions").json() if s["path"].endswith(name)]
            if sessions and sessions[0]["kernel"]["execution_state"] == "idle":
                break
            assert time.monotonic() < deadline, f"the kernel of {name} did not start"
            time.sleep(0.2)
    page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').first.wait_for()
    return page


def _run_all(page: object) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()  # type: ignore[attr-defined]
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()  # type: ignore[attr-defined]


def _overflow(page: object, selector: str) -> list[int]:
    """How many pixels each element matching ``selector`` is wider than its box (0: no scrollbar)."""
    return page.evaluate(  # type: ignore[attr-defined,no-any-return]
        "s => [...document.querySelectorAll(s)].map(e => e.scrollWidth - e.clientWidth)", selector
    )


def _clipped(page: object, selector: str) -> list[str]:
    """The rows (stage and candidate rows, the title, the summary) of ``selector`` that do not fit: wider than their
    box (scrollWidth over clientWidth), or reaching past the output area's right edge."""
    return page.evaluate(  # type: ignore[attr-defined,no-any-return]
        """s => {
            const bad = [];
            for (const root of document.querySelectorAll(s)) {
                const area = root.closest('.jp-OutputArea-output') || root;
                const right = area.getBoundingClientRect().right + 1;
                const parts = root.querySelectorAll('tr, td, .flakebot-title, .flakebot-summary, .flakebot-notice');
                for (const part of [root, ...parts]) {
                    const box = part.getBoundingClientRect();
                    if (part.scrollWidth > part.clientWidth + 1 || box.right > right) {
                        bad.push(`${part.className || part.tagName} ${part.dataset.stage || ''}: ` +
                                 `${part.scrollWidth}/${part.clientWidth}, right ${box.right} > ${right}`);
                    }
                }
            }
            return bad;
        }""",
        selector,
    )


def test_quickstart_runs_with_live_progress_and_lists_the_tool(context: object, lab: JupyterProcess) -> None:
    started = time.monotonic()
    page = _open_notebook(context, lab, "quickstart.ipynb")
    _run_all(page)
    progress = page.locator(".flakebot-progress").first  # type: ignore[attr-defined]
    progress.wait_for()
    assert progress.locator(".flakebot-row").count() >= 7  # one row per stage
    assert progress.locator('.flakebot-row[data-stage="edit"]').count() == 0  # no model: no row waits for it
    page.screenshot(path=SHOTS / "01-quickstart-progress.png")  # type: ignore[attr-defined]
    # the build over, the widget gives way to its record: static HTML, no widget
    record = page.locator('.flakebot-record[data-outcome="success"]').first  # type: ignore[attr-defined]
    record.wait_for(timeout=150_000)
    record.get_by_text("Changes:").click()  # the diff against the published crate, folded
    record.locator(".flakebot-diff").wait_for()
    assert "Cargo.toml" in record.locator(".flakebot-diff").inner_text()
    record.locator(".flakebot-diff").scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "02-quickstart-success-diff.png")  # type: ignore[attr-defined]
    for stage in ("search", "client"):
        state = record.locator(f'.flakebot-row[data-stage="{stage}"]').get_attribute("data-state")
        assert state in ("done", "cached"), (stage, state)
    # the tool's own output: its HTML card, then md("# Hi") from the next cell
    page.locator(".flakebot-tool").first.wait_for()  # type: ignore[attr-defined]
    page.get_by_text("'<h1>Hi</h1>\\n'").first.wait_for(timeout=60_000)  # type: ignore[attr-defined]
    listing = page.locator("table.flakebot-tools").first  # type: ignore[attr-defined]
    listing.wait_for(state="attached", timeout=60_000)  # %flakebot list
    listing.scroll_into_view_if_needed()
    assert "pulldown-cmark@0.9.2" in (listing.text_content() or "")
    page.screenshot(path=SHOTS / "03-quickstart-done.png", full_page=True)  # type: ignore[attr-defined]
    # no horizontal scrollbar on the record or its output
    assert set(_overflow(page, ".flakebot-record")) == {0}
    assert set(_overflow(page, ".jp-OutputArea-output:has(.flakebot-record)")) == {0}
    assert page.locator(".flakebot-progress").count() == 0  # type: ignore[attr-defined]  # every widget gave way
    # the notebook's second %%flakebot cell is a cache hit: no output, so no "Log (0 lines)"
    warm = page.locator(".flakebot-record").last  # type: ignore[attr-defined]
    warm.locator('.flakebot-title[data-outcome="success"]').wait_for()
    assert warm.locator('.flakebot-row[data-state="cached"]').count() >= 5
    assert "Log (" not in warm.inner_text()
    page.keyboard.press("Control+s")  # type: ignore[attr-defined]  # saved, for the reopening below
    saved = lab.root / "quickstart.ipynb"
    deadline = time.monotonic() + 30
    while saved.read_text().count("class='flakebot-record'") < 2:
        assert time.monotonic() < deadline, "the notebook was not saved"
        time.sleep(0.2)
    # wrapped text is not double-spaced: a line is about a line high, not a widget row (28 px)
    heights = page.evaluate(
        "() => [...document.querySelectorAll('.flakebot-notice, .flakebot-record')]"
        ".map(e => parseFloat(getComputedStyle(e).lineHeight))"
    )
    assert heights and max(heights) < 24, heights

    dashboard = context.new_page()  # type: ignore[attr-defined]
    dashboard.set_viewport_size({"width": 760, "height": 1000})  # a narrow window: the log's lines are wider
    dashboard.goto(f"{lab.url}/flakebot/")
    row = dashboard.locator('tr.tool[data-name="md"]')
    row.wait_for()
    assert "pulldown-cmark@0.9.2" in row.inner_text() and "ready" in row.inner_text()
    dashboard.locator('tr.tool-details[data-name="md"] summary', has_text="provenance").click()
    dashboard.locator('tr.tool-details[data-name="md"] summary', has_text="log").click()
    dashboard.screenshot(path=SHOTS / "04-dashboard.png", full_page=True)
    # opening them does not widen the table: their long lines scroll in their own boxes
    assert _overflow(dashboard, "html") == [0]
    assert max(_overflow(dashboard, 'tr.tool-details[data-name="md"] pre')) > 0
    # a browser that prefers dark gets the page dark, its text light (what JupyterLab's dark theme users see)
    dashboard.emulate_media(color_scheme="dark")
    dashboard.screenshot(path=SHOTS / "04b-dashboard-dark.png", full_page=True)
    background, text = dashboard.evaluate(
        "() => [getComputedStyle(document.body).backgroundColor, getComputedStyle(document.body).color]"
    )
    assert background == "rgb(13, 17, 23)" and text == "rgb(230, 237, 243)", (background, text)
    assert time.monotonic() - started < 170


def test_cancel_button_stops_the_build(context: object, lab: JupyterProcess) -> None:
    workspaces = lab.cache / "workspaces"  # type: ignore[attr-defined]
    for old in workspaces.glob("**/build-script-started"):
        old.unlink()
    page = _open_notebook(context, lab, "cancel.ipynb")
    _run_all(page)
    progress = page.locator(".flakebot-progress").first  # type: ignore[attr-defined]
    progress.locator('.flakebot-row[data-stage="build"][data-state="running"]').wait_for(timeout=90_000)
    deadline = time.monotonic() + 60
    # the build script (a minute's sleep) is running; --rebuild builds in a place of its own
    while not (markers := list(workspaces.glob("**/build-script-started"))):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    workspace = markers[0].parent
    page.screenshot(path=SHOTS / "05-cancel-running.png")  # type: ignore[attr-defined]
    # a narrow window (760 px): the running widget's rows and details wrap, nothing is cut off
    page.set_viewport_size({"width": 760, "height": 1000})  # type: ignore[attr-defined]
    progress.locator('.flakebot-row[data-stage="fork"][data-state="done"]').wait_for()
    assert _clipped(page, ".flakebot-progress") == []
    page.screenshot(path=SHOTS / "05b-cancel-running-760px.png")  # type: ignore[attr-defined]
    clicked = time.monotonic()
    progress.locator("button.flakebot-cancel").click()
    record = page.locator('.flakebot-record[data-outcome="cancelled"]')  # type: ignore[attr-defined]
    record.wait_for(timeout=20_000)
    assert time.monotonic() - clicked < 20
    assert _clipped(page, ".flakebot-record") == []
    # the header keeps the tool's name however the run ended
    assert record.locator(".flakebot-title code").inner_text() == "slow"
    # the message once (the error below the widget), naming what the user knows, not a wrapper
    error = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")  # type: ignore[attr-defined]
    error.first.wait_for()
    assert error.count() == 1
    message = error.inner_text()
    assert (
        message.startswith("Cancelled: Stopped during `cargo ") and "nice" not in message
    )  # not "Cancelled: Cancelled"
    assert f"\nThe workspace is kept at {workspace}" in message
    assert message.rstrip().endswith("\nRun the cell again to build it.")  # what to do next
    assert record.locator(".flakebot-summary").count() == 0  # the error above is the one message
    page.screenshot(path=SHOTS / "06-cancelled.png")  # type: ignore[attr-defined]
    assert record.locator('.flakebot-row[data-stage="build"]').get_attribute("data-state") == "cancelled"
    assert processes_in(workspace) == [] and (workspace / ".git").is_dir()
    page.set_viewport_size({"width": 1280, "height": 1000})  # type: ignore[attr-defined]


def test_a_saved_notebook_reopened_without_a_kernel_shows_its_record(context: object, lab: JupyterProcess) -> None:
    """The quickstart saved above, reopened where no kernel can start: the record is there, as the build left it."""

    def quickstart_sessions() -> list[dict[str, object]]:
        with lab.client() as client:
            return [s for s in client.get("/api/sessions").json() if s["path"].endswith("quickstart.ipynb")]

    with lab.client() as client:  # its kernel is shut down ...
        for session in quickstart_sessions():
            assert client.delete(f"/api/sessions/{session['id']}").status_code == 204
    refused: list[str] = []

    def no_kernel(route: object) -> None:  # ... and JupyterLab may not start another, on any page
        request = route.request  # type: ignore[attr-defined]
        if request.method == "POST":
            refused.append(request.url)
            route.abort()  # type: ignore[attr-defined]
        else:
            route.continue_()  # type: ignore[attr-defined]

    context.route("**/api/sessions**", no_kernel)  # type: ignore[attr-defined]
    try:
        page = context.new_page()  # type: ignore[attr-defined]
        page.goto(f"{lab.url}/lab/tree/quickstart.ipynb?token={lab.token}")
        record = page.locator('.flakebot-record[data-outcome="success"]').first
        record.wait_for(timeout=60_000)
        dialog = page.locator(".jp-Dialog")  # JupyterLab says it could not start a kernel; the notebook is there
        dialog.wait_for(timeout=30_000)
        page.screenshot(path=SHOTS / "08a-no-kernel-dialog.png")
        dialog.get_by_role("button").last.click()
        choose = page.locator(".jp-Dialog").get_by_role("button", name="No Kernel", exact=True)  # then: pick one? no
        choose.wait_for(timeout=10_000)
        choose.click()
        assert record.locator(".flakebot-row").count() >= 7
        assert "passed" in record.locator('.flakebot-row[data-stage="test"]').inner_text()
        assert "md is ready" in " ".join(record.inner_text().split())
        # the changes, folded in the record (and the log, when the build was not a cache hit)
        fold = record.locator("details.flakebot-diff-fold")
        # Cargo.toml, Cargo.lock, the flake, and the stub of its dependencies' derivation (flakebot-deps/)
        assert re.match(
            r"Changes: \d+ files changed, \+\d+ -\d+ against the published crate", fold.locator("summary").inner_text()
        )
        fold.evaluate("d => { d.open = true; }")
        assert "Cargo.toml" in record.locator(".flakebot-diff").inner_text()
        assert page.get_by_text("Error displaying widget").count() == 0
        record.scroll_into_view_if_needed()
        page.screenshot(path=SHOTS / "08-reopened-without-kernel.png")
        page.set_viewport_size({"width": 760, "height": 1000})  # the same record in a narrow window
        assert _clipped(page, ".flakebot-record") == []
        page.screenshot(path=SHOTS / "09-reopened-760px.png")
        assert refused and quickstart_sessions() == []  # JupyterLab asked for a kernel, and had none
        page.close()
    finally:
        context.unroute("**/api/sessions**")  # type: ignore[attr-defined]


_EVIL = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    PAGE = (
        "<html><body><form id=f method=post action='%s'><input name=x value=1></form>"
        "<script>document.getElementById('f').submit()</script></body></html>"
    ) % sys.argv[2]

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self):
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[1])), Evil).serve_forever()
    """
)


def test_api_needs_a_token_and_posts_need_xsrf(browser: object, context: object, lab: JupyterProcess) -> None:
    anonymous = browser.new_context()  # type: ignore[attr-defined]
    try:
        assert anonymous.request.get(f"{lab.url}/flakebot/api").status == 403
        assert anonymous.request.get(f"{lab.url}/flakebot/api/tools").status == 403
    finally:
        anonymous.close()
    # logged in (the token in the URL left Jupyter's cookie), but a POST without the XSRF token
    assert context.request.get(f"{lab.url}/flakebot/api/tools").status == 200  # type: ignore[attr-defined]
    assert context.request.post(f"{lab.url}/flakebot/api/tools/md/stop").status == 403  # type: ignore[attr-defined]
    # a real cross-site form POST from another site, in the logged-in browser
    port = free_port()
    target = f"{lab.url}/flakebot/api/tools/md/stop"
    evil = subprocess.Popen([sys.executable, "-c", _EVIL, str(port), target])
    try:
        page = context.new_page()  # type: ignore[attr-defined]
        with page.expect_response(lambda response: response.url == target, timeout=30_000) as answer:
            deadline = time.monotonic() + 20
            while True:
                try:
                    page.goto(f"http://localhost:{port}/")
                    break
                except sync_api.Error:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
        assert answer.value.status == 403
        page.close()
    finally:
        evil.kill()
        evil.wait()


def test_an_argument_error_is_one_line(context: object, lab: JupyterProcess) -> None:
    page = _open_notebook(context, lab, "usage.ipynb")
    _run_all(page)
    cell = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(1)  # type: ignore[attr-defined]
    error = cell.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    error.wait_for()
    assert error.inner_text().strip() == (
        "UsageError: --name '1bad' is not a valid tool name (a Python identifier: letters, digits and '_', not a keyword); "
        "try '_1bad'."
    )
    assert cell.locator(".flakebot-row").count() == 0 or not cell.locator(".flakebot-progress").is_visible()
    assert "skipped" not in cell.locator(".jp-Cell-outputArea").inner_text()
    cell.screenshot(path=SHOTS / "07-argument-error.png")
    # a request no crate fits is the search's honest answer, not a failure: the title says so, amber, no red row
    unfit = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(2)  # type: ignore[attr-defined]
    unfit.locator(".jp-InputArea-editor").click()  # Run All stopped at the error above: run this one alone
    page.keyboard.press("Shift+Enter")  # type: ignore[attr-defined]
    record = unfit.locator('.flakebot-record[data-outcome="unfit"]')
    record.wait_for(timeout=120_000)
    assert "no crate fits" in record.locator(".flakebot-title").inner_text()
    assert record.locator('.flakebot-row[data-stage="search"]').get_attribute("data-state") == "done"
    assert record.locator('.flakebot-row[data-state="failed"]').count() == 0
    assert "textwrap" in unfit.locator(".jp-Cell-outputArea").inner_text()  # the candidates and the way on
    unfit.screenshot(path=SHOTS / "07b-no-crate-fits.png")
