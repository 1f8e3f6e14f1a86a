"""A user trial of flakebot in a real JupyterLab (Debian's Chromium, Playwright): screenshots in artifacts/trial/.

Usage: .venv/bin/python trial/trial.py [light|dark] STEP...   (steps: quickstart badpaths cancel reopen dashboard)
The cache (artifacts/trial-cache) persists between runs, so a later run sees the tools an earlier one built.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from jupyter_process import JupyterProcess  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

SHOTS = ROOT / "artifacts" / "trial"
CACHE = ROOT / "artifacts" / "trial-cache"
LAB = ROOT / "artifacts" / "trial-lab"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def notebook(cells: list[str]) -> dict[str, object]:
    return {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": s}
            for i, s in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


BAD = [
    "%load_ext flakebot_magic",
    "%flakebot load md",
    "md('# after a restart')",
    "%%flakebot --nmae md\nRender Markdown text to HTML.",
    "%%flakebot\n",
    "%%flakebot --name sandwich\nmake me a sandwich",
    "%%flakebot --name my-tool\nRender Markdown text to HTML.",
    "md(42, bogus=1)",
    "md('# x', enable_tablez=True)",
    "%flakebot verify md",
    "%flakebot pull x nonexistent.ipynb",
    "%flakebot show nosuchtool",
    "%flakebot frobnicate",
]
CANCEL = [
    "%load_ext flakebot_magic",
    "%%flakebot --name md2 --crate pulldown-cmark --rebuild\nRender Markdown text to HTML.",
]


def shot(page: object, name: str, **kw: object) -> None:
    path = SHOTS / f"{name}.png"
    page.screenshot(path=path, **kw)  # type: ignore[attr-defined]
    print("screenshot", path, flush=True)


def wait_idle(lab: JupyterProcess, name: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    with lab.client() as client:
        while True:
            sessions = [s for s in client.get("/api/sessions").json() if s["path"].endswith(name)]
            if sessions and sessions[0]["kernel"]["execution_state"] == "idle":
                return
            assert time.monotonic() < deadline, f"kernel of {name} not idle"
            time.sleep(0.3)


def open_nb(context: object, lab: JupyterProcess, name: str, kernel: bool = True) -> object:
    page = context.new_page()  # type: ignore[attr-defined]
    page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}")
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").first.wait_for()
    if kernel:
        wait_idle(lab, name)
        time.sleep(2)
    return page


def cells(page: object) -> object:
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell")  # type: ignore[attr-defined]


def run_cell(page: object, lab: JupyterProcess, name: str, i: int) -> object:
    cell = cells(page).nth(i)  # type: ignore[attr-defined]
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")  # type: ignore[attr-defined]
    time.sleep(1.0)
    wait_idle(lab, name)
    deadline = time.monotonic() + 300
    while cell.locator(".flakebot-progress").count() or "*" in cell.locator(".jp-InputPrompt").inner_text():
        assert time.monotonic() < deadline, "the cell did not finish"
        time.sleep(0.5)
    time.sleep(0.5)
    return cell


def run_all(page: object) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()  # type: ignore[attr-defined]
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()  # type: ignore[attr-defined]


def step_quickstart(context: object, lab: JupyterProcess) -> None:
    page = open_nb(context, lab, "quickstart.ipynb")
    run_all(page)
    progress = page.locator(".flakebot-progress").first  # type: ignore[attr-defined]
    progress.wait_for(timeout=120_000)
    time.sleep(3)
    shot(page, "q01-live-widget")
    progress.scroll_into_view_if_needed()
    time.sleep(8)
    shot(page, "q02-live-widget-later")
    page.locator(".flakebot-record").first.wait_for(timeout=600_000)  # type: ignore[attr-defined]
    wait_idle(lab, "quickstart.ipynb", 600)
    rec = page.locator(".flakebot-record").first  # type: ignore[attr-defined]
    rec.scroll_into_view_if_needed()
    shot(page, "q03-record")
    tool = page.locator(".flakebot-tool").first  # type: ignore[attr-defined]
    if tool.count():
        tool.scroll_into_view_if_needed()
        shot(page, "q04-tool-card")
    shot(page, "q05-full", full_page=True)
    for i in range(cells(page).count()):  # type: ignore[attr-defined]
        c = cells(page).nth(i)  # type: ignore[attr-defined]
        c.scroll_into_view_if_needed()
        shot(page, f"q06-cell{i:02d}")
    page.keyboard.press("Control+s")  # type: ignore[attr-defined]
    time.sleep(2)
    page.close()


def step_badpaths(context: object, lab: JupyterProcess) -> None:
    page = open_nb(context, lab, "bad.ipynb")
    run_cell(page, lab, "bad.ipynb", 0)
    # restart the kernel the way a user does
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").first.click()  # type: ignore[attr-defined]
    page.get_by_role("menuitem", name="Restart Kernel…").click()  # type: ignore[attr-defined]
    page.locator(".jp-Dialog").get_by_role("button", name="Confirm Kernel Restart").click()  # type: ignore[attr-defined]
    time.sleep(3)
    wait_idle(lab, "bad.ipynb")
    for i in range(len(BAD)):
        cell = run_cell(page, lab, "bad.ipynb", i)
        cell.scroll_into_view_if_needed()  # type: ignore[attr-defined]
        cell.screenshot(path=SHOTS / f"b{i:02d}.png")  # type: ignore[attr-defined]
        print("screenshot", SHOTS / f"b{i:02d}.png", "::", BAD[i].splitlines()[0], flush=True)
        print(cell.locator(".jp-Cell-outputArea").inner_text()[:3000], flush=True)  # type: ignore[attr-defined]
        print("-----", flush=True)
    page.keyboard.press("Control+s")  # type: ignore[attr-defined]
    time.sleep(1)
    page.set_viewport_size({"width": 760, "height": 1000})  # type: ignore[attr-defined]
    for i in (1, 5, 6, 9, 10):
        cells(page).nth(i).scroll_into_view_if_needed()  # type: ignore[attr-defined]
        shot(page, f"b760-{i:02d}")
    page.close()


def step_cancel(context: object, lab: JupyterProcess) -> None:
    page = open_nb(context, lab, "cancel.ipynb")
    run_all(page)
    progress = page.locator(".flakebot-progress").first  # type: ignore[attr-defined]
    progress.locator('.flakebot-row[data-stage="build"][data-state="running"]').wait_for(timeout=120_000)
    time.sleep(4)
    shot(page, "c01-building")
    page.set_viewport_size({"width": 760, "height": 1000})  # type: ignore[attr-defined]
    shot(page, "c02-building-760")
    progress.locator("button.flakebot-cancel").click()
    page.locator(".flakebot-record").first.wait_for(timeout=60_000)  # type: ignore[attr-defined]
    time.sleep(1)
    shot(page, "c03-cancelled-760")
    page.set_viewport_size({"width": 1280, "height": 1000})  # type: ignore[attr-defined]
    shot(page, "c04-cancelled")
    print(cells(page).nth(1).locator(".jp-Cell-outputArea").inner_text(), flush=True)  # type: ignore[attr-defined]
    page.keyboard.press("Control+s")  # type: ignore[attr-defined]
    time.sleep(1)
    page.close()


def step_reopen(context: object, lab: JupyterProcess) -> None:
    with lab.client() as client:
        for s in client.get("/api/sessions").json():
            client.delete(f"/api/sessions/{s['id']}")

    def no_kernel(route: object) -> None:
        if route.request.method == "POST":  # type: ignore[attr-defined]
            route.abort()  # type: ignore[attr-defined]
        else:
            route.continue_()  # type: ignore[attr-defined]

    context.route("**/api/sessions**", no_kernel)  # type: ignore[attr-defined]
    for name in ("quickstart.ipynb", "bad.ipynb", "cancel.ipynb"):
        page = open_nb(context, lab, name, kernel=False)
        for _ in range(20):  # JupyterLab says it could not start a kernel, then asks to pick one: "No Kernel"
            time.sleep(1)
            dialog = page.locator(".jp-Dialog")  # type: ignore[attr-defined]
            if not dialog.count():
                continue
            shot(page, f"r-{name}-dialog")
            none = dialog.get_by_role("button", name="No Kernel", exact=True)
            (none if none.count() else dialog.get_by_role("button").last).click()
        if page.locator(".jp-SideBar .lm-mod-current").count():  # type: ignore[attr-defined]
            page.keyboard.press("Control+b")  # type: ignore[attr-defined]
        time.sleep(1)
        shot(page, f"r-{name}", full_page=True)
        page.set_viewport_size({"width": 760, "height": 1000})  # type: ignore[attr-defined]
        rec = page.locator(".flakebot-record").first  # type: ignore[attr-defined]
        if rec.count() and rec.is_visible():
            rec.scroll_into_view_if_needed()
        shot(page, f"r-{name}-760")
        page.close()
    context.unroute("**/api/sessions**")  # type: ignore[attr-defined]


def step_dashboard(context: object, lab: JupyterProcess) -> None:
    page = context.new_page()  # type: ignore[attr-defined]
    page.goto(f"{lab.url}/flakebot/?token={lab.token}")
    page.locator("tr.tool").first.wait_for()
    shot(page, "d01-list", full_page=True)
    for summary in page.locator("tr.tool-details summary").all():
        summary.click()
    shot(page, "d02-open", full_page=True)
    page.set_viewport_size({"width": 760, "height": 1000})
    shot(page, "d03-760", full_page=True)
    print(page.locator("body").inner_text()[:4000], flush=True)
    page.close()


def main() -> None:
    global SHOTS
    theme, steps = sys.argv[1], sys.argv[2:]
    SHOTS.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    LAB.mkdir(parents=True, exist_ok=True)
    if "quickstart" in steps:
        shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", LAB / "quickstart.ipynb")
    if "badpaths" in steps:
        (LAB / "bad.ipynb").write_text(json.dumps(notebook(BAD)))
    if "cancel" in steps:
        (LAB / "cancel.ipynb").write_text(json.dumps(notebook(CANCEL)))
    lab = JupyterProcess(LAB, app="lab", env={"FLAKEBOT_CACHE_DIR": str(CACHE), "FLAKEBOT_BACKEND": "cargo"})
    settings = Path(lab.env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "themes.jupyterlab-settings").write_text(
        json.dumps({"theme": "JupyterLab Dark" if theme == "dark" else "JupyterLab Light"})
    )
    lab.start()
    SHOTS = SHOTS / theme
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            context = browser.new_context(
                viewport={"width": 1280, "height": 1000}, color_scheme="dark" if theme == "dark" else "light"
            )
            context.set_default_timeout(60_000)
            for step in steps:
                print("== step", step, flush=True)
                try:
                    globals()[f"step_{step}"](context, lab)
                except Exception as exc:  # the trial goes on; the failure is reported
                    print("STEP FAILED", step, type(exc).__name__, str(exc)[:2000], flush=True)
            browser.close()
    finally:
        lab.stop()


if __name__ == "__main__":
    main()
