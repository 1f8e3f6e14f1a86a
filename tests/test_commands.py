"""Advice that names a command names it as a shell user and as a notebook user types it: one decision, ``typed``.

The property, over the whole package: no text a person is shown (a string
literal, or a piece of an f-string, that is not a docstring) spells a
management command out by hand; each goes through
:func:`flakebot_magic.commands.typed`. The command's own shell door
(``cli.py``: argparse help and the command's answers, read in a terminal)
and the magic's own usage lines (``magics.py``, read in a notebook) speak to
one kind of user and are left as they are.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from flakebot_magic.commands import LINE_COMMANDS, typed

PACKAGE = Path(__file__).resolve().parents[1] / "flakebot_magic"
#: the doors that speak to one kind of user only, and the module that spells both
ONE_DOOR = {"cli.py", "magics.py", "commands.py"}
#: every command a person types after `flakebot` (the line commands, and build)
COMMANDS = sorted({usage.split()[0] for usage, _ in LINE_COMMANDS} | {"build"})
BY_HAND = re.compile(r"`%?flakebot (?:" + "|".join(COMMANDS) + r")\b")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _by_hand() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if str(relative) in ONE_DOOR or relative.parts[0] == "testing":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and id(node) not in docstrings else None
            if isinstance(text, str) and BY_HAND.search(text):
                found.append(f"{relative}:{node.lineno}: {text.strip()[:100]}")
    return found


def test_no_advice_spells_a_command_by_hand() -> None:
    assert _by_hand() == []


@pytest.mark.parametrize("line", ["verify md", "doctor", "rebuild my-tool", "clean --all"])
def test_typed_names_the_shell_form_and_the_notebook_form(line: str) -> None:
    assert typed(line) == f"`flakebot {line}` (or `%flakebot {line}` in a notebook)"


def test_a_build_is_a_cell_in_a_notebook() -> None:
    said = typed("build --backend nix --rebuild --name md ...", "%%flakebot --backend nix --rebuild --name md")
    assert said.endswith("(or a `%%flakebot --backend nix --rebuild --name md` cell in a notebook)")


def test_advice_names_the_form_its_reader_types(capsys: pytest.CaptureFixture[str]) -> None:
    from flakebot_magic.commands import advise

    advise("notebook")  # a kernel with the extension loaded
    assert typed("verify md") == "`%flakebot verify md`"
    assert typed("build --name md", "%%flakebot --name md") == "a `%%flakebot --name md` cell"
    assert typed("build --name md --resume", "the same cell with --resume") == "the same cell with --resume"
    advise("shell")
    assert typed("verify md") == "`flakebot verify md`"
    advise("")
    assert typed("verify md") == "`flakebot verify md` (or `%flakebot verify md` in a notebook)"
    with pytest.raises(ValueError):
        advise("terminal")


def test_the_extension_speaks_to_a_notebook_and_the_command_to_a_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    import flakebot_magic
    from flakebot_magic.cli import main

    shell = InteractiveShell.instance()
    flakebot_magic.load_ipython_extension(shell)
    assert typed("verify md") == "`%flakebot verify md`"
    flakebot_magic.unload_ipython_extension(shell)
    assert typed("verify md").startswith("`flakebot verify md` (or")
    # the command's own advice, in a shell: a tool it does not know
    assert main(["verify", "nosuchtool", "--cache-dir", str(tmp_path)]) != 0
    said = capsys.readouterr().err
    assert "`flakebot list` shows them" in said and "%flakebot" not in said, said
    assert typed("verify md").startswith("`flakebot verify md` (or")  # restored for an in-process caller
