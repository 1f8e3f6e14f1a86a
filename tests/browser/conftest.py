"""Browser tests run last: by then the other tests have built the quickstart's tool, so the page shows a warm run."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    browser = [item for item in items if item.get_closest_marker("browser")]
    if browser:
        items[:] = [item for item in items if not item.get_closest_marker("browser")] + browser
