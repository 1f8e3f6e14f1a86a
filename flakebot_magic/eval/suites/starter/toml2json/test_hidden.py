"""Hidden checks of toml2json: the JSON read back equals what Python's tomllib reads from the TOML."""

import json

import pytest
import tomllib

import flakebot_magic

DOCUMENTS = [
    'title = "flakebot"\n',
    'n = 42\nf = 2.5\nyes = true\nlist = [1, 2, 3]\nnested = [[1], ["a"]]\n',
    '[owner]\nname = "Ada"\n[owner.address]\ncity = "London"\n\n[[crates]]\nname = "sha2"\n[[crates]]\nname = "hex"\n',
    'inline = { a = 1, b = { c = "deep" } }\n"quoted key" = "ünïcødé ✓"\n',
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_same_data_as_tomllib(tool, document):
    assert json.loads(tool(input=document)) == tomllib.loads(document)


def test_dates_become_strings(tool):
    assert json.loads(tool(input="when = 1979-05-27T07:32:00Z\n")) == {"when": "1979-05-27T07:32:00Z"}


def test_invalid_toml_fails(tool):
    with pytest.raises(flakebot_magic.ToolError):
        tool(input="this is = = not toml\n")
