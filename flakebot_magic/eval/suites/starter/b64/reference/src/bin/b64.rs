use std::io::{Read, Write};

const HELP: &str = "Base64-encode standard input, or decode it.

Usage: b64 [OPTIONS]

Options:
  -d, --decode     Decode base64 from standard input (whitespace is ignored)
  -u, --url-safe   Use the URL-safe alphabet (- and _ instead of + and /)
  -h, --help       Print help";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |long: &str, short: &str| args.iter().any(|a| a == long || a == short);
    if has("--help", "-h") {
        println!("{}", HELP);
        return;
    }
    let config = if has("--url-safe", "-u") { base64::URL_SAFE } else { base64::STANDARD };
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    if has("--decode", "-d") {
        let text: String = String::from_utf8_lossy(&input).split_whitespace().collect();
        match base64::decode_config(text, config) {
            Ok(bytes) => std::io::stdout().write_all(&bytes).expect("write standard output"),
            Err(e) => {
                eprintln!("b64: {}", e);
                std::process::exit(1);
            }
        }
    } else {
        println!("{}", base64::encode_config(&input, config));
    }
}
