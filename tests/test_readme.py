"""Issue 37: the README is a newcomer's first screen, short; the reference lives in docs/, the benchmarks in
docs/benchmarks.md (which `make bench` writes); every link in them leads somewhere."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 220


def test_the_first_screen_says_what_works_without_a_model_and_how_to_set_one() -> None:
    first = "\n".join(README.read_text().splitlines()[:40])
    assert "Without a model" in first and "With a model" in first
    assert "catalog" in first  # what can be built now
    assert re.search(r'^%config FlakebotMagics\.model = "[^"]+"', first, re.M)  # the model in one line


def test_the_readme_says_how_to_open_jupyterlab_as_root() -> None:
    assert re.search(r"jupyter lab --allow-root", README.read_text())


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(path: Path) -> None:
    missing = []
    for target in LINK.findall(path.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        if not (path.parent / target).exists():
            missing.append(target)
    assert missing == [], missing


def test_make_bench_writes_the_benchmarks_page(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "bench:start" not in README.read_text()  # the table moved
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page.count("<!-- bench:start -->") == 1 and page.count("<!-- bench:end -->") == 1
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # bench.py imports its siblings
    spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    old = "| measurement | result | target |\n|---|---|---|\n| a | 1 | - |\n| b | 2 | - |\n\nthen"
    new = "| measurement | result | target |\n|---|---|---|\n| b | 3 | - |\n\nnow"
    merged = bench.merge_rows(old, new)
    assert "| a | 1 | - |" in merged and "| b | 3 | - |" in merged and "| b | 2 |" not in merged
    assert merged.endswith("now")
