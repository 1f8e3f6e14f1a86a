use std::io::Read;
use textwrap::{Options, WrapAlgorithm};

const HELP: &str = "Wrap the text on standard input to a width, paragraph by paragraph.

Usage: wrap [OPTIONS]

Words are filled greedily (first fit); paragraphs are separated by blank lines, which are kept.

Options:
  -w, --width <N>   The largest number of columns on a line [default: 80]
  -h, --help        Print help";

fn fill(text: &str, width: usize) -> String {
    text.split("\n\n")
        .map(|paragraph| {
            let words = paragraph.split_whitespace().collect::<Vec<_>>().join(" ");
            textwrap::fill(&words, Options::new(width).wrap_algorithm(WrapAlgorithm::FirstFit))
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut width = 80;
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--width" || args[i] == "-w" {
            width = args.get(i + 1).and_then(|w| w.parse().ok()).unwrap_or_else(|| {
                eprintln!("wrap: --width needs a number");
                std::process::exit(2);
            });
            i += 1;
        } else if let Some(w) = args[i].strip_prefix("--width=") {
            width = w.parse().expect("--width needs a number");
        }
        i += 1;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input");
    println!("{}", fill(input.trim_end(), width));
}

#[cfg(test)]
mod tests {
    #[test]
    fn fills_first_fit() {
        assert_eq!(super::fill("aaa bb cc ddddd", 6), "aaa bb\ncc\nddddd");
    }
}
