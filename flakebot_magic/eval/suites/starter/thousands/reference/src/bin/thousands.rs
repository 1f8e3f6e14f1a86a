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
