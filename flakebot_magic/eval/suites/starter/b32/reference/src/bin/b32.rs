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
