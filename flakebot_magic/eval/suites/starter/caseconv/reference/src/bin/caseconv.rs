use heck::{ToKebabCase, ToLowerCamelCase, ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};
use std::io::Read;

const HELP: &str = "Convert each line of standard input to another case.

Usage: caseconv --to <CASE>

Options:
  -t, --to <CASE>   snake, kebab, camel (lowerCamel), pascal (UpperCamel) or shouty (SHOUTY_SNAKE)
  -h, --help        Print help";

fn convert(text: &str, case: &str) -> Option<String> {
    Some(match case {
        "snake" => text.to_snake_case(),
        "kebab" => text.to_kebab_case(),
        "camel" => text.to_lower_camel_case(),
        "pascal" => text.to_upper_camel_case(),
        "shouty" => text.to_shouty_snake_case(),
        _ => return None,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let case = args
        .iter()
        .position(|a| a == "--to" || a == "-t")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--to=").map(str::to_owned)))
        .unwrap_or_else(|| "snake".to_owned());
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    for line in input.lines() {
        match convert(line, &case) {
            Some(converted) => println!("{}", converted),
            None => {
                eprintln!("caseconv: unknown case {:?}; use snake, kebab, camel, pascal or shouty", case);
                std::process::exit(2);
            }
        }
    }
}
