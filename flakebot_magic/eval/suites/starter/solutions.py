"""The starter suite's solution scripts: the replies a replay serves for each task, written as Rust source here.

Each task's ``solution.json`` is generated from this file (``python flakebot_magic/eval/suites/starter/solutions.py``);
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


def solution(
    binary: str,
    source: str,
    *,
    dependencies: str = "",
    note: str = "",
    fix: list[dict[str, Any]] | None = None,
    fix_note: str = "",
    summary: str = "",
) -> list[dict[str, Any]]:
    """The contract and the binary, then run the checks; ``fix`` (edits) and the checks again; then finish."""
    replies = [
        reply(
            contract(binary, dependencies),
            call("write_file", path=f"src/bin/{binary}.rs", content=source.lstrip("\n")),
            call("run_checks"),
            content=note or f"I add a binary, src/bin/{binary}.rs, and the tool contract.",
        )
    ]
    if fix:
        replies.append(reply(*fix, call("run_checks"), content=fix_note or None))
    return [*replies, reply(call("finish", summary=summary or f"{binary}: done"))]


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


# -- hashes and checksums ----------------------------------------------------------------------

SHA256_HEAD = """use sha2::{Digest, Sha256};
use std::io::Read;

const HELP: &str = "Print the SHA-256 of standard input, like sha256sum.

Usage: sha256 [OPTIONS]

Options:
  -h, --help   Print help";
"""

SHA256_MAIN = """
fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{}  -", hex_digest(&input));
}
"""

# the first try does not compile (a digest is not a String); the compiler's report leads to the fix
SOLUTIONS["sha256"] = [
    reply(
        call("list_files", path="src"),
        contract("sha256"),
        call(
            "write_file",
            path="src/bin/sha256.rs",
            content=SHA256_HEAD
            + "\nfn hex_digest(data: &[u8]) -> String {\n    Sha256::digest(data)\n}\n"
            + SHA256_MAIN,
        ),
        call("run_checks"),
        content="sha2 is a library; I add src/bin/sha256.rs and the tool contract.",
    ),
    reply(
        call(
            "replace_in_file",
            path="src/bin/sha256.rs",
            search="    Sha256::digest(data)\n",
            replace='    format!("{:x}", Sha256::digest(data))\n',
        ),
        call(
            "write_file",
            path="tests/sha256_cli.rs",
            content='#[test]\nfn abc() {\n    use sha2::{Digest, Sha256};\n    assert_eq!(\n        format!("{:x}", Sha256::digest(b"abc")),\n        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"\n    );\n}\n',
        ),
        call("run_checks"),
    ),
    reply(call("finish", summary="sha256: the SHA-256 of standard input, like sha256sum")),
]


def digest_tool(binary: str, what: str, use: str, expression: str) -> str:
    """A command that prints ``expression`` (of ``input``, the bytes read) and ``  -``, like the coreutils."""
    return f"""
{use}
use std::io::Read;

const HELP: &str = "Print the {what} of standard input in hex, like {binary}.

Usage: {binary} [OPTIONS]

Options:
  -h, --help   Print help";

fn main() {{
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {{
        println!("{{}}", HELP);
        return;
    }}
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{{}}  -", {expression});
}}
"""


SOLUTIONS["sha1sum"] = solution(
    "sha1sum", digest_tool("sha1sum", "SHA-1", "use sha1::{Digest, Sha1};", 'format!("{:x}", Sha1::digest(&input))')
)
SOLUTIONS["crc32"] = solution(
    "crc32",
    digest_tool("crc32", "CRC-32 (IEEE, as zlib computes it)", "", 'format!("{:08x}", crc32fast::hash(&input))'),
)
SOLUTIONS["adler32"] = solution(
    "adler32",
    digest_tool(
        "adler32", "Adler-32 checksum (as zlib computes it)", "", 'format!("{:08x}", adler::adler32_slice(&input))'
    ),
)

SOLUTIONS["fnv1a"] = solution(
    "fnv1a",
    r"""
