"""Hidden checks of uuidfmt: every accepted form compared with Python's uuid module."""

import uuid

import pytest

IDS = [
    uuid.uuid5(uuid.NAMESPACE_DNS, "flakebot.example"),
    uuid.uuid3(uuid.NAMESPACE_URL, "https://example.org/x"),
    uuid.UUID("f81d4fae-7dec-11d0-a765-00a0c91e6bf6"),  # a version 1 UUID from RFC 4122
    uuid.UUID("2d2c0e5c-4d7f-4b55-9d7e-0f1f3a6b9a10"),
]


def forms(value: uuid.UUID) -> list[str]:
    return [str(value).upper(), value.hex, "{" + str(value) + "}", value.urn]


@pytest.mark.parametrize("value", IDS, ids=str)
def test_every_form(tool, value):
    lines = forms(value)
    expected = f"{value} v{value.version}\n" * len(lines)
    assert tool(input="\n".join(lines) + "\n") == expected


def test_not_a_uuid(tool):
    assert tool(input="not-a-uuid\n12345\n") == "invalid\ninvalid\n"
