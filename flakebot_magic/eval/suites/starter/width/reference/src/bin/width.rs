extern crate unicode_width; // the crate is edition 2015

use std::io::Read;
use unicode_width::UnicodeWidthStr;

const HELP: &str = "Print the display width (terminal columns) of each line of standard input.

Usage: width [OPTIONS]

East Asian wide and fullwidth characters take two columns, combining marks none.

Options:
  -h, --help   Print help";

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", HELP);
        return;
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read standard input as UTF-8");
    for line in input.lines() {
        println!("{}", UnicodeWidthStr::width(line));
    }
}
