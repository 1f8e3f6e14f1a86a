use sha2::{Digest, Sha256};
use std::io::Read;

const HELP: &str = "Print the SHA-256 of standard input, like sha256sum.

Usage: sha256 [OPTIONS]

Options:
  -h, --help   Print help";

fn hex_digest(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{}  -", hex_digest(&input));
}
