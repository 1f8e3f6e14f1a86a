"""The starter suite proves itself: each task's reference solution (Rust files beside it) passes its hidden tests
through the real pipeline, and the harness scores that 100%.

``notebooks/eval.ipynb`` runs two of its tasks the same way (nbval checks the summary in ``make test``);
``make bench`` times the whole suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

import flakebot_magic.eval
from flakebot_magic.eval.reference import manifest_edits, starting_manifest
from flakebot_magic.eval.task import BUILTIN_SUITES, load_suite
from flakebot_magic.registry.directory import DirectoryRegistry

STARTER = BUILTIN_SUITES["starter"]
DEBIAN = Path("/usr/share/cargo/registry")


def test_every_starter_task_carries_its_reference_as_rust_files_and_no_script() -> None:
    suite = load_suite(STARTER)
    assert suite.problems == () and len(suite.tasks) >= 20
    assert not list(STARTER.glob("*.py")) and not list(STARTER.glob("*/solution.json"))
    for task in suite.tasks:
        reference = task.reference
        assert reference is not None, task.id
        binary = f"src/bin/{task.name}.rs"
        assert binary in dict(reference.files), task.id
        assert reference.manifest["package"]["metadata"]["flakebot"] == {"kind": "cli", "bin": task.name}
        assert tomllib.loads((STARTER / task.id / "reference" / "Cargo.toml").read_text()) == reference.manifest


@pytest.mark.skipif(not DEBIAN.is_dir(), reason="needs Debian's offline crate registry")
def test_each_reference_manifest_applies_as_edits_of_its_crates_manifest(tmp_path: Path) -> None:
    registry = DirectoryRegistry(DEBIAN, tmp_path / "index")
    for task in load_suite(STARTER).tasks:
        assert task.reference is not None
        edits = manifest_edits(starting_manifest(task, registry), task.reference.manifest)
        assert edits and all(search for search, _ in edits), task.id


@pytest.mark.cargo
@pytest.mark.timeout(3600)
@pytest.mark.skipif(not DEBIAN.is_dir(), reason="needs Debian's offline crate registry")
def test_the_reference_run_of_the_starter_suite_scores_every_task(tmp_path: Path) -> None:
    results = flakebot_magic.eval.run(
        "starter", reference=True, jobs=2, out=tmp_path / "out", backend="cargo", progress=False
    )
    data = results.to_json()
    failed = {
        a["task"]: f"{a['failure']}: {a['cause'] or a['message'][:300]}" for a in data["attempts"] if not a["passed"]
    }
    assert failed == {}
    assert data["kind"] == "replay" and data["reference"] and data["notice"].startswith("REFERENCE")
    assert data["suite"]["not_runnable"] == [] and data["suite"]["problems"] == []
    (summary,) = results.summary.values()
    assert summary["pass_at_1"] == 1.0 and summary["solved"] == summary["tasks"] == len(load_suite(STARTER).tasks)
    # every hidden test ran and passed, counted one by one
    for attempt in data["attempts"]:
        hidden = attempt["hidden"]
        assert hidden["total"] > 0 and hidden["passed"] == hidden["total"], attempt["task"]