use std::hash::Hasher;
use std::io::Read;

const HELP: &str = "Print the 64-bit FNV-1a hash of standard input as 16 hex digits.

Usage: fnv1a [OPTIONS]

Options:
  -h, --help   Print help";

fn fnv1a(data: &[u8]) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(data);
    hasher.finish()
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{:016x}", fnv1a(&input));
}

#[cfg(test)]
mod tests {
    #[test]
    fn empty_is_the_offset_basis() {
        assert_eq!(super::fnv1a(b""), 0xcbf29ce484222325);
    }
}
""",
)

# -- encodings ---------------------------------------------------------------------------------

B64 = r"""
use std::io::{Read, Write};

const HELP: &str = "Base64-encode standard input, or decode it.

Usage: b64 [OPTIONS]

Options:
  -d, --decode     Decode base64 from standard input (whitespace is ignored)
  -u, --url-safe   Use the URL-safe alphabet (- and _ instead of + and /)
  -h, --help       Print help";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |long: &str, short: &str| args.iter().any(|a| a == long || a == short);
    if has("--help", "-h") {
        println!("{}", HELP);
        return;
    }
    let config = if has("--url-safe", "-u") { base64::URL_SAFE } else { base64::STANDARD };
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    if has("--decode", "-d") {
        let text: String = String::from_utf8_lossy(&input).split_whitespace().collect();
        match base64::decode_config(text, config) {
            Ok(bytes) => std::io::stdout().write_all(&bytes).expect("write standard output"),
            Err(e) => {
                eprintln!("b64: {}", e);
                std::process::exit(1);
            }
        }
    } else {
        println!("{}", base64::encode_config(&input, config));
    }
}
"""

# base64 0.13 as published denies every warning, and today's rustc warns of its `cargo-clippy` cfg:
# the crate does not build until that is relaxed (what upstream did in later versions)
SOLUTIONS["b64"] = solution(
    "b64",
    B64,
    note="base64 has encode and decode; a binary puts them on standard input.",
    fix=[
        call(
            "replace_in_file",
            path="src/lib.rs",
            search='#![cfg_attr(feature = "cargo-clippy", allow(clippy::cast_lossless))]\n',
            replace="#![allow(clippy::cast_lossless)]\n",
        ),
        call(
            "replace_in_file",
            path="src/lib.rs",
            search="    variant_size_differences,\n    warnings\n)]",
            replace="    variant_size_differences\n)]",
        ),
    ],
    fix_note="The library denies all warnings, and this rustc warns about its cfg: I relax both.",
    summary="b64: base64 encode and decode, standard and URL-safe",
)

SOLUTIONS["b32"] = solution(
    "b32",
    r"""
use std::io::{Read, Write};

const HELP: &str = "Base32-encode standard input (RFC 4648, with padding), or decode it.

Usage: b32 [OPTIONS]

Options:
  -d, --decode   Decode base32 from standard input (whitespace is ignored)
  -h, --help     Print help";

const ALPHABET: base32::Alphabet = base32::Alphabet::RFC4648 { padding: true };

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
        match base32::decode(ALPHABET, &text) {
            Some(bytes) => std::io::stdout().write_all(&bytes).expect("write standard output"),
            None => {
                eprintln!("b32: not base32");
                std::process::exit(1);
            }
        }
    } else {
        println!("{}", base32::encode(ALPHABET, &input));
    }
}
""",
)

SOLUTIONS["urlenc"] = solution(
    "urlenc",
    r"""
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::io::Read;

const HELP: &str = "Percent-encode standard input for a URL, or decode it.

Usage: urlenc [OPTIONS]

Every byte of the UTF-8 text but A-Z a-z 0-9 - . _ ~ is written as %XX. One trailing newline
of the input is ignored.

