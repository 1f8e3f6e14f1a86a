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
