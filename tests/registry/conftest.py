"""Fixtures for the crates.io client: a fake crates.io on 127.0.0.1 and a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flakebot_magic.registry.cratesio import CratesIoRegistry
from flakebot_magic.testing.fake_cratesio import FakeCrate, FakeCratesIo


class FakeTime:
    """A monotonic clock that only moves when ``sleep`` is called; records the sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def sample_crates() -> list[FakeCrate]:
    return [
        FakeCrate(
            "jsonfmt",
            "1.2.0",
            description="Pretty-print and reformat JSON from the command line",
            keywords=["json", "cli", "formatter"],
            categories=["command-line-utilities"],
            bin_names=["jsonfmt"],
            files={"src/main.rs": 'fn main() { println!("{{}}"); }\n', "README.md": "# jsonfmt\n"},
            homepage="https://example.invalid/jsonfmt",
            repository="https://example.invalid/jsonfmt.git",
        ),
        FakeCrate("jsonfmt", "1.1.0", description="Pretty-print JSON", bin_names=["jsonfmt"]),
        FakeCrate(
            "json-core",
            "0.4.1",
            description="A small JSON parser library",
            keywords=["json", "parser"],
            categories=["parser-implementations", "encoding"],
            license="MIT OR Apache-2.0",
        ),
        FakeCrate(
            "yaml2json",
            "0.9.0",
            description="Convert YAML to JSON",
            keywords=["yaml", "json"],
            bin_names=["yaml2json", "json2yaml"],
        ),
        # versions: newest stable 0.2.0 (0.2.1 yanked, 0.3.0-beta.1 pre-release)
        FakeCrate("tool", "0.1.0", description="a tool", bin_names=["tool"]),
        FakeCrate("tool", "0.2.0", description="a tool", bin_names=["tool"]),
        FakeCrate("tool", "0.2.1", description="a tool", bin_names=["tool"], yanked=True),
        FakeCrate("tool", "0.3.0-beta.1", description="a tool", bin_names=["tool"]),
    ]


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def fake_cratesio() -> Iterator[FakeCratesIo]:
    """A fake crates.io (test double) serving :func:`sample_crates`."""
    with FakeCratesIo(sample_crates()) as fake:
        yield fake


@pytest.fixture
def make_registry(fake_cratesio: FakeCratesIo, fake_time: FakeTime) -> Iterator[Callable[..., CratesIoRegistry]]:
    """Build CratesIoRegistry instances aimed at the fake; all closed at teardown.

    Defaults to the fake clock with ``min_interval=0`` so ``fake_time.sleeps``
    holds only retry waits; pass options to override.
    """
    made: list[CratesIoRegistry] = []

    def make(**options: Any) -> CratesIoRegistry:
        settings: dict[str, Any] = {
            "api_url": fake_cratesio.url,
            "index_url": fake_cratesio.index_url,
            "min_interval": 0.0,
            "timeout": 5.0,
            "sleep": fake_time.sleep,
            "clock": fake_time.clock,
        }
        settings.update(options)
        registry = CratesIoRegistry(**settings)
        made.append(registry)
        return registry

    yield make
    for registry in made:
        registry.close()


@pytest.fixture
def registry(make_registry: Callable[..., CratesIoRegistry]) -> CratesIoRegistry:
    return make_registry()
