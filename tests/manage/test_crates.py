"""Issue 37: what the registry offers a newcomer. The catalog (what builds with no model, each with a ready
cell), a refusal that points to it, `flakebot index`, and a first search that is never a silent wait.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic.config import Settings
from flakebot_magic.errors import ConfigError
from flakebot_magic.events import INDEXING, EventBus, LogLine, Notice
from flakebot_magic.manage import crates
from flakebot_magic.registry.base import CrateCandidate
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.registry.shared_index import index_places
from flakebot_magic.stages import search as search_stage
from flakebot_magic.stages.choose import refusal
from flakebot_magic.views.progress import TextProgress

FLAKEBOT = Path(sys.executable).parent / "flakebot"


@pytest.fixture
def registry_dir(tmp_path: Path) -> Path:
    return write_registry(tmp_path / "registry", ["tinyecho", "tinylib", "brokenbin"])


def _settings(registry_dir: Path, cache: Path) -> Settings:
    return Settings(cache_dir=cache, registry=str(registry_dir), backend="cargo")


def test_the_catalog_lists_binaries_that_build_with_no_model_each_with_a_cell(
    registry_dir: Path, tmp_path: Path
) -> None:
    answer = crates.catalog(_settings(registry_dir, tmp_path / "cache"))
    listed = {entry["crate"]: entry for entry in answer.data}
    assert "tinyecho" in listed and "tinylib" not in listed  # a library needs a model
    cell = listed["tinyecho"]["cell"]
    assert cell.splitlines()[0] == "%%flakebot --name tinyecho --crate tinyecho"
    # the request says the tool is the binary as published, and what it reads; the description only quoted
    assert cell.splitlines()[1].startswith("The tinyecho command as published, which ")
    assert "(tinyecho: Echo words, or shout standard input)" in cell.splitlines()[1]
    assert cell in answer.text and "a tool with no model" in answer.text.splitlines()[0]


def test_the_catalog_is_searchable(registry_dir: Path, tmp_path: Path) -> None:
    settings = _settings(registry_dir, tmp_path / "cache")
    assert [e["crate"] for e in crates.catalog(settings, "shout echo").data] == ["tinyecho"]
    none = crates.catalog(settings, "uppercase")  # only a library does that
    assert none.data == [] and "configure a model" in none.notes[0]


def test_the_catalog_of_a_remote_registry_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="directory"):
        crates.catalog(Settings(cache_dir=tmp_path / "cache", registry="crates.io", backend="cargo"))


def test_a_refusal_points_to_the_catalog() -> None:
    fit = search_stage.Fitness(None, "none of the 1 candidates ships a binary", [CrateCandidate("textwrap", "0.16.0")])
    for binary in ("", "somebin"):
        said = refusal("wrap text", search_stage.Fitness(fit.chosen, fit.reason, fit.candidates, binary))
        assert "catalog" in said.splitlines()[-1] and len(said.splitlines()) <= 9


def test_the_command_runs_the_catalog_and_the_index(registry_dir: Path, tmp_path: Path) -> None:
    env_cache = str(tmp_path / "cache")
    args = ["--cache-dir", env_cache, "--registry", str(registry_dir)]
    done = subprocess.run([str(FLAKEBOT), "catalog", "--json", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [e["crate"] for e in json.loads(done.stdout)] == ["tinyecho"]
    built = subprocess.run([str(FLAKEBOT), "index", *args], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    assert "indexed" in built.stdout and f"{registry_dir}: 100%" in built.stderr


class _Said(list[str]):
    def __call__(self, line: str) -> None:
        self.append(line)


def test_a_first_search_says_it_indexes_with_progress_and_a_second_cache_dir_waits_for_nothing(
    registry_dir: Path, tmp_path: Path
) -> None:
    system, user = tmp_path / "system", tmp_path / "home" / "index"

    def opened(cache: str) -> DirectoryRegistry:
        where = index_places(tmp_path / cache, system=system, user=user)
        return DirectoryRegistry(registry_dir, tmp_path / cache, places=where, system=system)

    said, announced = _Said(), _Said()
    search_stage.indexing(opened("c1"), said, announce=announced)
    assert len(announced) == 1 and "first search on this machine" in announced[0]
    assert said[0] == f"{INDEXING}: 0%" and said[-1] == f"{INDEXING}: 100%"
    again = _Said()
    search_stage.indexing(opened("c2"), again, announce=again)
    assert again == []  # built once for every cache dir: nothing to wait for, nothing said


def test_printed_progress_shows_the_index_progress_even_when_not_verbose() -> None:
    out = io.StringIO()
    bus = EventBus()
    bus.subscribe(TextProgress(out, verbose=False))
    bus.emit(Notice("search", "indexing /r for search: the first search on this machine waits for it"))
    bus.emit(LogLine("search", f"{INDEXING}: 40%"))
    bus.emit(LogLine("search", "some other line"))
    printed = out.getvalue()
    assert f"{INDEXING}: 40%" in printed and "some other line" not in printed


@pytest.mark.parametrize("reads", ["stdin", "args"])
@pytest.mark.parametrize("binary", ["same", "cat"])
@pytest.mark.parametrize(
    "description",
    [
        "",
        "A cat(1) clone with wings.",
        "a cross-platform library for opening OS pipes",
        "A brotli decompressor that with an interface avoiding the rust stdlib. This makes it suitable for embedded "
        "devices and kernels. It is designed with a pluggable allocator. Download https://example.com/x",
        "word " * 60,
        "Colour \x1b[31mred\x1b[0m\nand a second line\u202e.",
    ],
    ids=["empty", "one-sentence", "library", "paragraph", "one-long-sentence", "escapes"],
)
def test_a_catalog_cell_asks_for_the_binary_as_published_in_one_short_line(
    description: str, binary: str, reads: str
) -> None:
    """Issue 37 (second trial): a catalog cell's request was the crate's description, a paragraph for some and a
    library's for others. Over every kind of description, binary and input: one line, short, that names the
    binary and says what it reads, quotes at most the description's first sentence, and carries no control text."""
    crate = "os_pipe"
    entry = crates.CatalogEntry(crate, "1.0.0", crate if binary == "same" else binary, reads, description, False)
    header, request = entry.cell.split("\n")
    assert header == f"%%flakebot --name os_pipe --crate {crate}"
    assert request.startswith(f"The {entry.binary} command as published, which ")
    assert ("reads standard input" if reads == "stdin" else "takes its arguments") in request
    assert crate in request and len(request) <= 80 + 100
    assert request != description.strip()
    assert all(ch.isprintable() for ch in request) and "\x1b" not in request and "\u202e" not in request
    assert "suitable for embedded" not in request and "https://" not in request  # only the first sentence
