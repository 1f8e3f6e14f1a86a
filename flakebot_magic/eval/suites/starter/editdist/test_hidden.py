"""Hidden checks of editdist: Levenshtein against a Python implementation; the transposition variants."""

import pytest


def levenshtein(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


PAIRS = [("kitten", "sitting"), ("", "abc"), ("same", "same"), ("saturday", "sunday"), ("ünï", "uni")]


@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_levenshtein_arguments(tool, a, b):
    assert tool(a, b) == f"{levenshtein(a, b)}\n"


def test_transpositions(tool):
    # "ca" -> "abc": two edits when a transposition may be edited again, three in OSA
    assert tool("--algorithm", "damerau", "ca", "abc") == "2\n"
    assert tool("--algorithm", "osa", "ca", "abc") == "3\n"
    assert tool("--algorithm", "levenshtein", "ca", "abc") == "3\n"
