"""The pipeline's run: what it tells the user about search before it chooses."""

from __future__ import annotations

from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic.config import Settings
from flakebot_magic.errors import NeedsModelError, SearchError
from flakebot_magic.events import Event, Notice
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.stages import search as search_stage


def test_a_pipeline_without_semantic_search_says_so_once_per_run_and_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the search weighs words only is said once where the user reads it: in a refusal (every refusal
    carries it, as the reason nothing fits) and then by no notice too; else as a notice, once per process."""
    monkeypatch.setattr(search_stage, "_NOTICED", set())  # as in a fresh process
    registry = write_registry(tmp_path / "registry", ["tinylib"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), embedding_model="off")

    def said(run: list[Event], error: BaseException) -> tuple[int, int]:
        notices = [e for e in run if isinstance(e, Notice) and "semantic search" in e.message.lower()]
        assert all(n.level == "info" and "words only" in n.message for n in notices)
        return len(notices), str(error).lower().count("semantic search")

    for _ in range(2):  # two builds in one process (a kernel), each by a pipeline of its own
        events: list[Event] = []
        with pytest.raises(NeedsModelError, match="tinylib") as refused:  # found by its words: no deploy
            Pipeline(settings, observers=[events.append]).run("uppercase text", name="up")
        assert said(events, refused.value) == (0, 1)  # the refusal says it, the notice does not say it again
    for notices in (1, 0):  # no crate matches: no refusal says it, so the notice does, once per process
        events = []
        with pytest.raises(SearchError) as missed:
            Pipeline(settings, observers=[events.append]).run("zzyzx qwxv", name="nothing")
        assert said(events, missed.value) == (notices, 0)


def test_a_binary_found_by_its_words_alone_is_refused_with_every_way_forward(tmp_path: Path) -> None:
    """The refusal names the three ways on: the binary by --crate, search by meaning turned on, a model."""
    registry = write_registry(tmp_path / "registry", ["tinyecho", "tinylib"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), embedding_model="off")
    with pytest.raises(NeedsModelError) as refused:
        Pipeline(settings).run("print echo", name="echo")
    message = str(refused.value)
    assert "only its words were weighed" in message
    ways = message.splitlines()[-2:]
    assert ways[0].startswith(
        "Build tinyecho as published with --crate tinyecho, "
        "or configure a model (--model NAME, with --provider or --base-url). "
    )
    assert "catalog WORDS` (or `%flakebot catalog WORDS` in a notebook) lists what builds with no model" in ways[0]
    assert ways[1].startswith("Semantic search is turned off (embedding_model is 'off': $FLAKEBOT_EMBEDDING_MODEL,")
    # either door may have turned it off (the environment, or %config in a kernel): the way back names both
    assert (
        "To turn it on: unset $FLAKEBOT_EMBEDDING_MODEL or `%config FlakebotMagics.embedding_model = None`" in ways[1]
    )
