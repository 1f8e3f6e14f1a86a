"""Edit sessions in a real JupyterLab in Chromium: candidates racing in the widget, and a steer sent from its box.

The model is the scripted fake OpenAI server (a test double, not a model),
started inside the notebook's kernel and labelled there; it edits the tiny
``tinyhex`` crate. Screenshots land in ``artifacts/screenshots/`` (20-29).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from editscripts import TINYHEX, TINYHEX_CONTRACT, TINYHEX_MAIN, call, reply, tinyhex_done
from jupyter_process import JupyterProcess
from polling import wait_for
from test_lab import CHROMIUM, CHROMIUM_ARGS, SHOTS, _notebook, _open_notebook, _run_all
from tinycrates import write_registry

pytestmark = [pytest.mark.browser, pytest.mark.kernel, pytest.mark.cargo]

if not CHROMIUM.exists() and not os.environ.get("CI"):
    pytest.skip("Debian's chromium is not installed (scripts/install-system.sh installs it)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")

#: tinyhex's main with a clippy warning: green, but not the best
LINTED_MAIN = TINYHEX_MAIN.replace(
    '    println!("{}", tinyhex::to_hex(&input));',
    "    let empty = input.len() == 0;\n    if empty {\n        println!();\n        return;\n    }\n"
    '    println!("{}", tinyhex::to_hex(&input));',
)

USAGE = {"prompt_tokens": 1000, "completion_tokens": 200}


def _with_usage(responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "usage": USAGE} for r in responses]


RACE = {
    "candidates": {
        "0": {
            "responses": _with_usage(
                [
                    reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=LINTED_MAIN)),
                    reply(call("finish", summary="tinyhex, with a lint")),
                ]
            ),
            "delay": 2.0,
        },
        "1": {"responses": _with_usage(tinyhex_done("tinyhex, clean")), "delay": 4.0},
        "2": {"responses": _with_usage(tinyhex_done("tinyhex, slow")), "delay": 60.0},
    }
}

#: one session whose every reply takes 8 s: time to type a steering message
SLOW = {"responses": _with_usage(tinyhex_done("tinyhex, steered")), "delay": 8.0}

LABEL_CELL = """\
# The model below is FakeOpenAIServer: a scripted test double, not a language model.
from flakebot_magic.testing.fake_openai import FakeOpenAIServer
server = FakeOpenAIServer({script!r})
url = server.start(announce=False)
print(server.label)"""


def _cells(registry: Path, script: str, magic: str, *after: str) -> list[str]:
    return [
        "%load_ext flakebot_magic",
        LABEL_CELL.format(script=script),
        '%config FlakebotMagics.prices = {"scripted-test-double": (2.0, 8.0)}',
        f"%%flakebot --registry {registry} --crate tinyhex --model scripted-test-double --base-url $url {magic}\n"
        "hex-encode standard input",
        *after,
    ]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterProcess]:
    root = tmp_path_factory.mktemp("sessions")
    registry = write_registry(root / "registry", [TINYHEX])
    for name, script in {"race": RACE, "slow": SLOW}.items():
        (root / f"{name}.json").write_text(json.dumps(script))
    race = _cells(
        registry,
        str(root / "race.json"),
        "--name hexer --candidates 3",
        'print("winner", hexer.provenance["winner"], "output", hexer(b"hi").strip())',
    )
    (root / "race.ipynb").write_text(json.dumps(_notebook(race)))
    steer = _cells(
        registry,
        str(root / "slow.json"),
        "--name slowhex",
        "print('REQUEST2', [m['content'] for m in server.requests[1]['messages'] if m['role'] == 'user'][-1:])",
    )
    (root / "steer.ipynb").write_text(json.dumps(_notebook(steer)))
    cache = root / "cache"
    jupyter = JupyterProcess(root, app="lab", env={"FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_BACKEND": "cargo"})
    jupyter.start()
    yield jupyter
    jupyter.stop()
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="module")
def context(lab: JupyterProcess) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 1100})
        context.set_default_timeout(60_000)
        SHOTS.mkdir(parents=True, exist_ok=True)
        yield context
        context.close()
        browser.close()


def _states(progress: Any) -> dict[str, str]:
    rows = progress.locator("tr.flakebot-candidate")
    return {
        rows.nth(i).get_attribute("data-candidate"): rows.nth(i).get_attribute("data-state")
        for i in range(rows.count())
    }


def _fake_url(page: Any) -> str:
    """The fake server's address, from the label its cell printed."""
    label = page.locator(".jp-OutputArea-output pre", has_text="scripted test double").first
    label.wait_for()
    return str(label.inner_text().split(" at ")[-1].split()[0].removesuffix("/v1"))


def _chats(fake: httpx.Client) -> list[dict[str, Any]]:
    """The chat requests the fake server has recorded so far."""
    return [r for r in fake.get("/_requests").json() if r["path"].endswith("/chat/completions")]


