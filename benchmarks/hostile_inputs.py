"""Issue 33 (red team 33, class V): what the host's CPU spends on hostile text, in the checkout it is run from.

Run it from a checkout's root, before and after a change, side by side (each line stops at 120 s):

    cd /path/to/checkout && /path/to/.venv/bin/python benchmarks/hostile_inputs.py

The inputs are the red team's (120 KB of unterminated ``/*``, 60 KB of blank lines) and the siblings the
regex audit (tests/security/test_regex_linear.py) found.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, ".")

LIMIT = 120


class _Slow(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Slow


def timed(label: str, work: Callable[[], object]) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT)
    started = time.monotonic()
    try:
        work()
        took = f"{time.monotonic() - started:8.3f} s"
    except _Slow:
        took = f"> {LIMIT} s (stopped)"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    print(f"{label:72s} {took}", flush=True)


def crate(files: dict[str, str]) -> Path:
    root = Path(tempfile.mkdtemp(prefix="hostile-"))
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")
    return root


def main() -> None:
    import flakebot_magic.stages.fork as fork
    from flakebot_magic.clients.cli_tool_help import _DEFAULT
    from flakebot_magic.edit.prompt import repo_map
    from flakebot_magic.edit.ratchet import _tests_in, blank, scan_tests
    from flakebot_magic.registry.crate_files import _readme_usage
    from flakebot_magic.stages.choose import _public_items
    from flakebot_magic.untrusted import safe_text

    notes = crate({"src/main.rs": "fn main(){}\n", "src/notes.rs": "/*x" * 40_000})
    timed("ratchet scan_tests: 120 KB of '/*x' (red team)", lambda: scan_tests(notes))
    timed(
        "ratchet _tests_in: '#[test] fn t() {' x 10,000 (160 KB)",
        lambda: _tests_in(blank("#[test] fn t() {" * 10_000), "x"),
    )
    blank_main = crate({"src/main.rs": "fn main() {}\n" + "\n" * 60_000})
    timed("edit/prompt repo_map: 60 KB of blank lines (red team)", lambda: repo_map(blank_main))
    blank_lib = crate({"src/lib.rs": "pub fn f() {}\n" + "\n" * 60_000})
    timed("stages/choose _public_items: 60 KB lib.rs of blank lines (red team)", lambda: _public_items(blank_lib))
    target = crate({"tests/t.rs": "#[test]\nfn t() {}\n" + "\n" * 20_000})
    if hasattr(fork, "_module_texts"):
        timed(
            "stages/fork module files: 20 KB test target of blank lines (red team)",
            lambda: fork._module_texts(target, "tests/t.rs"),
        )
    else:  # the code before issue 33's second round
        timed(
            "stages/fork module files: 20 KB test target of blank lines (red team)",
            lambda: fork._module_files(target / "tests/t.rs"),
        )  # type: ignore[attr-defined]
    timed(
        "registry/crate_files README usage: 60 KB fenced block of blank lines",
        lambda: _readme_usage("```\n" + "\n" * 60_000 + "```\n"),
    )
    timed("untrusted safe_text: 100 KB of U+0090 (DCS introducers)", lambda: safe_text("\x90" * 100_000))
    timed("clients/cli_tool_help [default: ]: '[default: ' x 10,000", lambda: _DEFAULT.search("[default: " * 10_000))


if __name__ == "__main__":
    main()
