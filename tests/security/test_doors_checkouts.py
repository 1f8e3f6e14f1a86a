"""Row "suite and benchmark checkouts" of the matrix (docs/SECURITY.md): a checkout is read, never followed.

A cloned benchmark (aider's polyglot exercises) or a suite someone shares is a tree of somebody else's files.
Before issue 33 a polyglot exercise whose ``.docs/instructions.md`` linked to ``~/secret.txt`` sent the file to
the model provider (in the request) and copied it into the workspace. Here every file the loaders read is a
link to a secret outside the checkout, at every place they read: the instructions, ``src/``, ``.meta/config.json``,
the tests, the exercise and the task directories themselves, a suite's ``task.toml`` and ``test_hidden.py``; and a
``src/`` 3,000 levels deep. The secret reaches no request, no staged file, no hidden-test list; each such exercise
or task is a problem that says why; and nothing raises.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from door_payloads import deep_trees_removed  # noqa: F401  (an autouse fixture)

from flakebot_magic.eval.polyglot import polyglot_suite
from flakebot_magic.eval.task import load_suite
from flakebot_magic.host.trees import remove_tree

SECRET = "zq-SECRET-OUTSIDE-4411"


def _exercise(practice: Path, name: str) -> Path:
    root = practice / name
    for sub in (".docs", ".meta", "src", "tests"):
        (root / sub).mkdir(parents=True)
    (root / ".docs" / "instructions.md").write_text(f"# {name}\n\nDo the thing.\n")
    (root / ".meta" / "config.json").write_text(json.dumps({"files": {"test": [f"tests/{name}.rs"]}}))
    (root / "Cargo.toml").write_text(f'[package]\nedition = "2021"\nname = "{name}"\nversion = "1.0.0"\n')
    (root / "src" / "lib.rs").write_text("pub fn f() {}\n")
    (root / "tests" / f"{name}.rs").write_text("#[test]\nfn t() {}\n")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "home"
    (out / "exercise" / ".docs").mkdir(parents=True)
    (out / "secret.txt").write_text(f"{SECRET}\n")
    (out / "secret.json").write_text(json.dumps({"files": {"test": ["tests/x.rs"]}, "blurb": SECRET}))
    (out / "tests").mkdir()
    (out / "tests" / "linked.rs").write_text(f"// {SECRET}\n#[test]\nfn t() {{}}\n")
    return out


def test_a_polyglot_checkout_is_read_never_followed(tmp_path: Path, outside: Path) -> None:
    practice = tmp_path / "checkout" / "rust" / "exercises" / "practice"
    _exercise(practice, "honest")
    docs = _exercise(practice, "docs-link")
    (docs / ".docs" / "instructions.md").unlink()
    (docs / ".docs" / "instructions.md").symlink_to(outside / "secret.txt")  # the red team's door
    append = _exercise(practice, "append-link")
    (append / ".docs" / "instructions.append.md").symlink_to(outside / "secret.txt")
    src = _exercise(practice, "src-link")
    (src / "src" / "lib.rs").unlink()
    (src / "src" / "lib.rs").symlink_to(outside / "secret.txt")
    srcdir = _exercise(practice, "srcdir-link")
    (srcdir / "src" / "lib.rs").unlink()
    (srcdir / "src" / "more").symlink_to(outside)
    config = _exercise(practice, "config-link")
    (config / ".meta" / "config.json").unlink()
    (config / ".meta" / "config.json").symlink_to(outside / "secret.json")
    tests = _exercise(practice, "tests-link")
    (tests / ".meta" / "config.json").write_text("{}")
    for test in (tests / "tests").iterdir():
        test.unlink()
    (tests / "tests").rmdir()
    (tests / "tests").symlink_to(outside / "tests")
    manifest = _exercise(practice, "manifest-link")
    (manifest / "Cargo.toml").unlink()
    (manifest / "Cargo.toml").symlink_to(outside / "secret.txt")
    (outside / "exercise" / ".docs" / "instructions.md").write_text(SECRET)
    (outside / "exercise" / "Cargo.toml").write_text('[package]\nname = "away"\nversion = "1.0.0"\n')
    (practice / "away").symlink_to(outside / "exercise")
    deep = _exercise(practice, "deep-src")
    where = deep / "src"
    for _ in range(3000):  # deeper than any recursion: a copy must not raise
        where = where / "d"
        try:
            where.mkdir()
        except OSError:  # the path outgrew the kernel's limit: deep enough
            break

    suite = polyglot_suite(tmp_path / "checkout" / "rust", tmp_path / "staging")
    tasks = {t.id: t for t in suite.tasks}
    problems = {p.id: p.message for p in suite.problems}
    assert "honest" in tasks
    for task in suite.tasks:
        assert SECRET not in task.request, task.id
        assert all(Path(p).resolve().is_relative_to(task.path.resolve()) for p in task.hidden.files), task.id
        for path in task.source.rglob("*") if task.source else []:
            assert path.is_symlink() or not path.is_file() or SECRET not in path.read_text(errors="replace")
    for name in ("docs-link", "append-link", "src-link", "srcdir-link", "config-link", "manifest-link"):
        assert name in problems and "never followed" in problems[name], (name, problems.get(name))
    assert "tests-link" not in tasks or not tasks["tests-link"].hidden.files
    assert "away" not in tasks  # a linked exercise directory is no exercise of this checkout
    assert "deep-src" in tasks or "deep-src" in problems  # read or refused, never a RecursionError
    staged = "\n".join(
        p.read_text(errors="replace") for p in (tmp_path / "staging").rglob("*") if p.is_file() and not p.is_symlink()
    )
    assert SECRET not in staged
    for tree in (deep, tmp_path / "staging"):  # pytest's own clean-up recurses
        remove_tree(tree)


def test_a_suites_tasks_are_read_never_followed(tmp_path: Path, outside: Path) -> None:
    suite = tmp_path / "suite"
    good = suite / "good"
    good.mkdir(parents=True)
    (good / "task.toml").write_text('name = "good"\ncrate = "tinyecho"\nrequest = "echo words"\n')
    (good / "test_hidden.py").write_text("def test_x(tool):\n    assert tool\n")
    away = outside / "task"
    away.mkdir()
    (away / "task.toml").write_text(f'name = "away"\ncrate = "tinyecho"\nrequest = "{SECRET}"\n')
    (away / "test_hidden.py").write_text("def test_x(tool):\n    assert tool\n")
    (suite / "linked").symlink_to(away)
    toml = suite / "toml-link"
    toml.mkdir()
    (outside / "task.toml").write_text(f'name = "toml_link"\ncrate = "tinyecho"\nrequest = "{SECRET}"\n')
    (toml / "task.toml").symlink_to(outside / "task.toml")
    (toml / "test_hidden.py").write_text("def test_x(tool):\n    assert tool\n")
    hidden = suite / "hidden-link"
    hidden.mkdir()
    (hidden / "task.toml").write_text('name = "hidden_link"\ncrate = "tinyecho"\nrequest = "echo words"\n')
    (hidden / "test_hidden.py").symlink_to(outside / "tests" / "linked.rs")
    loaded = load_suite(suite)
    tasks = {t.id: t for t in loaded.tasks}
    problems = {p.id: p.message for p in loaded.problems}
    assert set(tasks) == {"good"}, (tasks, problems)
    assert all(SECRET not in t.request for t in loaded.tasks)
    assert "never followed" in problems["linked"]
    assert (
        "symlink is never followed" in problems["toml-link"] and "symlink is never followed" in problems["hidden-link"]
    )