def test_three_candidates_race_live_and_the_winner_is_marked(context: Any, lab: JupyterProcess) -> None:
    started = time.monotonic()
    page: Any = _open_notebook(context, lab, "race.ipynb")
    _run_all(page)
    page.get_by_text("scripted test double").first.wait_for()  # the test double says what it is
    progress = page.locator(".flakebot-progress").first
    progress.locator("tr.flakebot-candidate").nth(2).wait_for(timeout=90_000)
    # a steer during the race goes to every candidate still working
    url = _fake_url(page)
    with httpx.Client(base_url=url, timeout=10) as fake:
        wait_for(lambda: len(_chats(fake)) >= 3, timeout=60, what="each candidate's first request")
    box = progress.locator(".flakebot-steer-box")
    box.locator("input").fill("keep it short")
    box.get_by_role("button").click()
    # live: while #2 waits on its slow reply, the others move on
    seen: list[dict[str, str]] = []
    deadline = time.monotonic() + 90
    while "winner" not in (states := _states(page)).values():
        if not seen or seen[-1] != states:
            seen.append(states)
            if len(seen) == 2:
                page.screenshot(path=SHOTS / "20-candidates-racing.png")
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    assert len(seen) >= 2, seen  # the rows changed while the race ran
    # the build over, the widget gives way to its record, which keeps the candidates
    progress = page.locator('.flakebot-record[data-outcome="success"]').first
    progress.wait_for(timeout=90_000)
    states = _states(progress)
    assert states == {"0": "lost", "1": "winner", "2": "cancelled"}, states
    winner = progress.locator('tr.flakebot-candidate[data-candidate="1"]')
    assert "bold" in (winner.get_attribute("style") or "") and "★" in winner.inner_text()
    # a loser or a cancelled candidate is dimmed, never red
    for index in ("0", "2"):
        row = progress.locator(f'tr.flakebot-candidate[data-candidate="{index}"]')
        assert "opacity" in (row.get_attribute("style") or "")
        colors = row.evaluate("r => [...r.querySelectorAll('td')].map(td => getComputedStyle(td).color)")
        assert "rgb(207, 34, 46)" not in colors, (index, colors)
    usage = progress.locator(".flakebot-usage").first.inner_text()
    assert "4,800 tokens" in usage and "$0.0144" in usage, usage  # 4 replies x (1000 x $2 + 200 x $8) / 1M
    page.get_by_text("winner 1 output 6869").wait_for(timeout=30_000)
    progress.scroll_into_view_if_needed()
    page.screenshot(path=SHOTS / "21-candidates-winner.png")
    with httpx.Client(base_url=url, timeout=10) as fake:
        chats = _chats(fake)
    second = [r for r in chats if r["queue"] == "candidates.1"][1]
    assert "keep it short" in json.dumps(second["body"]["messages"])
    # the message once in the log, however many candidates it reached
    steered = progress.locator(".flakebot-steer", has_text="keep it short")
    assert steered.count() == 1, steered.all_inner_texts()
    assert time.monotonic() - started < 150


def test_a_steer_from_the_widget_reaches_the_model(context: Any, lab: JupyterProcess) -> None:
    page: Any = _open_notebook(context, lab, "steer.ipynb")
    _run_all(page)
    progress = page.locator(".flakebot-progress").first
    box = progress.locator(".flakebot-steer-box")
    box.wait_for(timeout=90_000)  # shown while the edit runs
    # send while the model thinks over its first request, so the message must wait for the next one
    url = _fake_url(page)
    with httpx.Client(base_url=url, timeout=10) as fake:
        wait_for(lambda: len(_chats(fake)) >= 1, timeout=90, what="the first model request")
    box.locator("input").fill("also accept --upper")
    page.screenshot(path=SHOTS / "22-steer-typed.png")
    box.get_by_role("button").click()
    line = progress.locator(".flakebot-steer", has_text="also accept --upper")
    line.wait_for()
    progress.locator('.flakebot-steer[data-status="delivered"]').wait_for(timeout=30_000)
    page.screenshot(path=SHOTS / "23-steer-delivered.png")
    record = page.locator('.flakebot-record[data-outcome="success"]').first
    record.wait_for(timeout=90_000)
    assert not box.is_visible()  # gone once the edit is over
    assert record.locator(".flakebot-steer", has_text="also accept --upper").count() == 1
    # the model's next request carried it as a user message
    printed_line = page.locator(".jp-OutputArea-output pre", has_text="REQUEST2")
    printed_line.wait_for(timeout=30_000)
    printed = printed_line.inner_text()
    assert "also accept --upper" in printed, printed
    with httpx.Client(base_url=url, timeout=10) as fake:
        requests = _chats(fake)
    assert "also accept --upper" not in json.dumps(requests[0]["body"]["messages"])
    page.screenshot(path=SHOTS / "24-steer-done.png", full_page=True)