Options:
  -d, --decode   Decode %XX sequences instead
  -h, --help     Print help";

/// RFC 3986's unreserved characters stay as they are
const ENCODED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input as UTF-8");
    let text = input.strip_suffix('\n').unwrap_or(&input);
    if args.iter().any(|a| a == "--decode" || a == "-d") {
        match percent_decode_str(text).decode_utf8() {
            Ok(decoded) => println!("{}", decoded),
            Err(e) => {
                eprintln!("urlenc: {}", e);
                std::process::exit(1);
            }
        }
    } else {
        println!("{}", utf8_percent_encode(text, ENCODED));
    }
}
""",
)

# -- text --------------------------------------------------------------------------------------

SOLUTIONS["wrap"] = solution(
    "wrap",
    r"""
use std::io::Read;
use textwrap::{Options, WrapAlgorithm};

const HELP: &str = "Wrap the text on standard input to a width, paragraph by paragraph.

Usage: wrap [OPTIONS]

Words are filled greedily (first fit); paragraphs are separated by blank lines, which are kept.

Options:
  -w, --width <N>   The largest number of columns on a line [default: 80]
  -h, --help        Print help";

fn fill(text: &str, width: usize) -> String {
    text.split("\n\n")
        .map(|paragraph| {
            let words = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
            textwrap::fill(&words, Options::new(width).wrap_algorithm(WrapAlgorithm::FirstFit))
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut width = 80;
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--width" || args[i] == "-w" {
            width = args.get(i + 1).and_then(|w| w.parse().ok()).unwrap_or_else(|| {
                eprintln!("wrap: --width needs a number");
                std::process::exit(2);
            });
            i += 1;
        } else if let Some(w) = args[i].strip_prefix("--width=") {
            width = w.parse().expect("--width needs a number");
        }
        i += 1;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    println!("{}", fill(input.trim_end(), width));
}

#[cfg(test)]
mod tests {
    #[test]
    fn fills_first_fit() {
        assert_eq!(super::fill("aaa bb cc ddddd", 6), "aaa bb\ncc\nddddd");
    }
}
""",
)

SOLUTIONS["width"] = solution(
    "width",
    r"""
extern crate unicode_width; // the crate is edition 2015

use std::io::Read;
use unicode_width::UnicodeWidthStr;

const HELP: &str = "Print the display width (terminal columns) of each line of standard input.

Usage: width [OPTIONS]

East Asian wide and fullwidth characters take two columns, combining marks none.

Options:
  -h, --help   Print help";

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input as UTF-8");
    for line in input.lines() {
        println!("{}", UnicodeWidthStr::width(line));
    }
}
""",
)

SOLUTIONS["caseconv"] = solution(
    "caseconv",
    r"""
use heck::{ToKebabCase, ToLowerCamelCase, ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};
use std::io::Read;

const HELP: &str = "Convert each line of standard input to another case.

Usage: caseconv --to <CASE>

Options:
  -t, --to <CASE>   snake, kebab, camel (lowerCamel), pascal (UpperCamel) or shouty (SHOUTY_SNAKE)
  -h, --help        Print help";

