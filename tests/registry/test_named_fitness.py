"""Issue 37: a request whose first candidate ships a binary that does what it asks deploys it.

The trial's request, "draw a QR code for some text in the terminal", was refused with qrcode first among the
candidates: the request names the crate, and its other words ("draw", "terminal") say how and where, which
no crate's own words cover. :data:`~flakebot_magic.stages.search.NAMED_EVIDENCE` is the rule; these requests
are the trial's and new ones of the same class (none from the paraphrase files), on Debian's registry.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flakebot_magic.config import DEBIAN_REGISTRY
from flakebot_magic.errors import NeedsModelError
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.stages import search as search_stage
from flakebot_magic.stages.choose import choose_without_model

pytestmark = pytest.mark.skipif(
    not (DEBIAN_REGISTRY / "qrcode-0.12.0").is_dir(), reason="Debian's registry is not installed (make install)"
)


@pytest.fixture(scope="module")
def debian(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    opened = DirectoryRegistry(DEBIAN_REGISTRY, tmp_path_factory.mktemp("cache"))
    yield opened
    opened.close()


def _chosen(registry: DirectoryRegistry, request: str) -> str:
    found = search_stage.search(registry, request, prefer_bin=True)
    try:
        return choose_without_model(found, request).candidate.name
    except NeedsModelError as refused:
        return f"refused: {refused}"


@pytest.mark.parametrize(
    "request_text",
    [
        "draw a QR code for some text in the terminal",
        "show a QR code of a link",
        "print a qr code for my wifi password",
    ],
)
def test_a_request_naming_qrcode_deploys_its_binary(debian: DirectoryRegistry, request_text: str) -> None:
    if debian.semantic_off:
        pytest.skip(debian.semantic_off)
    assert _chosen(debian, request_text) == "qrcode"


@pytest.mark.parametrize(
    ("request_text", "library"),
    [("wrap long lines of text to a width", "textwrap"), ("convert a TOML file to JSON", "toml")],
)
def test_requests_that_name_no_binary_are_still_refused(
    debian: DirectoryRegistry, request_text: str, library: str
) -> None:
    chosen = _chosen(debian, request_text)
    assert chosen.startswith("refused") and library in chosen
