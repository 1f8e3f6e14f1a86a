"""Which packages a shared proof compiles how: the test-only set from cargo metadata, and the --config it makes."""

from __future__ import annotations

from typing import Any

import pytest

from flakebot_magic.errors import BuildError
from flakebot_magic.stages.shared_profile import ROOT_SETTINGS, SharedProfile, dev_only_packages


def _dep(pkg: str, *kinds: str | None) -> dict[str, Any]:
    return {"pkg": pkg, "dep_kinds": [{"kind": k, "target": None} for k in kinds]}


def _metadata(nodes: dict[str, list[dict[str, Any]]], root: str | None = "root 1") -> dict[str, Any]:
    return {
        "packages": [{"id": i, "name": i.split()[0]} for i in nodes],
        "resolve": {"root": root, "nodes": [{"id": i, "deps": d} for i, d in nodes.items()]},
    }


def test_test_only_is_what_only_a_dev_edge_of_the_root_reaches() -> None:
    meta = _metadata(
        {
            "root 1": [
                _dep("serde 1", None),
                _dep("cc 1", "build"),
                _dep("regex 1", "dev"),
                _dep("both 1", None, "dev"),
            ],
            "serde 1": [_dep("derive 1", None)],
            "derive 1": [],
            "cc 1": [],
            "both 1": [],
            # what a dev-dependency pulls in is test-only, unless the release graph has it too
            "regex 1": [_dep("aho 1", None), _dep("serde 1", None), _dep("memchr 2", None)],
            "aho 1": [],
            # another version of a release package's name: an override by name would reach the release one
            "memchr 2": [],
            "memchr 1": [],
        }
    )
    meta["resolve"]["nodes"][1]["deps"].append(_dep("memchr 1", None))
    assert dev_only_packages(meta) == ("root", ("aho", "regex"))


def test_a_virtual_workspace_has_no_shared_profile() -> None:
    assert dev_only_packages(_metadata({"a 1": []}, root=None)) is None


def test_the_overrides_name_the_root_and_the_dev_only_packages() -> None:
    args = SharedProfile("pulldown-cmark", ("regex", "serde_json")).args()
    assert args[0] == "--release" and set(args[1::2]) == {"--config"}
    settings = args[2::2]
    assert {f'profile.release.package."pulldown-cmark".{k}={v}' for k, v in ROOT_SETTINGS} <= set(settings)
    assert 'profile.release.package."regex".opt-level=0' in settings
    assert not any("debug-assertions" in s for s in settings if '"regex"' in s)  # only opt-level for those
    assert len(settings) == len(ROOT_SETTINGS) + 2


@pytest.mark.parametrize("name", ['x".opt-level=3 #', "a b", "", "ü", "a" * 65])
def test_a_name_cargo_would_not_allow_is_refused(name: str) -> None:
    with pytest.raises(BuildError, match="does not allow"):
        SharedProfile(name, ())
    with pytest.raises(BuildError, match="does not allow"):
        SharedProfile("root", (name,))
