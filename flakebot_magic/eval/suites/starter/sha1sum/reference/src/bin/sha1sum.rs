use sha1::{Digest, Sha1};
use std::io::Read;

const HELP: &str = "Print the SHA-1 of standard input in hex, like sha1sum.

Usage: sha1sum [OPTIONS]

Options:
  -h, --help   Print help";

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{}  -", format!("{:x}", Sha1::digest(&input)));
}
