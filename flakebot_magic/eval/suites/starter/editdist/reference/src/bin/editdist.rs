const HELP: &str = "Print the edit distance between two strings.

Usage: editdist [OPTIONS] <A> <B>

Options:
  -a, --algorithm <NAME>   levenshtein, damerau (Damerau-Levenshtein) or osa (optimal string alignment)
                           [default: levenshtein]
  -h, --help               Print help";

fn distance(algorithm: &str, a: &str, b: &str) -> Option<usize> {
    match algorithm {
        "levenshtein" => Some(strsim::levenshtein(a, b)),
        "damerau" => Some(strsim::damerau_levenshtein(a, b)),
        "osa" => Some(strsim::osa_distance(a, b)),
        _ => None,
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut algorithm = "levenshtein".to_owned();
    if let Some(i) = args.iter().position(|a| a == "--algorithm" || a == "-a") {
        if i + 1 < args.len() {
            algorithm = args.remove(i + 1);
        }
        args.remove(i);
    } else if let Some(i) = args.iter().position(|a| a.starts_with("--algorithm=")) {
        algorithm = args.remove(i)["--algorithm=".len()..].to_owned();
    }
    if args.len() != 2 {
        eprintln!("editdist: give two strings");
        std::process::exit(2);
    }
    match distance(&algorithm, &args[0], &args[1]) {
        Some(d) => println!("{}", d),
        None => {
            eprintln!("editdist: unknown algorithm {:?}", algorithm);
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kitten_sitting() {
        assert_eq!(super::distance("levenshtein", "kitten", "sitting"), Some(3));
    }
}
