"""Per-tool provenance when the store entry is shared: each name has its own workspace, commit and forker.

``te`` is built from tinyecho; ``te2`` asks for the same crate and comes from
the cache: the binary is ``te``'s, but the record names ``te`` as the tool
that forked the source, and ``te2``'s own workspace (a copy of te's at the
commit that built the entry) holds that commit. Rebuilding ``te`` (the same
inputs: the same store entry, swapped) leaves ``te2``'s part of the entry's
manifest, and ``te2`` itself, as they were.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic.config import Settings
from flakebot_magic.manage import tools
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.request import BuildRequest, RunFlags

pytestmark = pytest.mark.cargo


def _head(path: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True).stdout.strip()


def test_a_second_name_gets_its_own_workspace_and_keeps_it_through_a_rebuild_of_the_first(tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    start_build(settings, BuildRequest("", name="te", crate="tinyecho")).wait()
    start_build(settings, BuildRequest("", name="te2", crate="tinyecho")).wait()
    inventory = Inventory(settings.cache.tools)
    te, te2 = inventory.get("te"), inventory.get("te2")
    assert te is not None and te2 is not None
    assert te2.store_path == te.store_path  # one binary, two names
    assert (te.forked_by, te2.forked_by) == ("te", "te")  # the tool that really forked the source
    assert te2.workspace == str(settings.cache.workspaces / "te2") != te.workspace
    assert _head(Path(te2.workspace)) == te2.commit == te.commit  # the commit exists in te2's own history
    shown = tools.describe(settings, "te2")
    assert (shown["workspace"], shown["commit"]) == (te2.workspace, te2.commit)

    # te forked and built again: the same inputs, so the same store entry, swapped
    start_build(settings, BuildRequest("", name="te", crate="tinyecho", flags=RunFlags(rebuild=True))).wait()
    new_te, same_te2 = inventory.get("te"), inventory.get("te2")
    assert new_te is not None and new_te.commit != te.commit and new_te.store_path == te.store_path
    assert same_te2 == te2
    manifest = json.loads((Path(te.store_path) / "manifest.json").read_text())
    txn = {"te": new_te.extra["txn"], "te2": te2.extra["txn"]}  # each naming's transaction (manage/evidence.py)
    assert manifest["tools"] == {
        "te": {"commit": new_te.commit, "workspace": new_te.workspace, "forked_by": "te", "txn": txn["te"]},
        "te2": {"commit": te2.commit, "workspace": te2.workspace, "forked_by": "te", "txn": txn["te2"]},
    }
    assert _head(Path(te2.workspace)) == te2.commit and _head(Path(new_te.workspace)) == new_te.commit
    assert tools.describe(settings, "te")["commit"] == new_te.commit
    assert tools.describe(settings, "te2")["commit"] == te2.commit  # not the entry's last builder's
    assert subprocess.run([te2.binary, "both"], capture_output=True, text=True).stdout == "both\n"
