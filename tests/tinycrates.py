"""Tiny crates written from Python into a cargo directory registry, and helpers for tests that run them.

A cargo ``directory`` source is a directory of unpacked crates, one
``<name>-<version>/`` each. Cargo refuses a crate without a
``.cargo-checksum.json`` ("No such file or directory"); ``{"files": {}}``
is enough, and without a ``package`` checksum the lock file records none.

The crates have no dependencies outside this registry and build in about a
second. Import what you need (``tests/`` is on ``sys.path`` because it has a
conftest and no ``__init__.py``)::

    from tinycrates import CRATES, write_registry
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakebot_magic.events import EventBus

__all__ = [
    "CRATES",
    "Crate",
    "Recorder",
    "crate",
    "process_group",
    "processes_in",
    "write_crate",
    "write_registry",
]


@dataclass(frozen=True)
class Crate:
    """One crate at one version: its Cargo.toml and its other files, as text."""

    name: str
    version: str
    manifest: str
    files: Mapping[str, str] = field(default_factory=dict)
    #: the ``package`` entry of .cargo-checksum.json (``cargo vendor`` writes the .crate sha256)
    package_checksum: str | None = None

    @property
    def dirname(self) -> str:
        return f"{self.name}-{self.version}"


def _manifest(name: str, version: str, body: str = "", *, description: str = "", keywords: Iterable[str] = ()) -> str:
    words = ", ".join(f'"{k}"' for k in keywords)
    head = f'[package]\nname = "{name}"\nversion = "{version}"\nedition = "2021"\n'
    head += f'description = "{description}"\nlicense = "MIT"\n'
    if words:
        head += f"keywords = [{words}]\n"
    return head + body


_TINYECHO_MAIN = r"""use std::io::{Read, Write};

const HELP: &str = "Usage: tinyecho [WORDS]...
Prints its words. With no words, reads standard input and prints it in upper case.
  --fail     exit with status 3
  --sleep    sleep for a minute";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--help") | Some("-h") => println!("{}", HELP),
        Some("--fail") => {
            eprintln!("tinyecho: failing as asked");
            std::process::exit(3);
        }
        Some("--sleep") => std::thread::sleep(std::time::Duration::from_secs(60)),
        Some(_) => println!("{}", args.join(" ")),
        None => {
            let mut input = Vec::new();
            std::io::stdin().read_to_end(&mut input).unwrap();
            std::io::stdout().write_all(&shout(&input)).unwrap();
        }
    }
}

fn shout(input: &[u8]) -> Vec<u8> {
    input.to_ascii_uppercase()
}

