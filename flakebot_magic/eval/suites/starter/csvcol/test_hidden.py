"""Hidden checks of csvcol: columns compared with Python's csv module (quotes, commas in fields)."""

import csv
import io

import pytest

import flakebot_magic

DATA = (
    "name,city,notes\n"
    'Ada,London,"mathematician, writer"\n'
    'Grace,"New York","said ""it\'s easier to ask forgiveness"""\n'
    "Linus,Helsinki,\n"
)


@pytest.mark.parametrize("column", ["name", "city", "notes"])
def test_column_like_python_csv(tool, column):
    rows = list(csv.DictReader(io.StringIO(DATA)))
    assert tool("--column", column, input=DATA) == "".join(f"{row[column]}\n" for row in rows)


def test_unknown_column_fails(tool):
    with pytest.raises(flakebot_magic.ToolError) as failed:
        tool("--column", "age", input=DATA)
    assert failed.value.returncode == 1
