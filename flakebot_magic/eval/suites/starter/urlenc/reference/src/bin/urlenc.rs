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