fn convert(text: &str, case: &str) -> Option<String> {
    Some(match case {
        "snake" => text.to_snake_case(),
        "kebab" => text.to_kebab_case(),
        "camel" => text.to_lower_camel_case(),
        "pascal" => text.to_upper_camel_case(),
        "shouty" => text.to_shouty_snake_case(),
        _ => return None,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let case = args
        .iter()
        .position(|a| a == "--to" || a == "-t")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--to=").map(str::to_owned)))
        .unwrap_or_else(|| "snake".to_owned());
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    for line in input.lines() {
        match convert(line, &case) {
            Some(converted) => println!("{}", converted),
            None => {
                eprintln!("caseconv: unknown case {:?}; use snake, kebab, camel, pascal or shouty", case);
                std::process::exit(2);
            }
        }
    }
}
""",
)

SOLUTIONS["shsplit"] = solution(
    "shsplit",
    r"""
use std::io::Read;

const HELP: &str = "Split a command line into words as a POSIX shell would (quotes and backslashes).

Usage: shsplit [OPTIONS]

Reads one command line from standard input and prints each word on a line of its own.
Exits with status 1 when the quoting is not closed.

Options:
  -h, --help   Print help";

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    match shlex::split(input.trim_end_matches('\n')) {
        Some(words) => {
            for word in words {
                println!("{}", word);
            }
        }
        None => {
            eprintln!("shsplit: unbalanced quoting");
            std::process::exit(1);
        }
    }
}
""",
)

# the first try's own test expects the wrong distance; the failing test leads to the fix
EDITDIST_HEAD = r"""
const HELP: &str = "Print the edit distance between two strings.

Usage: editdist [OPTIONS] <A> <B>

Options:
  -a, --algorithm <NAME>   levenshtein, damerau (Damerau-Levenshtein) or osa (optimal string alignment)
                           [default: levenshtein]
  -h, --help               Print help";

fn distance(algorithm: &str, a: &str, b: &str) -> Option<usize> {
    match algorithm {
        "levenshtein" => Some(strsim::levenshtein(a, b)),
        "damerau" => Some(strsim::damerau_levenshtein(a, b)),
        "osa" => Some(strsim::osa_distance(a, b)),
        _ => None,
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut algorithm = "levenshtein".to_owned();
    if let Some(i) = args.iter().position(|a| a == "--algorithm" || a == "-a") {
        if i + 1 < args.len() {
            algorithm = args.remove(i + 1);
        }
        args.remove(i);
    } else if let Some(i) = args.iter().position(|a| a.starts_with("--algorithm=")) {
        algorithm = args.remove(i)["--algorithm=".len()..].to_owned();
    }
    if args.len() != 2 {
        eprintln!("editdist: give two strings");
        std::process::exit(2);
    }
    match distance(&algorithm, &args[0], &args[1]) {
        Some(d) => println!("{}", d),
        None => {
            eprintln!("editdist: unknown algorithm {:?}", algorithm);
            std::process::exit(2);
        }
    }
}
"""

SOLUTIONS["editdist"] = solution(
    "editdist",
    EDITDIST_HEAD
    + '\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn kitten_sitting() {\n        assert_eq!(super::distance("levenshtein", "kitten", "sitting"), Some(2));\n    }\n}\n',
    note="strsim has the distances; a binary chooses one.",
    fix=[
        call(
            "replace_in_file",
            path="src/bin/editdist.rs",
            search='"kitten", "sitting"), Some(2));',
            replace='"kitten", "sitting"), Some(3));',
        )
    ],
    fix_note="kitten -> sitting takes three edits (k->s, e->i, +g): my test was wrong, not the code.",
    summary="editdist: Levenshtein, Damerau-Levenshtein and OSA distances",
)

# -- formats -----------------------------------------------------------------------------------

SOLUTIONS["csvcol"] = solution(
    "csvcol",
    r"""
use csv_core::{ReadFieldResult, Reader};
use std::io::Read;

const HELP: &str = "Print one column of a CSV file (with a header row) from standard input.

Usage: csvcol --column <NAME>

Prints the column's value in each record, one per line (quotes removed).
Exits with status 1 when no column has that name.

Options:
  -c, --column <NAME>   The column's name in the header row
  -h, --help            Print help";

/// Every record of `data`, each a list of its fields, unquoted.
fn records(data: &[u8]) -> Vec<Vec<String>> {
    let mut reader = Reader::new();
    let mut input = data;
    let mut buffer = [0u8; 4096];
    let (mut records, mut record, mut field) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        let (result, read, written) = reader.read_field(input, &mut buffer);
        input = &input[read..];
        field.extend_from_slice(&buffer[..written]);
        match result {
            ReadFieldResult::InputEmpty | ReadFieldResult::OutputFull => {}
            ReadFieldResult::Field { record_end } => {
                record.push(String::from_utf8_lossy(&field).into_owned());
                field.clear();
                if record_end {
                    records.push(std::mem::take(&mut record));
                }
            }
            ReadFieldResult::End => return records,
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let name = args
        .iter()
        .position(|a| a == "--column" || a == "-c")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--column=").map(str::to_owned)))
        .unwrap_or_else(|| {
            eprintln!("csvcol: give --column NAME");
            std::process::exit(2);
        });
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    let all = records(&input);
    let index = match all.first().and_then(|header| header.iter().position(|h| *h == name)) {
        Some(index) => index,
        None => {
            eprintln!("csvcol: no column {:?}", name);
            std::process::exit(1);
        }
    };
    for record in &all[1..] {
        println!("{}", record.get(index).map(String::as_str).unwrap_or(""));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quoted_fields() {
        let all = super::records(b"a,b\n\"x, y\",\"say \"\"hi\"\"\"\n");
        assert_eq!(all, vec![vec!["a", "b"], vec!["x, y", "say \"hi\""]]);
    }
}
""",
)

SOLUTIONS["thousands"] = solution(
    "thousands",
    r"""
use num_format::{Locale, ToFormattedString};
use std::io::Read;

const HELP: &str = "Write each integer on standard input with thousands separators.

Usage: thousands [OPTIONS]

Options:
  -l, --locale <NAME>   The locale whose separators to use, e.g. en (1,234,567) or de (1.234.567)
                        [default: en]
  -h, --help            Print help";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let name = args
        .iter()
        .position(|a| a == "--locale" || a == "-l")
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| "en".to_owned());
    let locale = match Locale::from_name(&name) {
        Ok(locale) => locale,
        Err(_) => {
            eprintln!("thousands: unknown locale {:?}", name);
            std::process::exit(2);
        }
    };
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    for line in input.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match line.parse::<i64>() {
            Ok(n) => println!("{}", n.to_formatted_string(&locale)),
            Err(_) => {
                eprintln!("thousands: not an integer: {:?}", line);
                std::process::exit(1);
            }
        }
    }
}
""",
)

TOML2JSON = r"""
use std::io::Read;

const HELP: &str = "Convert TOML on standard input to JSON on standard output.

Usage: toml2json [OPTIONS]

Dates and times become strings in RFC 3339 form.

Options:
  -h, --help   Print help";

fn to_json(value: toml::Value) -> serde_json::Value {
    match value {
        toml::Value::String(s) => serde_json::Value::String(s),
        toml::Value::Integer(i) => serde_json::Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null),
        toml::Value::Boolean(b) => serde_json::Value::Bool(b),
        toml::Value::Datetime(d) => serde_json::Value::String(d.to_string()),
        toml::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(to_json).collect()),
        toml::Value::Table(table) => {
            serde_json::Value::Object(table.into_iter().map(|(k, v)| (k, to_json(v))).collect())
        }
    }
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    match input.parse::<toml::Value>() {
        Ok(value) => println!("{}", serde_json::to_string_pretty(&to_json(value)).expect("write JSON")),
        Err(e) => {
            eprintln!("toml2json: {}", e);
            std::process::exit(1);
        }
    }
}
"""

# the first try forgets the serde_json dependency; the compiler's E0433 leads to adding it
SOLUTIONS["toml2json"] = solution(
    "toml2json",
    TOML2JSON,
    note="toml parses; serde_json writes.",
    fix=[
        call(
            "replace_in_file",
            path="Cargo.toml",
            search='bin = "toml2json"\n',
            replace='bin = "toml2json"\n\n[dependencies.serde_json]\nversion = "1"\n',
        )
    ],
    fix_note="serde_json is not a dependency yet: I add it.",
    summary="toml2json: TOML to pretty JSON",
)

SOLUTIONS["semcheck"] = solution(
    "semcheck",
    r"""
