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