#[cfg(test)]
mod tests {
    #[test]
    fn shouts() {
        assert_eq!(super::shout(b"hi"), b"HI");
    }
}
"""

#: every crate the tests know; ``write_registry`` writes any subset
CRATES: dict[str, Crate] = {
    c.name: c
    for c in [
        Crate(
            "tinyecho",
            "0.2.0",
            _manifest(
                "tinyecho", "0.2.0", description="Echo words, or shout standard input", keywords=["echo", "shout"]
            ),
            {
                "src/main.rs": _TINYECHO_MAIN,
                "README.md": "# tinyecho\n\nA tiny echo for flakebot's tests; it is as loud as a zebra.\n",
                # a published .gitignore must not keep files out of the workspace history
                ".gitignore": "/target\nCargo.lock\n/data/\n",
                "data/sample.txt": "published data that the crate's own .gitignore names\n",
            },
        ),
        Crate(
            "tinylib",
            "0.1.3",
            _manifest(
                "tinylib", "0.1.3", description="Uppercase helper library for text", keywords=["uppercase", "text"]
            ),
            {
                "src/lib.rs": "pub fn shout(s: &str) -> String {\n    s.to_uppercase()\n}\n",
                "README.md": "# tinylib\n\nUppercase text. Uppercase it all: uppercase strings, uppercase words.\n",
            },
        ),
        Crate(
            "brokenbin",
            "0.1.0",
            _manifest("brokenbin", "0.1.0", description="A binary that does not compile"),
            {"src/main.rs": 'fn main() {\n    let n: u32 = "not a number";\n    println!("{}", n);\n}\n'},
        ),
        Crate(
            "failingtest",
            "0.1.0",
            _manifest("failingtest", "0.1.0", description="A binary whose tests fail"),
            {
                "src/main.rs": (
                    'fn main() {\n    println!("{}", add(2, 2));\n}\n\n'
                    "fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n\n"
                    "#[cfg(test)]\nmod tests {\n"
                    "    #[test]\n    fn adds() {\n        assert_eq!(super::add(2, 2), 4);\n    }\n\n"
                    "    #[test]\n    fn breaks_on_purpose() {\n        assert_eq!(super::add(1, 1), 3);\n    }\n}\n"
                ),
            },
        ),
        Crate(
            "brokentest",
            "0.1.0",
            _manifest("brokentest", "0.1.0", description="A binary whose tests do not compile"),
            {
                "src/main.rs": 'fn main() {\n    println!("fine");\n}\n',
                "tests/it.rs": "#[test]\nfn typo() {\n    let s: String = 42;\n    assert!(s.is_empty());\n}\n",
            },
        ),
        Crate(
            "needsdev",
            "0.1.0",
            # comments and layout that a format-preserving edit keeps
            "# needsdev: a bin crate whose tests want a crate the registry lacks\n"
            '[package]\nname = "needsdev"  # the name\nversion = "0.1.0"\nedition = "2021"\n'
            'description = "A binary with a dev-dependency the registry lacks"\nlicense = "MIT"\n'
            "\n# used by tests/uses_missing.rs and examples/demo.rs only\n"
            '[dev-dependencies]\nmissingcrate = "1.0"  # not in the registry\n'
            "\n[profile.release]\n# keep the tests fast\nopt-level = 1\n",
            {
                "src/main.rs": 'fn main() {\n    println!("needsdev");\n}\n',
                "tests/uses_missing.rs": "use missingcrate::x;\n\n#[test]\nfn uses_it() {\n    x();\n}\n",
                "tests/plain.rs": "#[test]\nfn plain_works() {\n    assert_eq!(1 + 1, 2);\n}\n",
                "examples/demo.rs": "fn main() {\n    missingcrate::x();\n}\n",
            },
        ),
        Crate(
            "lockpinned",
            "0.1.0",
            _manifest(
                "lockpinned",
                "0.1.0",
                '\n[dependencies]\ntinylib = "0.1"\n',
                description="A binary whose lock pins an old tinylib",
            ),
            {
                "src/main.rs": 'fn main() {\n    println!("{}", tinylib::shout("pinned"));\n}\n',
                "Cargo.lock": (
                    "# This file is automatically @generated by Cargo.\n"
                    "# It is not intended for manual editing.\nversion = 3\n\n"
                    '[[package]]\nname = "lockpinned"\nversion = "0.1.0"\ndependencies = [\n "tinylib",\n]\n\n'
                    '[[package]]\nname = "tinylib"\nversion = "0.1.0"\n'
                    'source = "registry+https://github.com/rust-lang/crates.io-index"\n'
                ),
            },
        ),
        Crate(
            "slowbuild",
            "0.1.0",
            _manifest("slowbuild", "0.1.0", description="A binary whose build script takes a minute"),
            {
                "src/main.rs": 'fn main() {\n    println!("slow");\n}\n',
                "build.rs": (
                    "fn main() {\n"
                    '    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();\n'
                    '    std::fs::write(format!("{}/build-script-started", dir), "").ok();\n'  # read-only in the release build
                    "    std::thread::sleep(std::time::Duration::from_secs(60));\n}\n"
                ),
            },
        ),
    ]
}


def crate(
    name: str,
    version: str = "0.1.0",
    *,
    description: str = "",
    manifest: str = "",
    files: Mapping[str, str] | None = None,
    package_checksum: str | None = None,
) -> Crate:
    """An ad-hoc crate: ``crate("x", files={"src/main.rs": ...})`` (a library by default)."""
    return Crate(
        name,
        version,
        manifest or _manifest(name, version, description=description),
        dict(files or {"src/lib.rs": ""}),
        package_checksum,
    )


def write_crate(registry: Path, spec: Crate) -> Path:
    """Write one crate into ``registry/<name>-<version>/``; return that directory."""
    root = registry / spec.dirname
    root.mkdir(parents=True, exist_ok=True)
    (root / "Cargo.toml").write_text(spec.manifest)
    for rel, text in spec.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / ".cargo-checksum.json").write_text(json.dumps({"files": {}, "package": spec.package_checksum}))
    return root


def write_registry(root: Path, crates: Iterable[Crate | str] | None = None) -> Path:
    """A cargo directory registry at ``root`` holding ``crates`` (names from CRATES, or Crate objects).

    By default it holds every crate in :data:`CRATES`.
    """
    root.mkdir(parents=True, exist_ok=True)
    for spec in CRATES.values() if crates is None else crates:
        write_crate(root, CRATES[spec] if isinstance(spec, str) else spec)
    return root


class Recorder:
    """A pipeline observer that keeps every event, and an EventBus that feeds it."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.bus = EventBus([self.events.append])

    def __call__(self, event: Any) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def processes_in(directory: Path, *, settle: float = 2.0) -> list[int]:
    """Pids of live processes whose working directory is ``directory`` or below it.

    Waits up to ``settle`` seconds for killed processes to be reaped, so a
    non-empty answer means something was left running.
    """
    directory = directory.resolve()
    deadline = time.monotonic() + settle
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cwd = Path(os.readlink(f"/proc/{entry}/cwd"))
                with open(f"/proc/{entry}/stat") as stat:
                    state = stat.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and (cwd == directory or directory in cwd.parents):
                found.append(int(entry))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def process_group(pgid: int, *, settle: float = 2.0) -> list[int]:
    """Pids of live (not zombie) processes in process group ``pgid``, after up to ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # after the command name: state, ppid, pgrp
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(entry))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
