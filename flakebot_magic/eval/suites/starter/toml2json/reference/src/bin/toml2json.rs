use std::io::Read;

const HELP: &str = "Convert TOML on standard input to JSON on standard output.

Usage: toml2json [OPTIONS]

Dates and times become strings in RFC 3339 form.

Options:
  -h, --help   Print help";

fn to_json(value: toml::Value) -> serde_json::Value {
    match value {
        toml::Value::String(s) => serde_json::Value::String(s),
        toml::Value::Integer(i) => serde_json::Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map(serde_json::Value::Number).unwrap_or(serde_json::Value::Null),
        toml::Value::Boolean(b) => serde_json::Value::Bool(b),
        toml::Value::Datetime(d) => serde_json::Value::String(d.to_string()),
        toml::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(to_json).collect()),
        toml::Value::Table(table) => {
            serde_json::Value::Object(table.into_iter().map(|(k, v)| (k, to_json(v))).collect())
        }
    }
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    match input.parse::<toml::Value>() {
        Ok(value) => println!("{}", serde_json::to_string_pretty(&to_json(value)).expect("write JSON")),
        Err(e) => {
            eprintln!("toml2json: {}", e);
            std::process::exit(1);
        }
    }
}
