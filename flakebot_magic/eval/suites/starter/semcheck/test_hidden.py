"""Hidden checks of semcheck: cargo's requirement semantics (caret, tilde, ranges, pre-releases)."""

import pytest

import flakebot_magic

VERSIONS = ["0.3.0", "0.3.9", "0.4.0", "1.0.0", "1.2.2", "1.2.3", "1.9.9", "2.0.0-rc.1", "2.0.0", "2.1.0"]


@pytest.mark.parametrize(
    ("requirement", "matching"),
    [
        ("^1.2.3", ["1.2.3", "1.9.9"]),
        ("~1.2", ["1.2.2", "1.2.3"]),
        (">=1.0.0, <2.0.0", ["1.0.0", "1.2.2", "1.2.3", "1.9.9"]),
        ("^0.3", ["0.3.0", "0.3.9"]),
        ("=2.0.0-rc.1", ["2.0.0-rc.1"]),
        (">=2", ["2.0.0", "2.1.0"]),
        ("*", ["0.3.0", "0.3.9", "0.4.0", "1.0.0", "1.2.2", "1.2.3", "1.9.9", "2.0.0", "2.1.0"]),
    ],
)
def test_matches_like_cargo(tool, requirement, matching):
    assert tool(requirement, input="\n".join(VERSIONS) + "\n").splitlines() == matching


def test_invalid_requirement_fails(tool):
    with pytest.raises(flakebot_magic.ToolError) as failed:
        tool("not a requirement", input="1.0.0\n")
    assert failed.value.returncode == 2
