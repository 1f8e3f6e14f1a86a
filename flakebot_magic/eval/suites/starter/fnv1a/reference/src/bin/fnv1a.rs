use std::hash::Hasher;
use std::io::Read;

const HELP: &str = "Print the 64-bit FNV-1a hash of standard input as 16 hex digits.

Usage: fnv1a [OPTIONS]

Options:
  -h, --help   Print help";

fn fnv1a(data: &[u8]) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(data);
    hasher.finish()
}

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).expect("read standard input");
    println!("{:016x}", fnv1a(&input));
}

#[cfg(test)]
mod tests {
    #[test]
    fn empty_is_the_offset_basis() {
        assert_eq!(super::fnv1a(b""), 0xcbf29ce484222325);
    }
}