use semver::{Version, VersionReq};
use std::io::Read;

const HELP: &str = "Print the versions on standard input that match a semver requirement.

Usage: semcheck <REQUIREMENT>

Reads one version a line (e.g. 1.2.3 or 2.0.0-rc.1) and prints those the requirement (e.g.
'>=1.2, <2' or '^0.3') matches, in input order, as cargo would match them. A line that is
not a version is reported on standard error and skipped. Exits with status 2 when the
requirement cannot be parsed.

Options:
  -h, --help   Print help";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") || args.is_empty() {
        println!("{}", HELP);
        return;
    }
    let requirement = match VersionReq::parse(&args[0]) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("semcheck: {}", e);
            std::process::exit(2);
        }
    };
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    for line in input.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match Version::parse(line) {
            Ok(version) if requirement.matches(&version) => println!("{}", line),
            Ok(_) => {}
            Err(e) => eprintln!("semcheck: {:?}: {}", line, e),
        }
    }
}
""",
)

SOLUTIONS["uuidfmt"] = solution(
    "uuidfmt",
    r"""
use std::io::Read;

const HELP: &str = "Normalise UUIDs: each line of standard input becomes its hyphenated lower-case form.

Usage: uuidfmt [OPTIONS]

Accepts the hyphenated, simple (32 hex digits), braced and urn:uuid: forms, in any case.
Prints the UUID and its version (v4 ...); a line that is no UUID prints 'invalid'.

