"""Lenient JSON for calls written as text: the standard library + json5 (chosen) against json-repair and dirtyjson.

Prints, for each library, which of the cases a model writes it reads as
meant, which it refuses, which it misreads (a cut call "repaired" into a
shorter one, garbage read as a value, the second of two objects dropped),
and its time on a long call with a trailing comma. Libraries not installed
are skipped: ``pip install json-repair dirtyjson`` to compare all.

    .venv/bin/python benchmarks/lenient_json.py
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from typing import Any

#: (what, text, the value meant, or None when the only right answer is a refusal)
CASES: list[tuple[str, str, Any]] = [
    ("strict", '{"path": "a", "content": "x"}', {"path": "a", "content": "x"}),
    ("trailing comma", '{"path": "a", "content": "x",}', {"path": "a", "content": "x"}),
    ("single quotes", "{'path': 'a', 'content': 'x'}", {"path": "a", "content": "x"}),
    ("raw newline in a string", '{"content": "line1\nline2"}', {"content": "line1\nline2"}),
    ("a JSON string inside", '{"arguments": "{\\"path\\": \\"a\\"}"}', {"arguments": '{"path": "a"}'}),
    ("cut mid-string", '{"path": "a", "content": "fn main() {', None),
    ("cut after a key", '{"path": "a", "content": ', None),
    ("prose", "I will now read the file.", None),
    ("two objects", '{"a": 1} {"b": 2}', None),
    ("python literals", '{"a": True, "b": None}', None),
]


def _ours(text: str) -> Any:
    try:
        return json.loads(text, strict=False)
    except ValueError:
        import json5

        return json5.loads(text)


def _readers() -> dict[str, Callable[[str], Any]]:
    readers: dict[str, Callable[[str], Any]] = {"stdlib+json5 (chosen)": _ours}
    for name, attribute in (("json_repair", "loads"), ("dirtyjson", "loads")):
        try:
            readers[name] = getattr(importlib.import_module(name), attribute)
        except ImportError:
            print(f"({name} not installed: skipped)")
    return readers


def main() -> None:
    big = json.dumps({"path": "src/main.rs", "content": 'fn main() { println!("hi"); }\n' * 2000})[:-1] + ",}"
    for name, read in _readers().items():
        right, refused, wrong = [], [], []
        for what, text, meant in CASES:
            try:
                value = read(text)
            except Exception:  # each library has its own errors
                (right if meant is None else refused).append(what)
                continue
            (right if value == meant else wrong).append(what)
        start = time.perf_counter()
        read(big)
        seconds = time.perf_counter() - start
        print(
            f"{name}: {len(right)}/{len(CASES)} right; {len(big) // 1024} KB with a trailing comma in {seconds:.3f} s"
        )
        if refused:
            print(f"    refused what it should read: {', '.join(refused)}")
        if wrong:
            print(f"    MISREAD: {', '.join(wrong)}")


if __name__ == "__main__":
    main()
