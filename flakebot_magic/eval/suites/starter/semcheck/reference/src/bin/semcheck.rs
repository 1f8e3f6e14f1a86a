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
