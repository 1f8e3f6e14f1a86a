"""Scripted edit sessions for the fake OpenAI server, and the tiny crate they edit.

These are scripts, not a model's output: each is the exact sequence of
assistant replies a test double sends back. The sha256 sessions are also kept
as JSON in ``flakebot_magic/testing/scripts/`` (for the command line and the notebook);
regenerate them after editing this file with ``python tests/editscripts.py``.
"""

from __future__ import annotations

import json
from typing import Any

from tinycrates import Crate, crate

from flakebot_magic.testing import REPLAY_SCRIPTS

__all__ = ["SHA256", "SHA256_UPPER", "TINYHEX", "TINYHEX_MAIN", "call", "reply", "tinyhex_done", "write_scripts"]

SCRIPTS = REPLAY_SCRIPTS


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call as the OpenAI API shapes it (``arguments`` is a JSON string)."""
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def reply(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    """An assistant message carrying ``calls``, with ids."""
    numbered = [{**c, "id": f"call_{i}"} for i, c in enumerate(calls)]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if numbered:
        message["tool_calls"] = numbered
    return message


# -- sha2: a library becomes `sha256`, a sha256sum look-alike ------------------

SHA256_CONTRACT = '[package.metadata.flakebot]\nkind = "cli"\nbin = "sha256"\n\n[package.metadata.docs.rs]'

SHA256_HEAD = """use sha2::{Digest, Sha256};
use std::io::Read;

const HELP: &str = "Usage: sha256 [--help]
Prints the SHA-256 of its standard input in hex, like sha256sum.";
"""

SHA256_BROKEN = (
    SHA256_HEAD
    + """
fn hex_digest(data: &[u8]) -> String {
    Sha256::digest(data)
}

fn main() {
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{}  -", hex_digest(&input));
}
"""
)

SHA256_MAIN = """
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{}  -", hex_digest(&input));
}
"""

SHA256_TESTS = """
#[cfg(test)]
mod tests {
    #[test]
    fn empty_input() {
        assert_eq!(
            super::hex_digest(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn abc() {
        assert_eq!(
            super::hex_digest(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
"""

SHA256_FIXED = (
    SHA256_HEAD
    + """
fn hex_digest(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}
"""
    + SHA256_MAIN
    + SHA256_TESTS
)

SHA256 = [
    reply(
        call("list_files", path="src"),
        call("replace_in_file", path="Cargo.toml", search="[package.metadata.docs.rs]", replace=SHA256_CONTRACT),
        call("write_file", path="src/bin/sha256.rs", content=SHA256_BROKEN),
        call("run_checks"),
        content="sha2 is a library; I add a binary, src/bin/sha256.rs, and the tool contract.",
    ),
    reply(
        call("write_file", path="src/bin/sha256.rs", content=SHA256_FIXED),
        call("finish", summary="sha256: prints the SHA-256 of standard input in hex, like sha256sum"),
    ),
]

# the follow-up: --upper prints the digest in upper case
SHA256_UPPER = [
    reply(
        call(
            "replace_in_file",
            path="src/bin/sha256.rs",
            search='    println!("{}  -", hex_digest(&input));\n}\n',
            replace=(
                "    let digest = hex_digest(&input);\n"
                '    let digest = if args.iter().any(|a| a == "--upper") { digest.to_uppercase() } else { digest };\n'
                '    println!("{}  -", digest);\n}\n'
            ),
        ),
        call(
            "replace_in_file",
            path="src/bin/sha256.rs",
            search="Usage: sha256 [--help]",
            replace="Usage: sha256 [--upper] [--help]\n  --upper  print the digest in upper case",
        ),
        call(
            "replace_in_file",
            path="src/bin/sha256.rs",
            search="    #[test]\n    fn abc() {",
            replace=(
                "    #[test]\n    fn upper_is_hex_in_capitals() {\n"
                '        assert_eq!(super::hex_digest(b"").to_uppercase().len(), 64);\n    }\n\n'
                "    #[test]\n    fn abc() {"
            ),
        ),
        call("finish", summary="sha256 --upper prints the digest in upper case"),
    ),
]


# -- tinyhex: a tiny library crate (no dependencies) for the loop's unit tests ----

TINYHEX_LIB = """//! Hex encoding.

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{:02x}", b)).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_of_bytes() {
        assert_eq!(super::to_hex(&[0, 255, 16]), "00ff10");
    }
}
"""

TINYHEX: Crate = crate(
    "tinyhex",
    description="Hex encoding of bytes",
    files={"src/lib.rs": TINYHEX_LIB, "README.md": "# tinyhex\n\nHex-encode bytes.\n"},
)

TINYHEX_CONTRACT = call(
    "replace_in_file",
    path="Cargo.toml",
    search='license = "MIT"\n',
    replace='license = "MIT"\n\n[package.metadata.flakebot]\nkind = "cli"\nbin = "tinyhex"\n',
)

TINYHEX_MAIN = """use std::io::Read;

const HELP: &str = "Usage: tinyhex
Prints its standard input as hex.";

fn main() {
    if std::env::args().any(|a| a == "--help") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).unwrap();
    println!("{}", tinyhex::to_hex(&input));
}

#[cfg(test)]
mod tests {
    #[test]
    fn help_mentions_standard_input() {
        assert!(super::HELP.contains("standard input"));
    }
}
"""


def tinyhex_done(summary: str = "tinyhex prints its standard input as hex") -> list[dict[str, Any]]:
    """Two replies that make tinyhex a green CLI and finish."""
    return [
        reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=TINYHEX_MAIN)),
        reply(call("finish", summary=summary)),
    ]


def in_text(message: dict[str, Any], dialect: str = "qwen") -> dict[str, Any]:
    """A reply whose calls the fake server writes into its text in ``dialect``, as a model without function calling."""
    return {**message, "dialect": dialect}


#: the follow-up again, as a model that writes its calls as text (--tool-format text)
SHA256_UPPER_TEXT = [in_text(message) for message in SHA256_UPPER]


def write_scripts() -> None:
    scripts = {"sha256": SHA256, "sha256-upper": SHA256_UPPER, "sha256-upper-text": SHA256_UPPER_TEXT}
    for name, script in scripts.items():
        (SCRIPTS / f"{name}.json").write_text(json.dumps({"responses": script}, indent=2) + "\n")


if __name__ == "__main__":
    write_scripts()
