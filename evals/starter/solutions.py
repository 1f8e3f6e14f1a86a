"""The starter suite's solution scripts: the replies a replay serves for each task, written as Rust source here.

Each task's ``solution.json`` is generated from this file (``python evals/starter/solutions.py``);
a test checks that the committed files are what it writes. A solution is what a model could have
sent: it adds the tool contract (and any dependency) to ``Cargo.toml``, writes the binary, runs the
checks, and finishes. It is a script for the fake OpenAI-compatible server, a test double: a replay
of it says so everywhere, and checks the suite and the harness, never a model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SUITE = Path(__file__).resolve().parent


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call as the OpenAI API shapes it (``arguments`` is a JSON string)."""
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def reply(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    """An assistant message carrying ``calls``, with ids."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{**c, "id": f"call_{i}"} for i, c in enumerate(calls)],
    }


def contract(binary: str, dependencies: str = "") -> dict[str, Any]:
    """The edit that declares the tool (and adds ``dependencies``, TOML tables) before ``[package]``."""
    tables = f'[package.metadata.flakebot]\nkind = "cli"\nbin = "{binary}"\n\n{dependencies}'
    return call("replace_in_file", path="Cargo.toml", search="\n[package]\n", replace=f"\n{tables}[package]\n")


def solution(binary: str, source: str, *, dependencies: str = "", note: str = "") -> list[dict[str, Any]]:
    """Two replies: the contract and the binary, then run the checks; then finish."""
    return [
        reply(
            contract(binary, dependencies),
            call("write_file", path=f"src/bin/{binary}.rs", content=source.lstrip("\n")),
            call("run_checks"),
            content=note or f"I add a binary, src/bin/{binary}.rs, and the tool contract.",
        ),
        reply(call("finish", summary=f"{binary}: done")),
    ]


#: task id -> its replies
SOLUTIONS: dict[str, list[dict[str, Any]]] = {}

SOLUTIONS["hexenc"] = solution(
    "hexenc",
    r"""
use std::io::{Read, Write};

const HELP: &str = "Hex-encode standard input, or decode hex.

Usage: hexenc [OPTIONS]

Reads standard input and prints it as lower-case hex, on one line.

Options:
  -d, --decode   Decode hex from standard input (whitespace is ignored) and write the bytes
  -u, --upper    Print upper-case hex digits
  -h, --help     Print help";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    if args.iter().any(|a| a == "--decode" || a == "-d") {
        let text: String = String::from_utf8_lossy(&input).split_whitespace().collect();
        match hex::decode(text) {
            Ok(bytes) => std::io::stdout().write_all(&bytes).expect("write standard output"),
            Err(e) => {
                eprintln!("hexenc: {}", e);
                std::process::exit(1);
            }
        }
    } else if args.iter().any(|a| a == "--upper" || a == "-u") {
        println!("{}", hex::encode_upper(&input));
    } else {
        println!("{}", hex::encode(&input));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let data = b"\x00\xffhello";
        assert_eq!(hex::decode(hex::encode(data)).unwrap(), data.to_vec());
    }
}
""",
)


def write(only: list[str] | None = None) -> list[Path]:
    """Write each task's solution.json; return the paths written."""
    written = []
    for task, replies in SOLUTIONS.items():
        if only and task not in only:
            continue
        path = SUITE / task / "solution.json"
        path.write_text(json.dumps({"responses": replies}, indent=1) + "\n", encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(sys.argv[1:] or None):
        print(path.relative_to(SUITE))
