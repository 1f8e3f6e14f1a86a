"""The environment a child sees (:mod:`flakebot_magic.host.environment`): the allowlist, read again whenever
``os.environ`` changes, though what passed is kept between calls while it does not."""

from __future__ import annotations

import os

import pytest

from flakebot_magic.host.environment import allowed_env, scrubbed_env


def _fresh(extra_names: frozenset[str] = frozenset()) -> dict[str, str]:
    """The rule applied to ``os.environ`` from scratch (what a kept answer must equal)."""
    from flakebot_magic.host.environment import _allowed

    return {k: v for k, v in os.environ.items() if _allowed(k, extra_names)}


@pytest.mark.parametrize("rule", [allowed_env, scrubbed_env])
def test_every_change_to_os_environ_is_seen_at_the_next_call(monkeypatch: pytest.MonkeyPatch, rule: object) -> None:
    """Warm the kept answer, then change ``os.environ`` each way: the next call sees it, every time."""
    from flakebot_magic.host.environment import _HOST

    names = _HOST if rule is scrubbed_env else frozenset()

    def current() -> dict[str, str]:
        env = rule()  # type: ignore[operator]
        assert env == _fresh(names)
        return env

    current()
    monkeypatch.setenv("LC_FLAKEBOT_PROBE", "one")
    assert current()["LC_FLAKEBOT_PROBE"] == "one"
    monkeypatch.setenv("LC_FLAKEBOT_PROBE", "two")  # a value changed, no name added
    assert current()["LC_FLAKEBOT_PROBE"] == "two"
    monkeypatch.setenv("LC_API_TOKEN", "secret")  # allowlisted by prefix, refused as a secret
    assert "LC_API_TOKEN" not in current()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary")
    assert "sk-canary" not in current().values()
    monkeypatch.delenv("LC_FLAKEBOT_PROBE")
    assert "LC_FLAKEBOT_PROBE" not in current()
    monkeypatch.setenv("PATH", "/flakebot-probe:" + os.environ.get("PATH", ""))
    assert current()["PATH"].startswith("/flakebot-probe:")


def test_a_returned_environment_is_the_callers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept answer is never handed out itself: a caller changing its dict changes no later call's."""
    monkeypatch.setenv("LC_FLAKEBOT_PROBE", "kept")
    first = allowed_env()
    first["LC_FLAKEBOT_PROBE"] = "changed"
    first["INJECTED"] = "x"
    second = allowed_env({"EXTRA": "1"}, home="/h")
    assert second["LC_FLAKEBOT_PROBE"] == "kept" and "INJECTED" not in second
    assert second["HOME"] == "/h" and second["EXTRA"] == "1"
    assert "EXTRA" not in allowed_env() and "HOME" not in allowed_env()
