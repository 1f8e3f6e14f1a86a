"""A pipeline holds only its dependencies; each run's state travels with the run, so one pipeline runs two at once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from tinycrates import Recorder

from flakebot_magic.config import Settings
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest


def test_a_request_and_its_text_shorthand_are_the_same() -> None:
    assert BuildRequest.of("shout", name="s") == BuildRequest("shout", name="s")
    request = BuildRequest("", crate="tinyecho")
    assert BuildRequest.of(request) is request
    with pytest.raises(TypeError):
        BuildRequest.of(request, name="other")


@pytest.mark.cargo
def test_one_pipeline_keeps_nothing_of_a_run(session_registry: DirectoryRegistry, tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path, registry=str(session_registry.path), backend="cargo")
    pipeline = Pipeline(settings, registry=session_registry)
    before = dict(vars(pipeline))
    first = pipeline.run(BuildRequest("", name="first", crate="tinyecho"))
    assert vars(pipeline) == before
    second = pipeline.run(BuildRequest("shout", name="second", crate="tinyecho"))
    assert (first.name, second.name) == ("first", "second")
    record = Inventory(settings.cache.tools).get("second")
    assert record is not None and record.request == "shout"
    assert vars(pipeline) == before


@pytest.mark.cargo
def test_one_pipeline_runs_two_requests_at_once(session_registry: DirectoryRegistry, tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path, registry=str(session_registry.path), backend="cargo")
    recorder = Recorder()
    pipeline = Pipeline(settings, registry=session_registry, observers=[recorder])
    before = set(vars(pipeline))
    tools: dict[str, Any] = {}
    errors: list[BaseException] = []

    def build(name: str) -> None:
        try:
            tools[name] = pipeline.run(BuildRequest("", name=name, crate="tinyecho"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(name,)) for name in ("first", "second")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert errors == []
    assert {tool.name for tool in tools.values()} == {"first", "second"}
    assert all(tool(input="hi") == "HI" for tool in tools.values())
    assert set(vars(pipeline)) == before  # nothing of a run was left on the pipeline


@pytest.mark.cargo
def test_start_build_takes_a_build_request_and_keeps_its_log(
    session_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    settings = Settings(cache_dir=tmp_path, registry=str(session_registry.path), backend="cargo")
    tool = start_build(settings, BuildRequest("shout standard input", name="shout", crate="tinyecho")).wait()
    assert tool.name == "shout"
    record = Inventory(settings.cache.tools).get("shout")
    assert record is not None and record.request == "shout standard input"
    assert Path(record.log_path).is_file() and "== search started" in Path(record.log_path).read_text()
