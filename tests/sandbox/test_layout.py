"""What counts as a workspace's source is decided in ``sandbox/layout.py`` alone.

* read from the source: no other module names the candidates' directory, lists ``target`` beside ``.git`` or
  the candidates (a second list of what is not source), or compares a name with ``"target"``;
* the check is not vacuous: it finds the lists ``sandbox/layout.py`` makes, and a module written the old way;
* the walks agree: the tree policy, the model's listing and the ratchet's scan skip the same directories.
"""

from __future__ import annotations

import ast
from pathlib import Path

from flakebot_magic.sandbox.layout import CANDIDATES_DIR, GIT_DIR, NOT_WALKED, OUTPUT_DIRS, is_source, source_dirs

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
LAYOUT = PACKAGE / "sandbox" / "layout.py"
OTHERS = {GIT_DIR, CANDIDATES_DIR, "result"}


def _decisions(source: str, where: str) -> list[str]:
    """Where ``source`` decides by itself what is not source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Constant) and node.value == CANDIDATES_DIR:
            found.append(f"{line} names {CANDIDATES_DIR}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            if "target" in words and words & OTHERS:
                found.append(f"{line} lists {sorted(words)}")
        elif isinstance(node, ast.Compare) and any(
            isinstance(e, ast.Constant) and e.value == "target" for e in node.comparators
        ):
            found.append(f"{line} compares a name with 'target'")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "ignore_patterns"
            and {a.value for a in node.args if isinstance(a, ast.Constant)} & {"target", GIT_DIR}
        ):
            found.append(f"{line} ignores its own list of names")
    return found


def test_no_module_decides_by_itself_what_is_source() -> None:
    skipped = {LAYOUT, PACKAGE / "testing" / "overlay.py"}  # the test double copies fixtures, not workspaces
    suites = PACKAGE / "eval" / "suites"
    outside = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in skipped and suites not in path.parents
        for hit in _decisions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    ]
    assert outside == [], "use flakebot_magic.sandbox.layout:\n" + "\n".join(outside)


def test_the_check_finds_what_it_forbids() -> None:
    assert _decisions(LAYOUT.read_text(encoding="utf-8"), "layout.py")  # the candidates' name, at least
    old_way = (
        'x = (".git", "target", ".flakebot-candidates")\n'
        'if parts[0] == "target": pass\n'
        'shutil.ignore_patterns(".git", "target")\n'
    )
    assert len(_decisions(old_way, "old.py")) == 4  # the list, its candidates' name, the compare, the ignore


def test_the_walks_skip_the_same_directories(tmp_path: Path) -> None:
    from flakebot_magic.edit.files import WorkspaceFiles
    from flakebot_magic.edit.ratchet import scan_tests

    for name in ("src", *NOT_WALKED, "results"):
        (tmp_path / name).mkdir()
        function = "hidden_in_" + name.strip(".").replace("-", "_")
        (tmp_path / name / "t.rs").write_text(f"#[test]\nfn {function}() {{}}\n")
    (tmp_path / "Cargo.toml").write_text('[package]\nname = "x"\nversion = "0.1.0"\n')
    listed = WorkspaceFiles(tmp_path, False).list_files(".")
    assert "src/t.rs" in listed and "results/t.rs" in listed
    assert not any(f"{name}/" in listed for name in NOT_WALKED)
    scanned = {t for t in scan_tests(tmp_path)}
    assert scanned and not any(name.strip(".").replace("-", "_") in str(scanned) for name in NOT_WALKED)
    assert source_dirs(["src", *NOT_WALKED, "results"]) == ["src", "results"]
    assert all(not is_source(name) for name in OUTPUT_DIRS)
