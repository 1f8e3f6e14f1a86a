"""A team on Nix, in two real JupyterLabs: Alice builds a tool in her notebook and saves it; Bob opens the saved
notebook on "his machine" (his own flakebot cache and his own nix store), re-runs the very same cell, and gets
the exact tool she pinned, pulled from the team's signed cache: nothing forked, nothing built.

Real parts throughout: JupyterLab in Debian's Chromium, real kernels (Bob's learns its notebook from
Jupyter's ``JPY_SESSION_NAME``), real nix with a signed ``file://`` binary cache, Bob's store a chroot
store. Screenshots land in ``artifacts/screenshots/team-*.png``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_process import JupyterProcess
from test_lab import CHROMIUM, CHROMIUM_ARGS, SHOTS, _notebook, _open_notebook, _run_all
from tinycrates import write_registry

pytestmark = [pytest.mark.browser, pytest.mark.kernel, pytest.mark.cargo, pytest.mark.nix]

sync_api = pytest.importorskip("playwright.sync_api")
NIX = shutil.which("nix")
STAND_IN = Path(__file__).resolve().parents[1] / "nixpkgs"
CELL = "%%flakebot --name echo --crate tinyecho\necho its arguments"


class Team:
    """Alice's and Bob's JupyterLabs, each with its own flakebot cache; the team's cache and keys."""

    def __init__(self, root: Path) -> None:
        if NIX is None:
            pytest.skip("nix is not installed (scripts/setup-nix.sh)")
        self.root = root
        keys = root / "keys"
        keys.mkdir()
        secret = subprocess.run(
            [NIX, "--extra-experimental-features", "nix-command", "key", "generate-secret", "--key-name", "team-1"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (keys / "secret").write_text(secret)
        (keys / "secret").chmod(0o600)
        self.public = subprocess.run(
            [NIX, "--extra-experimental-features", "nix-command", "key", "convert-secret-to-public"],
            input=secret,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.cache = f"file://{root / 'team-cache'}"
        registry = write_registry(root / "registry", ["tinyecho"])
        common = {"FLAKEBOT_BACKEND": "nix", "FLAKEBOT_NIXPKGS": f"path:{STAND_IN}", "FLAKEBOT_REGISTRY": str(registry)}
        (root / "alice").mkdir()
        (root / "alice" / "shared.ipynb").write_text(json.dumps(_notebook(["%load_ext flakebot_magic", CELL])))
        (root / "bob").mkdir()
        self.alice = JupyterProcess(
            root / "alice",
            app="lab",
            env={
                **common,
                "FLAKEBOT_CACHE_DIR": str(root / "alice-cache"),
                "FLAKEBOT_PUSH_AFTER_BUILD": "1",
                "FLAKEBOT_PUSH_TO": self.cache,
                "FLAKEBOT_NIX_SECRET_KEY": str(keys / "secret"),
            },
        )
        self.bob_store = root / "bob-nix"
        self.bob = JupyterProcess(
            root / "bob",
            app="lab",
            env={
                **common,
                "FLAKEBOT_CACHE_DIR": str(root / "bob-cache"),
                "FLAKEBOT_NIX_STORE": f"local?root={self.bob_store}",
                "FLAKEBOT_NIX_SUBSTITUTERS": self.cache,
                "FLAKEBOT_NIX_TRUSTED_PUBLIC_KEYS": self.public,
            },
        )


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    team = Team(tmp_path_factory.mktemp("team"))
    yield team
    team.alice.stop()
    team.bob.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (scripts/install-system.sh installs it)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _saved(path: Path, words: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while words not in (text := path.read_text()):
        assert time.monotonic() < deadline, f"{path.name} was not saved with {words!r}"
        time.sleep(0.2)
    return text


def _pins(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    """The provenance each output of a saved notebook recorded (``metadata.flakebot``), in order."""
    return [
        o["metadata"]["flakebot"]
        for c in notebook["cells"]
        for o in c.get("outputs", [])
        if "flakebot" in o.get("metadata", {})
    ]


def test_bob_reruns_alices_saved_cell_and_gets_her_exact_tool(team: Team, browser: object) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    context.set_default_timeout(60_000)
    try:
        # Alice: builds the tool with nix (it is pushed, signed, once its tests passed) and saves the notebook
        team.alice.start()
        page = _open_notebook(context, team.alice, "shared.ipynb")
        _run_all(page)
        page.locator('.flakebot-record[data-outcome="success"]').first.wait_for(timeout=300_000)
        page.get_by_text("pushed to file://").first.wait_for(timeout=60_000)
        page.screenshot(path=SHOTS / "team-1-alice-built-and-pushed.png")
        page.keyboard.press("Control+s")  # type: ignore[attr-defined]
        saved = json.loads(_saved(team.alice.root / "shared.ipynb", '"nix_store_path"'))
        pins = _pins(saved)
        assert pins and pins[-1]["request"] == "echo its arguments" and pins[-1]["backend"] == "nix", pins
        pinned = pins[-1]["nix_store_path"]
        team.alice.stop()

        # Bob: the saved file, as he receives it; he opens it and runs it as it is
        shutil.copy(team.alice.root / "shared.ipynb", team.bob.root / "shared.ipynb")
        theme = Path(team.bob.env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
        theme.mkdir(parents=True, exist_ok=True)
        (theme / "themes.jupyterlab-settings").write_text(json.dumps({"theme": "JupyterLab Dark"}))
        team.bob.start()
        page = _open_notebook(context, team.bob, "shared.ipynb")
        # Alice's record, as saved (her notebook is not trusted here, so JupyterLab's sanitizer drops its data-*)
        page.get_by_text("pushed to file://").first.wait_for()
        page.screenshot(path=SHOTS / "team-2-bob-opens-the-saved-notebook.png")
        _run_all(page)
        said = page.get_by_text("as shared.ipynb pinned it (no build)").first
        said.wait_for(timeout=120_000)
        text = " ".join(page.locator(".jp-Cell").nth(1).inner_text().split())
        assert f"pulled {pinned} from {team.cache}, signed by team-1" in text, text
        assert "flakebot verify echo" in text, text  # its derivation came along: Bob can rebuild and compare
        page.screenshot(path=SHOTS / "team-3-bob-reran-the-cell-pulled.png")
        # the tool is in Bob's kernel: a new cell calls it
        page.locator(".jp-Cell").last.click()
        page.keyboard.press("Escape")  # type: ignore[attr-defined]
        page.keyboard.press("b")  # type: ignore[attr-defined]  # a cell below
        page.keyboard.press("Enter")  # type: ignore[attr-defined]
        page.keyboard.type('echo("from", "bob", input="")')  # type: ignore[attr-defined]
        page.keyboard.press("Shift+Enter")  # type: ignore[attr-defined]
        page.get_by_text("'from bob\\n'").first.wait_for(timeout=60_000)
        page.screenshot(path=SHOTS / "team-4-bob-calls-the-tool.png")
        # nothing was forked or built on Bob's side; the binary is the pinned path in Bob's own store
        assert not (team.root / "bob-cache" / "workspaces" / "echo").exists()
        assert (team.bob_store / pinned.lstrip("/") / "bin" / "tinyecho").is_file()
        # saved again, the cell still pins the same path (now with where it came from)
        page.keyboard.press("Control+s")  # type: ignore[attr-defined]
        again = json.loads(_saved(team.bob.root / "shared.ipynb", '"substituted_from"'))
        repins = _pins(again)
        assert repins[-1]["nix_store_path"] == pinned and repins[-1]["substituted_from"] == team.cache
        # a narrow window (Bob works in the dark theme): the lines wrap, nothing hides
        page.set_viewport_size({"width": 760, "height": 900})  # type: ignore[attr-defined]
        page.screenshot(path=SHOTS / "team-5-bob-760px.png")
    except Exception:
        for i, open_page in enumerate(context.pages):  # type: ignore[attr-defined]
            open_page.screenshot(path=SHOTS / f"team-failed-{i}.png")
        raise
    finally:
        context.close()