Options:
  -h, --help   Print help";

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    for line in input.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match uuid::Uuid::parse_str(line) {
            Ok(id) => println!("{} v{}", id.hyphenated(), id.get_version_num()),
            Err(_) => println!("invalid"),
        }
    }
}
""",
)

HSIZE = r"""
use humansize::{file_size_opts as options, FileSize};
use std::io::Read;

const HELP: &str = "Print byte counts in a human-friendly form (1.50 KB).

Usage: hsize [OPTIONS]

Reads one number of bytes a line.

Options:
  -b, --binary   Use multiples of 1024 and KiB, MiB, ... (default: 1000 and KB, MB, ...)
  -h, --help     Print help";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let binary = args.iter().any(|a| a == "--binary" || a == "-b");
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    for line in input.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bytes: u64 = match line.parse() {
            Ok(n) => n,
            Err(_) => {
                eprintln!("hsize: not a number of bytes: {:?}", line);
                std::process::exit(1);
            }
        };
        let shown = if binary { bytes.file_size(options::BINARY) } else { bytes.file_size(options::DECIMAL) };
        println!("{}", shown.expect("a size"));
    }
}
"""

# humansize is a Rust 2015 crate: a `use` of it from a binary needs `extern crate` first; the
# compiler's E0432 says so, and the second try adds it
SOLUTIONS["hsize"] = solution(
    "hsize",
    HSIZE,
    note="humansize formats sizes; a binary reads them from standard input.",
    fix=[
        call(
            "replace_in_file",
            path="src/bin/hsize.rs",
            search="use humansize::",
            replace="extern crate humansize;\n\nuse humansize::",
        )
    ],
    fix_note="The crate is edition 2015: the binary needs `extern crate humansize;`.",
    summary="hsize: human-friendly sizes, decimal or binary",
)


def text(task: str) -> str:
    """The solution.json of ``task``, as written."""
    return json.dumps({"responses": SOLUTIONS[task]}, indent=1) + "\n"


def write(only: list[str] | None = None) -> list[Path]:
    """Write each task's solution.json; return the paths written."""
    written = []
    for task in SOLUTIONS:
        if only and task not in only:
            continue
        path = SUITE / task / "solution.json"
        path.write_text(text(task), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(sys.argv[1:] or None):
        print(path.relative_to(SUITE))
