use std::io::{Read, Write};

const HELP: &str = "Hex-encode standard input, or decode hex.

Usage: hexenc [OPTIONS]

Reads standard input and prints it as lower-case hex, on one line.

Options:
  -d, --decode   Decode hex from standard input (whitespace is ignored) and write the bytes
  -u, --upper    Print upper-case hex digits
  -h, --help     Print help";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    if args.iter().any(|a| a == "--decode" || a == "-d") {
        let text: String = String::from_utf8_lossy(&input).split_whitespace().collect();
        match hex::decode(text) {
            Ok(bytes) => std::io::stdout().write_all(&bytes).expect("write standard output"),
            Err(e) => {
                eprintln!("hexenc: {}", e);
                std::process::exit(1);
            }
        }
    } else if args.iter().any(|a| a == "--upper" || a == "-u") {
        println!("{}", hex::encode_upper(&input));
    } else {
        println!("{}", hex::encode(&input));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let data = b"\x00\xffhello";
        assert_eq!(hex::decode(hex::encode(data)).unwrap(), data.to_vec());
    }
}
