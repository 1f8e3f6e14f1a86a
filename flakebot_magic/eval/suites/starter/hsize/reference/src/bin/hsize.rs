extern crate humansize;

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
