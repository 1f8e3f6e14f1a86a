"""What the door tests of ``tests/security/test_doors_*.py`` plant: text that runs on the host if anything takes it
for code, and the check that nothing did.

Each source of text flakebot does not trust (a model's reply, an agent's call, a shared notebook, a tool's
output, a crate's files, the cache's files, a checkout, a registry's answer) gets this payload at every door
it reaches. Two kinds of ``>>>`` lines:

* Python that writes a marker file when evaluated or executed (``__import__``, a call inside an argument): run
  by ``eval``/``exec`` in flakebot's process (the code before issue 33), it writes the marker as the user;
* an example of the allowed form (a call of the tool with a literal): harmless as data, but counted as an
  acceptance example it would make flakebot run the tool on words that are not the person's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.host.trees import remove_tree

__all__ = ["assert_nothing_ran", "deep_trees_removed", "runs_if_code"]


def runs_if_code(marker: Path, tool: str) -> str:
    """``>>>`` lines that write ``marker`` if run as Python, and one of the allowed form calling ``tool``."""
    path = repr(str(marker))
    return (
        f">>> {tool}(__import__('pathlib').Path({path}).write_text('RAN'))\n"
        "'3'\n"
        f">>> __import__('pathlib').Path({path}).write_text('RAN')\n"
        "3\n"
        f">>> {tool}('counted-as-an-example')\n"
        "'not the person'\n"
    )


def assert_nothing_ran(marker: Path, tool: Any = None, *, source: str) -> None:
    """No payload ran as Python, and no ``>>>`` line of ``source`` became an acceptance example of ``tool``."""
    assert not marker.exists(), f"text from {source} ran as Python in flakebot's process (it wrote {marker})"
    acceptance = getattr(tool, "acceptance", None)
    assert acceptance is None or not acceptance.results, (
        f"'>>>' lines from {source} ran as acceptance examples: {acceptance}"
    )


@pytest.fixture(autouse=True)
def deep_trees_removed(tmp_path: Path) -> Iterator[None]:
    """Whatever the test leaves under ``tmp_path`` goes when it ends, by descriptors: a tree deeper than any
    recursion (what these tests plant) would make pytest's own clean-up of old temporary directories, which
    recurses (``shutil.rmtree``), fail later in whoever's session. Import it into a test module to use it."""
    yield
    remove_tree(tmp_path, ignore_errors=True)
