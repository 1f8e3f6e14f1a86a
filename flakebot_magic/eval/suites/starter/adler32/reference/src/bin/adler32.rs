use std::io::Read;

const HELP: &str = "Print the Adler-32 checksum (as zlib computes it) of standard input in hex, like adler32.

Usage: adler32 [OPTIONS]

Options:
  -h, --help   Print help";

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{}  -", format!("{:08x}", adler::adler32_slice(&input)));
}
